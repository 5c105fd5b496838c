"""``woa verify``: the default run, checkpoint runs, each exit code, and user errors."""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
from safetensors.torch import load_file

import woa_jax
from torch_bridge import WoAProjection, cli
from torch_bridge.checkpoint import save_wo_a_layer
from torch_bridge.cli.verify import embedded_checkpoint
from woa_jax.testing import TOLERANCES


@pytest.fixture(scope="module")
def flash_layer(tmp_path_factory):
    """A full-size V4-Flash ``wo_a`` layer: (weight fp8 [8192, 4096], scale E8M0 [64, 32])."""
    d = tmp_path_factory.mktemp("flash")
    embedded_checkpoint(d, woa_jax.get_config("v4-flash"), 0, seed=3)
    t = load_file(str(d / "model.safetensors"))
    return t["layers.0.attn.wo_a.weight"], t["layers.0.attn.wo_a.scale"]


def test_default_run_passes_keeps_its_checkpoint_and_reads_well(woa, reads_well, tmp_path):
    proc = woa("verify", "--keep", "kept", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    reads_well(out)
    assert out.rstrip().splitlines()[-1].startswith("PASS")
    rows = {tuple(line.split()[:2]): line.split() for line in out.splitlines()}
    assert rows[("oracle", "jax")][-1] == "reference"
    for framework in ("torch", "jax"):  # the pure-torch backend from both frameworks
        row = rows[("torch", framework)]
        assert row[-1] == "ok" and row.count("100") == 2, row
        assert rows[("bf16", framework)][-1] == "ok"
    # Backends that cannot run here are listed, and the reason follows the table.
    assert rows[("aiter", "-")][-2:] == ["not", "run"]
    assert "aiter: not run: AITER" in out
    # The kept checkpoint: said where, and usable as said.
    assert "checkpoint kept in kept: woa inspect kept" in " ".join(out.split())
    assert "WoAProjection.from_checkpoint('kept', layer=0)" in " ".join(out.split())
    umask = os.umask(0)
    os.umask(umask)
    for f in (tmp_path / "kept").iterdir():  # the shard like the config: 0o666 less the umask
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask, f
    proj = WoAProjection.from_checkpoint(tmp_path / "kept", layer=0, max_positions=16)
    assert (proj.num_groups, proj.n, proj.k) == (8, 1024, 4096)
    inspected = woa("inspect", "kept", cwd=tmp_path)
    assert inspected.returncode == 0 and "1 of 1 layers can take the FP8 path" in inspected.stdout


def test_checkpoint_run_with_float_scales_and_vllm_names(woa, tmp_path, flash_layer):
    """A V4-Flash layer stored with vLLM names and fp32 power-of-two scales, read from disk."""
    w, sc = flash_layer
    scale = torch.exp2(sc.view(torch.uint8).to(torch.float32) - 127)
    save_wo_a_layer(tmp_path / "ckpt", 5, w, scale, naming="vllm")
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"compress_ratios": [0] * 43}))
    out = tmp_path / "report.json"
    proc = woa("verify", "--checkpoint", tmp_path / "ckpt", "--layer", 5, "--tokens", 5,
               "--tp", 4, "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["ok"] and report["exit"] == 0 and report["layer_kind"] == "window"
    assert report["shapes"]["groups"] == 2 and report["shapes"]["tokens"] == 5
    assert report["fp8_eligible"]["scale_format"] == "float32 powers of two"
    fp8 = [r for r in report["rows"] if r["chain"] == "fp8" and r["status"] == "ok"]
    assert {(r["backend"], r["framework"]) for r in fp8} >= {("torch", "torch"), ("torch", "jax")}
    for r in fp8:
        assert r["scale_bytes_equal"] == 1.0 and r["fp8_bytes_equal"] == 1.0
        assert r["rel_err_vs_oracle"] <= TOLERANCES["gemm_bf16"].rel
        assert 1e-2 < r["fp8_vs_bf16"] < 6e-2


def test_no_fp8_backend_ran_is_not_a_pass(woa, reads_well, tmp_path, flash_layer):
    """Float scales that are not powers of two: no FP8 chain, so exit 3, never PASS."""
    w, sc = flash_layer
    scale = torch.exp2(sc.view(torch.uint8).to(torch.float32) - 127) * 0.75
    save_wo_a_layer(tmp_path, 0, w, scale)
    proc = woa("verify", "--checkpoint", tmp_path, "--layer-kind", "window", "--tokens", 2)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    reads_well(proc.stdout)
    verdict = " ".join(proc.stdout[proc.stdout.index("NOT VERIFIED"):].split())
    assert verdict.startswith("NOT VERIFIED: no FP8 backend ran, so no bytes were compared")
    assert "oracle: weight scale is not losslessly representable as E8M0" in verdict
    assert "PASS" not in proc.stdout


def test_only_bf16_requested_compares_no_fp8_bytes(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert cli.main(["verify", "--tokens", "2", "--backends", "bf16", "--json", out]) == 3
    report = json.loads(out.read_text())
    assert report["verdict"] == "not_verified" and not report["ok"]


def test_unquantized_layer_has_nothing_to_verify(woa, one_line_error, tmp_path):
    save_wo_a_layer(tmp_path, 0, torch.zeros(8192, 4096, dtype=torch.bfloat16), None)
    one_line_error(woa("verify", "--checkpoint", tmp_path, "--layer-kind", "window"),
                   "not verified", "without a scale", code=3)


@pytest.mark.parametrize("tensor, index", [("weight", (7, 11)), ("scale", (0, 3))])
def test_nan_in_the_checkpoint_is_corrupt_data_not_a_backend_fault(woa, one_line_error, tmp_path,
                                                                   flash_layer, tensor, index):
    w, sc = (t.clone() for t in flash_layer)
    (w if tensor == "weight" else sc).view(torch.uint8)[index] = 0xFF  # NaN in e4m3fn and E8M0
    save_wo_a_layer(tmp_path, 0, w, sc)
    proc = woa("verify", "--checkpoint", tmp_path, "--layer-kind", "window")
    one_line_error(proc, "corrupt checkpoint", f"model.safetensors: layers.0.attn.wo_a.{tensor}: "
                   f"element [{index[0]}, {index[1]}] is", "NaN", code=4)
    assert "BREAK" not in proc.stdout and "backend" not in proc.stderr


@pytest.mark.parametrize("content", ["empty", "garbage", "truncated"])
def test_unreadable_checkpoint_file_is_one_line(woa, one_line_error, tmp_path, content):
    save_wo_a_layer(tmp_path, 0, torch.zeros(1024, 512, dtype=torch.float8_e4m3fn),
                    torch.full((8, 4), 127, dtype=torch.uint8))
    f = tmp_path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes({"empty": b"", "garbage": b"\x00garbage" * 64,
                   "truncated": data[: len(data) // 2]}[content])
    one_line_error(woa("verify", "--checkpoint", tmp_path, "--layer-kind", "window"),
                   f"{f}: not a readable safetensors file")


def test_index_that_is_not_json_is_one_line(woa, one_line_error, tmp_path):
    save_wo_a_layer(tmp_path, 0, torch.zeros(1024, 512, dtype=torch.float8_e4m3fn),
                    torch.full((8, 4), 127, dtype=torch.uint8), shards=2)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {')
    one_line_error(woa("verify", "--checkpoint", tmp_path),
                   "model.safetensors.index.json: not valid JSON")


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
    assert "torch from torch: BREAK: scale bytes differ" in out and "FAIL" in out


@pytest.mark.parametrize("args, fragments", [
    (["--config", "v5-flash"], ["--config", "invalid choice"]),
    (["--checkpoint", "/nonexistent/ckpt"], ["/nonexistent/ckpt", "does not exist"]),
    (["--layer", "99999"], ["--layer 99999 is out of range", "v4-flash has layers 0 to 42"]),
])
def test_user_errors_are_one_line(woa, one_line_error, args, fragments):
    one_line_error(woa("verify", *args), *fragments)


@pytest.mark.parametrize("args, fragments", [
    (["--tp", "3"], ["not divisible by tp=3"]),
    (["--tokens", "0"], ["--tokens must be at least 1"]),
    (["--layer", "-1"], ["--layer -1 is out of range"]),
    (["--backends", "torch,cuda"], ["--backends"]),
    (["--json", "/nonexistent/dir/out.json"], ["/nonexistent/dir", "does not exist"]),
    (["--checkpoint", "/tmp", "--keep", "/tmp/k"], ["--keep", "does not apply with --checkpoint"]),
])
def test_more_user_errors_in_process(main_error, args, fragments):
    main_error(["verify", *args], *fragments)


def test_keep_refuses_a_directory_with_files(main_error, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    main_error(["verify", "--keep", tmp_path], f"--keep {tmp_path}: exists and is not an empty")


def test_missing_layer_is_said_before_the_missing_layer_kind(woa, one_line_error, tmp_path):
    save_wo_a_layer(tmp_path, 0, torch.zeros(1024, 512, dtype=torch.float8_e4m3fn),
                    torch.full((8, 4), 127, dtype=torch.uint8))
    one_line_error(woa("verify", "--checkpoint", tmp_path, "--layer", 7),
                   "no wo_a weight for layer 7")


def test_missing_layer_kind_says_what_to_pass(main_error, tmp_path, flash_layer):
    save_wo_a_layer(tmp_path, 0, *flash_layer)
    main_error(["verify", "--checkpoint", tmp_path], "pass --layer-kind compress or --layer-kind "
                                                     "window")


def test_triton_rows_under_the_interpreter(tmp_path):
    """In-process (the suite's conftest set TRITON_INTERPRET=1 before any kernel was defined)."""
    out = tmp_path / "v.json"
    assert cli.main(["verify", "--tokens", "2", "--backends", "triton", "--json", out]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["backend"] == "triton"]
    assert [(r["framework"], r["status"]) for r in rows] == [("torch", "ok"), ("jax", "ok")]
    assert all(r["scale_bytes_equal"] == r["fp8_bytes_equal"] == 1.0 for r in rows)


def test_help_documents_the_exit_codes(woa):
    for args in (["--help"], ["verify", "--help"]):
        text = " ".join(woa(*args).stdout.split())
        assert "3 verify compared nothing (no FP8 backend ran)" in text, text
        assert "4 corrupt checkpoint (NaN/Inf in weight or scales)" in text


def test_a_config_that_does_not_match_the_checkpoint_is_refused(woa, one_line_error, tmp_path,
                                                                flash_layer):
    """V4-Pro's 16 groups on a V4-Flash layer would read as G = 2, N = 512 and pass."""
    save_wo_a_layer(tmp_path, 0, *flash_layer)
    one_line_error(woa("verify", "--checkpoint", tmp_path, "--config", "v4-pro",
                       "--layer-kind", "window"),
                   "is [8192, 4096] in 128x128 scale blocks (that is v4-flash's shape), but "
                   "config v4-pro with num_groups=16 expects [16384, 4096]")
