"""``woa verify``: the default run, a checkpoint run, a contract break, and user errors."""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors.torch import load_file

import woa_jax
from torch_bridge import cli
from torch_bridge.checkpoint import save_wo_a_layer
from woa_jax.testing import TOLERANCES


def test_default_run_passes_and_reports_every_row(woa, capsys):
    t0 = time.perf_counter()
    proc = woa("verify")
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    with capsys.disabled():  # the budget is 30 s on 2 cores; report, do not assert
        print(f"\n[woa verify took {elapsed:.1f} s]")
    assert "PASS" in out and "BREAK" not in out
    lines = out.splitlines()
    oracle = next(line for line in lines if line.split()[:2] == ["oracle", "jax"])
    assert "byte reference" in oracle
    torch_rows = [line for line in lines if line.split()[:1] == ["torch"]]
    assert {r.split()[1] for r in torch_rows} == {"torch", "jax"}  # both frameworks
    for r in torch_rows:
        assert r.count("100 %") == 2, r  # scale bytes and fp8 bytes
    assert sum(1 for line in lines if line.split()[:1] == ["bf16"]) == 2
    # Backends that cannot run here are listed with the reason, not dropped.
    assert any(line.split()[:1] == ["aiter"] and "not run:" in line for line in lines)


def test_checkpoint_run_with_float_scales_and_vllm_names(woa, tmp_path):
    """A V4-Flash layer stored with vLLM names and fp32 power-of-two scales, read from disk."""
    cli._embedded_checkpoint(tmp_path / "src", woa_jax.get_config("v4-flash"), 0, seed=3)
    src = load_file(str(tmp_path / "src" / "model.safetensors"))
    scale = torch.exp2(src["layers.0.attn.wo_a.scale"].view(torch.uint8).to(torch.float32) - 127)
    save_wo_a_layer(tmp_path / "ckpt", 5, src["layers.0.attn.wo_a.weight"], scale,
                    naming="vllm")
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"compress_ratios": [0] * 43}))
    out = tmp_path / "report.json"
    proc = woa("verify", "--checkpoint", tmp_path / "ckpt", "--layer", 5, "--tokens", 5,
               "--tp", 4, "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["ok"] and report["layer_kind"] == "window"  # from config.json
    assert report["shapes"]["groups"] == 2 and report["shapes"]["tokens"] == 5
    assert report["fp8_eligible"]["scale_format"] == "float32 powers of two"
    fp8 = [r for r in report["rows"] if r["chain"] == "fp8" and r["status"] == "ok"]
    assert {(r["backend"], r["framework"]) for r in fp8} >= {("torch", "torch"), ("torch", "jax")}
    for r in fp8:
        assert r["scale_bytes_equal"] == 1.0 and r["fp8_bytes_equal"] == 1.0
        assert r["rel_err_vs_oracle"] <= TOLERANCES["gemm_bf16"].rel
        assert 1e-2 < r["fp8_vs_bf16"] < 6e-2


def test_a_backend_with_wrong_bytes_fails_with_exit_1(monkeypatch, capsys):
    from torch_bridge.backends import torch_ref

    real = torch_ref.TorchBackend.inverse_rope_group_quant

    def off_by_one(self, *args, **kwargs):
        q, byte = real(self, *args, **kwargs)
        byte.view(torch.uint8)[0, 0, 0] += 1  # one scale byte one step high
        return q, byte

    monkeypatch.setattr(torch_ref.TorchBackend, "inverse_rope_group_quant", off_by_one)
    code = cli.main(["verify", "--tokens", "3", "--backends", "torch"])
    out = capsys.readouterr().out
    assert code == 1
    assert "BREAK: scale bytes differ" in out and "FAIL" in out


@pytest.mark.parametrize("args, fragments", [
    (["--config", "v5-flash"], ["--config", "invalid choice"]),
    (["--checkpoint", "/nonexistent/ckpt"], ["/nonexistent/ckpt", "does not exist"]),
])
def test_user_errors_are_one_line(woa, one_line_error, args, fragments):
    one_line_error(woa("verify", *args), *fragments)


@pytest.mark.parametrize("args, fragments", [
    (["--tp", "3"], ["not divisible by tp=3"]),
    (["--tokens", "0"], ["--tokens must be at least 1"]),
    (["--backends", "torch,cuda"], ["--backends"]),
    (["--json", "/nonexistent/dir/out.json"], ["/nonexistent/dir", "does not exist"]),
])
def test_more_user_errors_in_process(main_error, args, fragments):
    main_error(["verify", *args], *fragments)


def test_missing_layer_is_one_line(woa, one_line_error, tmp_path):
    save_wo_a_layer(tmp_path, 0, torch.zeros(1024, 512, dtype=torch.float8_e4m3fn),
                    torch.full((8, 4), 127, dtype=torch.uint8))
    one_line_error(woa("verify", "--checkpoint", tmp_path, "--layer", 7, "--layer-kind",
                       "compress"), "no wo_a weight for layer 7")


def test_triton_rows_under_the_interpreter(tmp_path):
    """In-process (the suite's conftest set TRITON_INTERPRET=1 before any kernel was defined)."""
    out = tmp_path / "v.json"
    assert cli.main(["verify", "--tokens", "2", "--backends", "triton", "--json", out]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["backend"] == "triton"]
    assert [(r["framework"], r["status"]) for r in rows] == [("torch", "ok"), ("jax", "ok")]
    assert all(r["scale_bytes_equal"] == r["fp8_bytes_equal"] == 1.0 for r in rows)
