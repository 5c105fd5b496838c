"""DeepSeek V4 configs, TP splits and RoPE tables (docs/NUMERICS.md 1, 2)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from woa_jax import (
    DSV4_CONFIGS,
    RopeKind,
    get_config,
    local_shapes,
    rope_cos_sin,
    rope_inv_freq,
)
from woa_jax.config import rope_table_rows

F32 = np.float32
P_FULL = 1_048_576


def _pos_freqs(base: float) -> np.ndarray:
    j = np.arange(32, dtype=F32)
    return np.power(F32(base), (F32(2) * j) / F32(64))


def _yarn_correction_dims() -> tuple[int, int]:
    """Upstream's ``find_correction_range`` for the compressed layers, written out here."""

    def corr(rot: float) -> float:
        return 64 * math.log(65536 / (rot * 2 * math.pi)) / (2 * math.log(160000))

    return math.floor(corr(32)), math.ceil(corr(1))


def test_compress_inv_freq_yarn_ramp_between_15_and_25():
    low, high = _yarn_correction_dims()
    assert (low, high) == (15, 25)
    inv = rope_inv_freq("v4-flash", "compress")
    assert inv.dtype == F32 and inv.shape == (32,)
    pf = _pos_freqs(160000.0)
    extrap = F32(1) / pf
    interp = F32(1) / (F32(16) * pf)
    np.testing.assert_array_equal(inv[:low + 1], extrap[:low + 1])  # j <= low: extrapolation
    np.testing.assert_array_equal(inv[high:], interp[high:])  # j >= high: pure interpolation
    mid = slice(low + 1, high)
    assert ((inv[mid] < extrap[mid]) & (inv[mid] > interp[mid])).all()
    # The ramp is linear in j between low and high: recover it and compare.
    ramp = (extrap[mid].astype(np.float64) - inv[mid]) / (extrap[mid] - interp[mid])
    np.testing.assert_allclose(ramp, (np.arange(low + 1, high) - low) / (high - low), rtol=1e-5)


def test_window_inv_freq_is_plain_rope():
    inv = rope_inv_freq("v4-pro", "window")
    np.testing.assert_array_equal(inv, F32(1) / _pos_freqs(10000.0))
    np.testing.assert_array_equal(rope_inv_freq(get_config("v4-pro"), RopeKind.WINDOW), inv)


@pytest.mark.parametrize("kind", ["window", "compress"])
def test_table_rows(kind):
    assert rope_table_rows("v4-flash", kind) == P_FULL


def test_full_compress_table(compress_table):
    cos, sin = compress_table
    assert cos.shape == sin.shape == (P_FULL, 32) and cos.dtype == sin.dtype == jnp.float32
    inv = rope_inv_freq("v4-flash", "compress")
    for p in (0, 1, 65535, 65536, P_FULL - 1):
        ang = (F32(p) * inv).astype(F32)
        np.testing.assert_array_equal(np.asarray(cos[p]), np.cos(ang))
        np.testing.assert_array_equal(np.asarray(sin[p]), np.sin(ang))
    assert (np.asarray(cos[0]) == 1).all() and (np.asarray(sin[0]) == 0).all()


def test_max_positions_is_a_prefix_and_dtype_option(compress_table):
    cos, sin = rope_cos_sin("v4-flash", "compress", max_positions=300)
    assert cos.shape == (300, 32)
    np.testing.assert_array_equal(np.asarray(cos), np.asarray(compress_table[0][:300]))
    np.testing.assert_array_equal(np.asarray(sin), np.asarray(compress_table[1][:300]))
    c16, s16 = rope_cos_sin("v4-flash", "compress", max_positions=300, dtype=jnp.bfloat16)
    assert c16.dtype == s16.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(c16), np.asarray(cos).astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(np.asarray(s16), np.asarray(sin).astype(ml_dtypes.bfloat16))


