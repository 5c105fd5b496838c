"""Real safetensors checkpoints written to a temp dir and read back (names, dtypes, shards, TP)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from inputs import np_to_torch, rope_case, wo_a_checkpoint

import torch_bridge as tb
import woa_jax
from torch_bridge import WoAProjection, checkpoint
from woa_jax.testing import assert_bitwise_equal, assert_close

G, N, K = 4, 256, 256  # scaled down: 4 groups of 256 outputs, K = 2 heads x 128
#: V4-Flash's rope, scaled down to these shapes (a config must describe the stored weight).
TINY = dataclasses.replace(woa_jax.DSV4_CONFIGS["v4-flash"], name="v4-flash-tiny", num_heads=8,
                           o_groups=G, head_dim=128, o_lora_rank=N)


@pytest.fixture
def layer():
    w, sc = wo_a_checkpoint(np.random.default_rng(0), g=G, n=N, k=K)
    return np_to_torch(w), np_to_torch(sc)


@pytest.fixture
def rope():
    c = rope_case(np.random.default_rng(1), s=6, h=8, dh=128, rd=64, num_groups=G)
    return c


def _load(path, layer_idx=3, **kw):
    kw.setdefault("num_groups", G)
    kw.setdefault("layer_kind", "window")
    kw.setdefault("max_positions", 64)
    kw.setdefault("config", TINY)
    return WoAProjection.from_checkpoint(path, layer_idx, **kw)


@pytest.mark.parametrize("naming", ["deepseek", "vllm"])
def test_round_trip_e8m0_scales(tmp_path, layer, naming):
    w, sc = layer
    checkpoint.save_wo_a_layer(tmp_path, 3, w, sc, naming=naming)
    proj = _load(tmp_path)
    assert_bitwise_equal(proj.weight, w)
    assert_bitwise_equal(proj.weight_scale_e8m0.reshape(sc.shape), sc)
    assert proj.num_groups == G and proj.block == 128


def test_vllm_weight_scale_name_and_fp32_scales(tmp_path, layer):
    w, sc = layer
    f32 = torch.exp2(sc.view(torch.uint8).float() - 127)
    checkpoint.save_wo_a_layer(tmp_path, 0, w, f32, naming="vllm",
                               scale_name="model.layers.0.self_attn.wo_a.weight_scale")
    t = tb.read_wo_a(tmp_path, 0, num_groups=G)
    assert t.scale_name.endswith("wo_a.weight_scale") and t.scale.dtype == torch.float32
    proj = _load(tmp_path, 0)
    assert_bitwise_equal(proj.weight_scale_e8m0.reshape(sc.shape), sc.view(torch.uint8))


def test_index_json_over_several_shards(tmp_path, layer):
    w, sc = layer
    other_w, other_sc = (t.clone() for t in layer)
    extra = {"layers.2.attn.wo_a.weight": other_w, "layers.2.attn.wo_a.scale": other_sc,
             "layers.3.attn.wq_a.weight": torch.zeros(4, 4)}
    files = checkpoint.save_wo_a_layer(tmp_path, 3, w, sc, shards=3, extra=extra)
    assert len(files) == 3
    index = json.loads((tmp_path / checkpoint.INDEX_FILE).read_text())
    wname, sname = checkpoint.wo_a_names(3)
    assert index["weight_map"][wname] != index["weight_map"][sname]
    proj = _load(tmp_path)
    assert_bitwise_equal(proj.weight, w)


def test_directory_without_index_and_single_file(tmp_path, layer):
    w, sc = layer
    (f,) = checkpoint.save_wo_a_layer(tmp_path / "a", 3, w, sc)
    assert_bitwise_equal(_load(f).weight, w)  # a file path works too
    (tmp_path / "a" / f.name).rename(tmp_path / "a" / "shard-7.safetensors")
    assert_bitwise_equal(_load(tmp_path / "a").weight, w)


def test_tensor_parallel_slices_keep_whole_groups(tmp_path, layer, rope):
    w, sc = layer
    checkpoint.save_wo_a_layer(tmp_path, 3, w, sc)
    cos, sin = rope.torch()[2:]
    full = _load(tmp_path, cos_cache=cos, sin_cache=sin, backend="torch")
    o, pos = rope.torch()[:2]
    y = full(o, pos)
    for rank in range(2):
        part = _load(tmp_path, tp_rank=rank, tp_size=2, cos_cache=cos, sin_cache=sin,
                     backend="torch")
        assert part.num_groups == 2
        assert_bitwise_equal(part.weight, w[rank * 2 * N:(rank + 1) * 2 * N])
        o_rank = o.reshape(6, 2, 4, 128)[:, rank].contiguous()  # this rank's heads
        assert_close(part(o_rank, pos), y[:, rank * 2:(rank + 1) * 2], tolerance="gemm_fp32")


def test_tensor_parallel_errors(tmp_path, layer):
    checkpoint.save_wo_a_layer(tmp_path, 3, *layer)
    with pytest.raises(ValueError, match="o_groups=4 is not divisible by tp_size=3"):
        _load(tmp_path, tp_size=3)
    with pytest.raises(ValueError, match=r"tp_rank must be an integer in \[0, 2\)"):
        _load(tmp_path, tp_rank=2, tp_size=2)
    assert tb.read_wo_a(tmp_path, 3, num_groups=8, tp_size=8).scale.shape == (1, 2)
    # 16 groups of 64 rows: one group per rank is half a 128-row scale block.
    with pytest.raises(ValueError, match="not whole 128-row scale blocks"):
        tb.read_wo_a(tmp_path, 3, num_groups=16, tp_size=16)


def test_tp1_keeps_a_ragged_last_scale_block(tmp_path, rope):
    """2 groups of N=96: 192 rows in two 128-row scale blocks, the last one ragged. TP1 reads it
    (as ``woa_jax.check_wo_a_weight`` accepts); TP2 ranks would split a block."""
    w_np, sc_np = wo_a_checkpoint(np.random.default_rng(2), g=2, n=96, k=K)
    w, sc = np_to_torch(w_np), np_to_torch(sc_np)
    assert sc.shape == (2, 2)
    checkpoint.save_wo_a_layer(tmp_path, 3, w, sc)
    t = tb.read_wo_a(tmp_path, 3, num_groups=2)
    assert_bitwise_equal(t.scale, sc, name="ragged scale")
    cos, sin = rope.torch()[2:]
    proj = WoAProjection.from_tensors(t.weight, t.scale, 2, cos, sin)
    ref = woa_jax.dequant_wo_a_weight(jnp.asarray(w_np), jnp.asarray(sc_np), 2)
    assert_bitwise_equal(proj.weight_bf16, ref, name="dequantized weight")
    with pytest.raises(ValueError, match="tp_size=2 rank holds 96 weight rows, not whole 128-row"):
        tb.read_wo_a(tmp_path, 3, num_groups=2, tp_size=2)


def test_missing_layer_and_missing_rope_kind(tmp_path, layer):
    checkpoint.save_wo_a_layer(tmp_path, 3, *layer)
    with pytest.raises(tb.CheckpointError, match="no wo_a weight for layer 5 in the checkpoint; "
                                                  "layers with one: 3"):
        _load(tmp_path, 5)
    with pytest.raises(ValueError, match="cannot tell its RoPE table"):
        _load(tmp_path, layer_kind=None)
    with pytest.raises(tb.CheckpointError, match="checkpoint .*nope does not exist"):
        _load(tmp_path / "nope")


def test_layer_kind_from_config_json(tmp_path, layer):
    checkpoint.save_wo_a_layer(tmp_path, 3, *layer)
    (tmp_path / "config.json").write_text(json.dumps({"compress_ratios": [0, 4, 128, 4]}))
    proj = _load(tmp_path, layer_kind=None)
    cos, sin = woa_jax.rope_cos_sin("v4-flash", "compress", 64)
    assert_bitwise_equal(proj.cos_cache, cos)
    assert_bitwise_equal(proj.sin_cache, sin)
    assert checkpoint.layer_kind_from_config(tmp_path, 0) == "window"


def test_config_is_inferred_only_for_released_shapes(tmp_path, layer):
    checkpoint.save_wo_a_layer(tmp_path, 3, *layer)
    with pytest.raises(ValueError, match="no released DeepSeek V4 config has a"):
        _load(tmp_path, config=None)


def test_bf16_checkpoint_without_scale(tmp_path, layer, rope, triton_off):
    w, sc = layer
    wb = torch.from_numpy(np.array(woa_jax.dequant_wo_a_weight(
        w.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn),
        sc.view(torch.uint8).numpy(), G, dtype=jnp.float32))).reshape(G * N, K)
    checkpoint.save_wo_a_layer(tmp_path, 3, wb.to(torch.bfloat16), None)
    proj = _load(tmp_path, cos_cache=rope.torch()[2], sin_cache=rope.torch()[3])
    proj(*rope.torch()[:2])
    assert proj.path == "bf16" and proj.fallback_reason == "bfloat16 checkpoint has no scale"


def test_full_size_v4_flash_layer(tmp_path):
    """One real-size V4-Flash layer: [8192, 4096] F8_E4M3 weight, [64, 32] F8_E8M0 scale."""
    rng = np.random.default_rng(2)
    raw = rng.integers(0, 256, size=(8192, 4096), dtype=np.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0x38  # no NaN encodings
    w = torch.from_numpy(raw).view(torch.float8_e4m3fn)
    sc = torch.from_numpy(rng.integers(112, 120, size=(64, 32), dtype=np.uint8)).view(
        torch.float8_e8m0fnu)
    checkpoint.save_wo_a_layer(tmp_path, 7, w, sc, naming="deepseek", shards=2)
    proj = WoAProjection.from_checkpoint(tmp_path, 7, layer_kind="compress", max_positions=4096,
                                         backend="torch")
    assert (proj.num_groups, proj.n, proj.k, proj.block) == (8, 1024, 4096, 128)
    assert proj.weight_fp8.data_ptr() == proj.weight.data_ptr()
    c = rope_case(rng, s=2, h=64, dh=512, rd=64, num_groups=8, p=4096)
    cos, sin = proj.cos_cache, proj.sin_cache
    o, pos = c.torch()[:2]
    y = proj(o, pos)
    assert tuple(y.shape) == (2, 8, 1024)
    ref = woa_jax.wo_a_fp8(jnp.asarray(c.o), jnp.asarray(c.positions), tb.to_jax(cos),
                           tb.to_jax(sin), tb.to_jax(w), tb.to_jax(sc), 8)
    assert_close(y, ref, tolerance="gemm_bf16")
    rank = WoAProjection.from_checkpoint(tmp_path, 7, tp_rank=1, tp_size=2, layer_kind="compress",
                                         max_positions=16)
    assert rank.num_groups == 4
    assert_bitwise_equal(rank.weight_scale_e8m0.reshape(32, 32), sc[32:])


@pytest.mark.parametrize("content", [b"", b"garbage" * 50, "truncated"])
def test_unreadable_safetensors_raise_checkpoint_error_naming_the_file(tmp_path, layer, content):
    (f,) = checkpoint.save_wo_a_layer(tmp_path, 3, *layer)
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if content == "truncated" else content)
    with pytest.raises(checkpoint.CheckpointError, match=r"model\.safetensors: not a readable "
                                                         "safetensors file"):
        tb.read_wo_a(tmp_path, 3, num_groups=G)
    with pytest.raises(checkpoint.CheckpointError, match=re.escape(str(f))):
        _load(f)


def test_index_that_is_not_json_or_names_a_missing_shard(tmp_path, layer):
    checkpoint.save_wo_a_layer(tmp_path, 3, *layer, shards=2)
    index = tmp_path / checkpoint.INDEX_FILE
    good = index.read_text()
    index.write_text("{weight_map: ")
    with pytest.raises(checkpoint.CheckpointError, match=f"{index}: not valid JSON"):
        _load(tmp_path)
    index.write_text(json.dumps({"weight_map": ["a"]}))
    with pytest.raises(checkpoint.CheckpointError, match="no 'weight_map' object"):
        _load(tmp_path)
    index.write_text(good.replace("model-00002-of-00002", "model-00009-of-00002"))
    with pytest.raises(checkpoint.CheckpointError, match="model-00009-of-00002.safetensors: "
                                                         "shard file does not exist"):
        _load(tmp_path)


def test_config_json_that_is_not_json(tmp_path, layer):
    checkpoint.save_wo_a_layer(tmp_path, 3, *layer)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(checkpoint.CheckpointError, match="config.json: not valid JSON"):
        _load(tmp_path, layer_kind=None)


@pytest.mark.parametrize("tensor, value, problem", [
    ("weight", 0x7F, "element [5, 9] is NaN (fp8 byte 0x7f)"),
    ("scale", 0xFF, "element [1, 0] is the E8M0 NaN byte 255"),
])
def test_nan_in_weight_or_scale_is_a_corrupt_checkpoint(tmp_path, layer, tensor, value, problem):
    w, sc = (t.clone() for t in layer)
    t = w if tensor == "weight" else sc
    t.view(torch.uint8)[(5, 9) if tensor == "weight" else (1, 0)] = value
    checkpoint.save_wo_a_layer(tmp_path, 3, w, sc)
    with pytest.raises(checkpoint.NonFiniteTensorError,
                       match=rf"model\.safetensors: layers\.3\.attn\.wo_a\.{tensor}: "
                             rf"{re.escape(problem)}.*checkpoint is corrupt"):
        _load(tmp_path)


@pytest.mark.parametrize("bad", [0.0, -2.0, float("nan")])
def test_float_scales_must_be_positive_and_finite(tmp_path, layer, bad):
    w, sc = layer
    f32 = torch.exp2(sc.view(torch.uint8).float() - 127)
    f32[0, 1] = bad
    checkpoint.save_wo_a_layer(tmp_path, 3, w, f32)
    with pytest.raises(checkpoint.NonFiniteTensorError,
                       match=rf"wo_a\.scale: element \[0, 1\] = {re.escape(repr(bad))}; "
                             "expected finite scales > 0"):
        tb.read_wo_a(tmp_path, 3, num_groups=G)


def test_unquantized_weight_must_be_finite(tmp_path):
    w = torch.zeros(G * N, K, dtype=torch.bfloat16)
    w[2, 3] = float("inf")
    checkpoint.save_wo_a_layer(tmp_path, 3, w, None)
    with pytest.raises(checkpoint.NonFiniteTensorError,
                       match=r"wo_a\.weight: element \[2, 3\] = inf; expected finite values"):
        tb.read_wo_a(tmp_path, 3, num_groups=G)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_written_files_follow_the_umask_like_the_index(tmp_path, layer, umask, mode):
    old = os.umask(umask)
    try:
        files = checkpoint.save_wo_a_layer(tmp_path, 3, *layer, shards=2)
    finally:
        os.umask(old)
    for f in (*files, tmp_path / checkpoint.INDEX_FILE):
        assert stat.S_IMODE(f.stat().st_mode) == mode, f
