"""``woa probe`` and ``woa inspect``: tables, JSON, and user errors."""

from __future__ import annotations

import json

import pytest
import torch

from torch_bridge.checkpoint import save_checkpoint


def test_probe_table_lists_every_backend_per_op(woa):
    proc = woa("probe")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    for op in ("inverse_rope_group_quant", "batched_gemm_a8w8_mxscale", "wo_a"):
        assert {r[1] for r in rows if r[:1] == [op]} == {"aiter", "triton", "torch", "bf16"}
    # Without a GPU or interpreter, Triton says why; the pure-torch reference always runs.
    triton = next(r for r in rows if r[:2] == ["inverse_rope_group_quant", "triton"])
    assert triton[2] == "no" and "TRITON_INTERPRET" in " ".join(triton)
    assert next(r for r in rows if r[:2] == ["batched_gemm_a8w8_mxscale", "torch"])[2] == "yes"
    assert "torch 2." in proc.stdout and "jax 0." in proc.stdout  # versions


def test_probe_json_to_stdout(woa):
    proc = woa("probe", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["device"]["device"] == "cpu" and report["versions"]["torch"]
    assert set(report["ops"]) == {"inverse_rope_group_quant", "batched_gemm_a8w8_mxscale",
                                  "wo_a"}
    assert report["ops"]["inverse_rope_group_quant"]["torch"]["ok"] is True
    aiter = report["ops"]["wo_a"]["aiter"]
    assert aiter["ok"] is False and "AITER" in aiter["reason"]
    assert report["env"]["TRITON_INTERPRET"] == "(unset)"


@pytest.fixture
def checkpoint(tmp_path):
    """A 3-shard checkpoint with an index and config.json (G = 2, N = 128, K = 256).

    Layers: 0 FP8 + E8M0; 1 BF16 without scale; 2 FP8 + fp32 powers of two; 3 FP8 + fp32 scale
    that is not a power of two; 4 FP8 without scale; 10 FP8 in 32x32 blocks (uint8 bytes); MTP 0.
    """
    def w():
        return torch.randn(256, 256).to(torch.float8_e4m3fn)

    def e8m0(shape):
        return torch.full(shape, 120, dtype=torch.uint8)

    tensors = {
        "layers.0.attn.wo_a.weight": w(),
        "layers.0.attn.wo_a.scale": e8m0((2, 2)).view(torch.float8_e8m0fnu),
        "layers.1.attn.wo_a.weight": torch.randn(256, 256).to(torch.bfloat16),
        "layers.2.attn.wo_a.weight": w(),
        "layers.2.attn.wo_a.scale": torch.tensor([[0.5, 1.0], [2.0, 4.0]]),
        "layers.3.attn.wo_a.weight": w(),
        "layers.3.attn.wo_a.scale": torch.tensor([[0.5, 0.75], [2.0, 4.0]]),
        "layers.4.attn.wo_a.weight": w(),
        "layers.10.attn.wo_a.weight": w(),
        "layers.10.attn.wo_a.scale": e8m0((8, 8)),
        "mtp.0.attn.wo_a.weight": w(),
        "mtp.0.attn.wo_a.scale": e8m0((2, 2)),
        "layers.0.attn.wo_b.weight": torch.zeros(4, 4),
    }
    save_checkpoint(tmp_path, tensors, shards=3)
    (tmp_path / "config.json").write_text(json.dumps({"o_groups": 2, "num_attention_heads": 16}))
    return tmp_path


def test_inspect_reports_eligibility_and_reasons(woa, checkpoint):
    proc = woa("inspect", checkpoint, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    layers = {e["name"]: e for e in report["layers"]}
    assert list(layers) == ["layers.0.attn.wo_a", "layers.1.attn.wo_a", "layers.2.attn.wo_a",
                            "layers.3.attn.wo_a", "layers.4.attn.wo_a", "layers.10.attn.wo_a",
                            "mtp.0.attn.wo_a"]
    eligible = {name: e["eligible"] for name, e in layers.items()}
    assert eligible == {"layers.0.attn.wo_a": True, "layers.1.attn.wo_a": False,
                        "layers.2.attn.wo_a": True, "layers.3.attn.wo_a": False,
                        "layers.4.attn.wo_a": False, "layers.10.attn.wo_a": True,
                        "mtp.0.attn.wo_a": True}
    assert layers["layers.0.attn.wo_a"]["block"] == 128
    assert layers["layers.0.attn.wo_a"]["scale_format"] == "E8M0"
    assert layers["layers.1.attn.wo_a"]["reason"].startswith("bfloat16 weight without a scale")
    assert layers["layers.2.attn.wo_a"]["scale_format"] == "float32 powers of two"
    assert "not a power of two" in layers["layers.3.attn.wo_a"]["reason"]
    assert "has no block scale" in layers["layers.4.attn.wo_a"]["reason"]
    assert layers["layers.10.attn.wo_a"]["block"] == 32


def test_inspect_table_and_tp_split(woa, checkpoint):
    proc = woa("inspect", checkpoint, "--tp", "2")
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if "layers.1.attn.wo_a" in line)
    assert " no " in row and "without a scale" in row
    row0 = next(line for line in proc.stdout.splitlines() if "layers.0.attn.wo_a " in line)
    assert " yes " in row0 and "tp=2: 1 group(s) per rank" in row0
    assert "4 of 7 layers can take the FP8 path" in proc.stdout
    bad_tp = json.loads(woa("inspect", checkpoint, "--tp", "4", "--json").stdout)
    first = bad_tp["layers"][0]
    assert not first["eligible"] and "tp=4 does not divide o_groups=2" in first["reason"]


def test_inspect_user_errors(woa, one_line_error, tmp_path):
    one_line_error(woa("inspect", tmp_path / "missing"), "does not exist")
    one_line_error(woa("inspect", tmp_path), "no *.safetensors files")
    save_checkpoint(tmp_path, {"layers.0.attn.wq.weight": torch.zeros(2, 2)})
    one_line_error(woa("inspect", tmp_path), "no '*.wo_a.weight' tensor")
    one_line_error(woa("inspect", tmp_path, "--tp", "0"), "--tp must be a positive integer")