def test_window_table_prefix():
    cos, sin = rope_cos_sin("v4-flash", "window", max_positions=17)
    assert cos.shape == (17, 32)
    ang = (F32(16) * (F32(1) / _pos_freqs(10000.0))).astype(F32)
    np.testing.assert_array_equal(np.asarray(cos[16]), np.cos(ang))
    np.testing.assert_array_equal(np.asarray(sin[16]), np.sin(ang))


def test_table_argument_errors():
    with pytest.raises(ValueError, match=r"max_positions must be in \[1, 1048576\], got 0"):
        rope_cos_sin("v4-flash", "window", max_positions=0)
    with pytest.raises(ValueError, match=r"max_positions must be in \[1, 1048576\], got 1048577"):
        rope_cos_sin("v4-flash", "compress", max_positions=P_FULL + 1)
    with pytest.raises(ValueError,
                       match="layer_kind must be one of 'window', 'compress', got 'yarn'"):
        rope_cos_sin("v4-flash", "yarn", max_positions=4)
    with pytest.raises(ValueError, match="unknown config 'v5'; expected one of v4-flash, v4-pro"):
        rope_inv_freq("v5", "window")


# --------------------------------------------------------------------------- configs and TP


def test_config_fields():
    flash, pro, v41 = (get_config(n) for n in ("v4-flash", "v4-pro", "v4.1-flash"))
    assert (flash.hidden_size, flash.num_heads, flash.o_groups) == (4096, 64, 8)
    assert (pro.hidden_size, pro.num_heads, pro.o_groups) == (7168, 128, 16)
    assert (v41.hidden_size, v41.block_size) == (5120, 32)
    for cfg in DSV4_CONFIGS.values():
        assert cfg.heads_per_group == 8 and cfg.group_in_features == 4096
        assert cfg.nope_dim == 448 and cfg.rope_dim == 64 and cfg.o_lora_rank == 1024
    assert pro.wo_b_in_features == 16384
    assert get_config(flash) is flash


@pytest.mark.parametrize(
    ("name", "tp", "heads", "groups", "weight", "scale"),
    [
        ("v4-flash", 1, 64, 8, (8192, 4096), (64, 32)),
        ("v4-flash", 2, 32, 4, (4096, 4096), (32, 32)),
        ("v4-flash", 8, 8, 1, (1024, 4096), (8, 32)),
        ("v4-pro", 1, 128, 16, (16384, 4096), (128, 32)),
        ("v4-pro", 2, 64, 8, (8192, 4096), (64, 32)),
        ("v4-pro", 4, 32, 4, (4096, 4096), (32, 32)),
        ("v4-pro", 8, 16, 2, (2048, 4096), (16, 32)),
        ("v4.1-flash", 1, 64, 8, (8192, 4096), (256, 128)),
        ("v4.1-flash", 8, 8, 1, (1024, 4096), (32, 128)),
    ],
)
def test_local_shapes(name, tp, heads, groups, weight, scale):
    ls = local_shapes(name, tp)
    assert (ls.tp, ls.num_heads, ls.num_groups) == (tp, heads, groups)
    assert (ls.group_in_features, ls.group_out_features) == (4096, 1024)
    assert ls.weight_shape == weight and ls.scale_shape == scale
    assert ls.o_shape_per_token == (heads, 512)
    assert ls.block_size == get_config(name).block_size


def test_local_shapes_rejects_splits_that_drop_groups():
    with pytest.raises(ValueError, match="v4-flash: o_groups=8 is not divisible by tp=3"):
        local_shapes("v4-flash", 3)
    with pytest.raises(ValueError, match="o_groups=16 is not divisible by tp=32"):
        local_shapes("v4-pro", 32)
    with pytest.raises(ValueError, match="tp must be a positive integer, got 0"):
        local_shapes("v4-pro", 0)
    with pytest.raises(ValueError, match="tp must be a positive integer, got 2.0"):
        local_shapes("v4-pro", 2.0)
