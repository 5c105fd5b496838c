"""``woa inspect``: eligibility per layer, NaN/Inf, TP splits, hints, and user errors."""

from __future__ import annotations

import json

import pytest
import torch

from torch_bridge.checkpoint import save_checkpoint


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
    (tmp_path / "config.json").write_text(json.dumps(
        {"o_groups": 2, "num_attention_heads": 16, "compress_ratios": [4] * 11}))
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
    assert layers["layers.0.attn.wo_a"]["layer_kind"] == "compress"
    assert layers["mtp.0.attn.wo_a"]["layer_kind"] is None
    assert layers["layers.1.attn.wo_a"]["reason"].startswith("bfloat16 weight without a scale")
    assert layers["layers.2.attn.wo_a"]["scale_format"] == "float32 powers of two"
    assert "not a power of two" in layers["layers.3.attn.wo_a"]["reason"]
    assert "has no block scale" in layers["layers.4.attn.wo_a"]["reason"]
    assert layers["layers.10.attn.wo_a"]["block"] == 32
    assert report["corrupt"] == [] and all(e["corrupt"] is None for e in layers.values())


def test_inspect_table_and_tp_split(woa, reads_well, checkpoint):
    proc = woa("inspect", checkpoint, "--tp", "2")
    assert proc.returncode == 0, proc.stderr
    reads_well(proc.stdout)
    lines = proc.stdout.splitlines()
    row1 = next(i for i, line in enumerate(lines) if line.startswith("layers.1.attn.wo_a "))
    assert lines[row1].split()[1:4] == ["256x256", "bf16", "-"]
    assert lines[row1].split()[4] == "no"
    row0 = " ".join(" ".join(lines[i] for i in range(row1 - 3, row1)).split())
    assert "layers.0.attn.wo_a 256x256 e4m3fn 2x2 e8m0 yes tp=2: 1 group(s) per rank" in row0
    text = " ".join(proc.stdout.split())
    assert "4 of 7 layers can take the FP8 path" in text
    assert "No config.json compress_ratios gives the RoPE table of mtp.0.attn.wo_a: load" in text


def test_inspect_reports_nan_and_inf_as_corrupt(woa, reads_well, checkpoint):
    tensors = {"layers.0.attn.wo_a.weight": torch.randn(256, 256).to(torch.float8_e4m3fn),
               "layers.0.attn.wo_a.scale": torch.tensor([[1.0, float("inf")], [2.0, 4.0]]),
               "layers.1.attn.wo_a.weight": torch.randn(256, 256).to(torch.float8_e4m3fn),
               "layers.1.attn.wo_a.scale": torch.full((2, 2), 127, dtype=torch.uint8)}
    tensors["layers.1.attn.wo_a.weight"].view(torch.uint8)[3, 4] = 0x7F  # NaN
    save_checkpoint(checkpoint / "bad", tensors)
    proc = woa("inspect", checkpoint / "bad")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    reads_well(proc.stdout)
    text = " ".join(proc.stdout.split())
    assert "corrupt: scale: element [0, 1] = inf; expected finite scales > 0" in text
    assert "corrupt: weight: element [3, 4] is NaN (fp8 byte 0x7f)" in text
    assert ("CORRUPT: 2 layer(s) hold NaN/Inf in weight or scales: layers.0.attn.wo_a, "
            "layers.1.attn.wo_a") in text
    report = json.loads(woa("inspect", checkpoint / "bad", "--json").stdout)
    assert report["corrupt"] == ["layers.0.attn.wo_a", "layers.1.attn.wo_a"]
    assert not any(e["eligible"] for e in report["layers"])


def test_inspect_user_errors(woa, one_line_error, tmp_path):
    one_line_error(woa("inspect", tmp_path / "missing"), "does not exist")
    one_line_error(woa("inspect", tmp_path), "no *.safetensors files")
    save_checkpoint(tmp_path, {"layers.0.attn.wq.weight": torch.zeros(2, 2)})
    one_line_error(woa("inspect", tmp_path), "no '*.wo_a.weight' tensor")
    one_line_error(woa("inspect", tmp_path, "--tp", "0"), "--tp must be a positive integer")


def test_inspect_tp_that_does_not_divide_the_groups_exits_2(woa, one_line_error, checkpoint):
    one_line_error(woa("inspect", checkpoint, "--tp", "3"),
                   "--tp 3 does not divide o_groups=2 and num_heads=16 of layers.0.attn.wo_a")


@pytest.mark.parametrize("content", ["empty", "garbage", "truncated"])
def test_unreadable_shard_is_one_line_naming_it(woa, one_line_error, checkpoint, content):
    f = checkpoint / "model-00002-of-00003.safetensors"
    data = f.read_bytes()
    f.write_bytes({"empty": b"", "garbage": b"\xff" * 300, "truncated": data[:100]}[content])
    one_line_error(woa("inspect", checkpoint), f"{f}: not a readable safetensors file")


def test_unparsable_index_or_config_is_one_line_naming_it(woa, one_line_error, checkpoint):
    (checkpoint / "config.json").write_text("{'o_groups': 2}")
    one_line_error(woa("inspect", checkpoint), f"{checkpoint / 'config.json'}: not valid JSON")
    (checkpoint / "model.safetensors.index.json").write_text("")
    one_line_error(woa("inspect", checkpoint),
                   f"{checkpoint / 'model.safetensors.index.json'}: not valid JSON")
