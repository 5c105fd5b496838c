"""Inverse RoPE: lanes, pairing, sign, FMA-free fp32 arithmetic, positions (docs/NUMERICS.md 2)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from woa_jax import forward_rope, inverse_rope, inverse_rope_float64
from woa_jax.testing import assert_bitwise_equal

F32 = np.float32
jit_inverse = jax.jit(inverse_rope, static_argnames=("out_dtype",))


def _numpy_inverse_fp32(o, positions, cos, sin) -> np.ndarray:
    """Independent fp32 reference: separate numpy multiplies and adds (numpy never fuses them)."""
    o = np.asarray(o).astype(F32)
    half = cos.shape[1]
    p = np.clip(np.asarray(positions).astype(np.int64), 0, cos.shape[0] - 1)
    c = np.asarray(cos).astype(F32)[p][:, None, :]
    s = np.asarray(sin).astype(F32)[p][:, None, :]
    out = o.copy()
    a, b = o[..., -2 * half :: 2], o[..., -2 * half + 1 :: 2]
    out[..., -2 * half :: 2] = a * c + b * s
    out[..., -2 * half + 1 :: 2] = b * c - a * s
    return out


@pytest.fixture
def rope_case(rng, small_table):
    cos, sin = small_table
    o = jnp.asarray((rng.standard_normal((7, 4, 512), dtype=F32) * 0.1).astype(ml_dtypes.bfloat16))
    positions = rng.integers(0, cos.shape[0], 7).astype(np.int64)
    positions[0], positions[1] = 0, cos.shape[0] - 1
    return o, positions, cos, sin


def test_rotates_the_last_lanes_as_gptj_pairs_by_minus_theta():
    o = np.zeros((1, 1, 512), F32)
    o[0, 0, 448 + 2 * 5] = 1.0  # pair j = 5, lane a
    o[0, 0, 100] = 3.0
    theta = 0.3
    cos = np.ones((2, 32), F32)
    sin = np.zeros((2, 32), F32)
    cos[1, 5], sin[1, 5] = np.cos(theta), np.sin(theta)
    got = np.asarray(inverse_rope(o, np.array([1], np.int32), cos, sin))
    expect = o.copy()
    # a' = a c + b s = c and b' = b c - a s = -s: the conjugate rotation.
    expect[0, 0, 458], expect[0, 0, 459] = cos[1, 5], -sin[1, 5]
    np.testing.assert_array_equal(got, expect)
    fwd = np.asarray(forward_rope(o, np.array([1], np.int32), cos, sin))
    assert fwd[0, 0, 459] == sin[1, 5] and fwd[0, 0, 458] == cos[1, 5]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_fp32_tables_match_unfused_numpy_bit_for_bit(rope_case, jit):
    o, positions, cos, sin = rope_case
    f = jit_inverse if jit else inverse_rope
    got = f(o, positions, cos, sin, out_dtype=jnp.float32)
    assert_bitwise_equal(got, _numpy_inverse_fp32(o, positions, cos, sin))
    # fp32 o too (all 24 mantissa bits live, so products round).
    o32 = np.asarray(o).astype(F32) * F32(1.0 + 2.0**-20)
    assert_bitwise_equal(f(o32, positions, cos, sin), _numpy_inverse_fp32(o32, positions, cos, sin))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_no_fma_contraction(jit):
    """A case where fma(a, c, b*s) != fp32(a*c) + fp32(b*s): the oracle must give the latter."""
    a, c = F32(1 + 2.0**-12), F32(1 + 2.0**-12)  # a*c = 1 + 2**-11 + 2**-24 rounds (tie, even)
    b, s = F32(-(1 + 2.0**-11)), F32(1.0)
    unfused = a * c + b * s
    fused = float(np.float64(a) * np.float64(c) + np.float64(b) * np.float64(s))
    assert unfused == 0.0 and fused == 2.0**-24  # the case really separates the two
    o = np.array([[[a, b]]], F32)
    cos, sin = np.array([[c]], F32), np.array([[s]], F32)
    f = jit_inverse if jit else inverse_rope
    got = np.asarray(f(o, np.zeros(1, np.int32), cos, sin))
    assert got[0, 0, 0] == unfused
    assert_bitwise_equal(got, _numpy_inverse_fp32(o, np.zeros(1), cos, sin))


def test_bf16_tables_equal_float64_rounded_once_to_fp32(rope_case):
    """bf16 o times bf16 cos/sin is exact in fp32, so only the final sum rounds."""
    o, positions, cos, sin = rope_case
    cos16, sin16 = cos.astype(jnp.bfloat16), sin.astype(jnp.bfloat16)
    got = inverse_rope(o, positions, cos16, sin16, out_dtype=jnp.float32)
    truth = inverse_rope_float64(o, positions, cos16, sin16).astype(F32)
    assert_bitwise_equal(got, truth)
    # Default out_dtype keeps o's dtype: one more RNE rounding, to bf16.
    got16 = inverse_rope(o, positions, cos16, sin16)
    assert got16.dtype == jnp.bfloat16
    assert_bitwise_equal(got16, truth.astype(ml_dtypes.bfloat16))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_nope_lanes_are_bit_identical(rng, small_table, dtype):
    cos, sin = small_table
    o = rng.standard_normal((3, 2, 512), dtype=F32).astype(dtype)
    o[0, 0, :4] = [np.nan, -0.0, np.inf, -np.inf]
    got = np.asarray(inverse_rope(jnp.asarray(o), np.array([5, 0, 4095]), cos, sin))
    assert got.dtype == o.dtype
    assert_bitwise_equal(got[..., :448], o[..., :448], name="NoPE lanes")
    assert not np.array_equal(got[..., 448:], o[..., 448:])


def test_positions_int32_and_int64_agree(rope_case):
    o, positions, cos, sin = rope_case
    a = inverse_rope(o, positions.astype(np.int32), cos, sin)
    b = inverse_rope(o, positions.astype(np.int64), cos, sin)
    c = jit_inverse(o, jnp.asarray(positions.astype(np.int32)), cos, sin)
    assert_bitwise_equal(a, b)
    assert_bitwise_equal(c, b)


def test_out_of_range_positions_are_clamped(rope_case):
    o, _, cos, sin = rope_case
    p = cos.shape[0]
    wild = np.array([-1, -(2**40), p, p + 7, 2**32 + 3, 2**31, 3], np.int64)
    clamped = np.array([0, 0, p - 1, p - 1, p - 1, p - 1, 3], np.int64)
    assert_bitwise_equal(inverse_rope(o, wild, cos, sin), inverse_rope(o, clamped, cos, sin))
    w32 = np.array([-5, p, 2**31 - 1, 0, 1, 2, 3], np.int32)
    c32 = np.array([0, p - 1, p - 1, 0, 1, 2, 3], np.int32)
    assert_bitwise_equal(jit_inverse(o, w32, cos, sin), inverse_rope(o, c32, cos, sin))
    # The float64 truth clamps the same way.
    np.testing.assert_array_equal(inverse_rope_float64(o, wild, cos, sin),
                                  inverse_rope_float64(o, clamped, cos, sin))


def test_positions_longer_than_the_batch_use_the_first_s(rope_case):
    o, positions, cos, sin = rope_case
    longer = np.concatenate([positions, np.array([1, 2, 3], np.int64)])
    expect = inverse_rope(o, positions, cos, sin)
    assert_bitwise_equal(inverse_rope(o, longer, cos, sin), expect)
    assert_bitwise_equal(jit_inverse(o, longer, cos, sin), expect)
    np.testing.assert_array_equal(inverse_rope_float64(o, longer, cos, sin),
                                  inverse_rope_float64(o, positions, cos, sin))


def test_forward_then_inverse_round_trips_to_fp32_rounding(rope_case):
    o, positions, cos, sin = rope_case
    o32 = np.asarray(o).astype(F32)
    back = np.asarray(inverse_rope(forward_rope(o32, positions, cos, sin), positions, cos, sin))
    # Each pair: two rotations, each a few ulps, and cos^2 + sin^2 = 1 only to fp32 rounding.
    pair_mag = np.abs(o32[..., 448::2]) + np.abs(o32[..., 449::2])
    err = np.maximum(np.abs(back[..., 448::2] - o32[..., 448::2]),
                     np.abs(back[..., 449::2] - o32[..., 449::2]))
    assert (err <= 8 * 2.0**-24 * pair_mag).all(), float((err / pair_mag).max())
    assert_bitwise_equal(back[..., :448], o32[..., :448])


def test_partial_rope_width_and_tiny_heads():
    """rd = 2 * cos.shape[1] may be any even width <= Dh; the rotated lanes are always the last."""
    rng = np.random.default_rng(5)
    o = rng.standard_normal((2, 3, 10), dtype=F32)
    ang = rng.standard_normal((4, 2)).astype(F32)
    cos, sin = np.cos(ang), np.sin(ang)
    pos = np.array([3, 1])
    assert_bitwise_equal(inverse_rope(o, pos, cos, sin), _numpy_inverse_fp32(o, pos, cos, sin))
    assert_bitwise_equal(inverse_rope(o, pos, cos, sin)[..., :6], o[..., :6])


def test_empty_batch(small_table):
    cos, sin = small_table
    o = jnp.zeros((0, 8, 512), jnp.bfloat16)
    for f in (inverse_rope, jit_inverse):
        got = f(o, np.zeros(0, np.int32), cos, sin)
        assert got.shape == (0, 8, 512) and got.dtype == jnp.bfloat16
    assert inverse_rope_float64(o, np.zeros(0, np.int64), cos, sin).shape == (0, 8, 512)


def test_float64_truth_close_to_fp32(rope_case):
    o, positions, cos, sin = rope_case
    got = np.asarray(inverse_rope(o, positions, cos, sin, out_dtype=jnp.float32))
    truth = inverse_rope_float64(o, positions, cos, sin)
    assert truth.dtype == np.float64
    np.testing.assert_allclose(got, truth, rtol=0, atol=4 * 2.0**-24 * np.abs(truth).max())


_O = jnp.zeros((3, 2, 512), jnp.bfloat16)
_P = np.arange(3)
_C = jnp.ones((8, 32), jnp.bfloat16)


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        ((_O[0], _P, _C, _C), ValueError, r"o must be 3-D \[S, H, Dh\], got shape \(2, 512\)"),
        ((_O.astype(jnp.int32), _P, _C, _C), TypeError,
         "o must have dtype bfloat16 or float16 or float32, got int32"),
        ((_O, _P[:, None], _C, _C), ValueError, r"positions must be 1-D \[S\], got shape \(3, 1\)"),
        ((_O, _P.astype(F32), _C, _C), TypeError, "positions must be int32 or int64, got float32"),
        ((_O, _P[:2], _C, _C), ValueError, "positions has 2 entries, fewer than S=3 tokens"),
        ((_O, _P, _C[0], _C), ValueError, r"cos_cache must be 2-D \[P, rope_dim / 2\]"),
        ((_O, _P, _C, _C[:, :16]), ValueError,
         r"cos_cache and sin_cache must have the same shape, got \(8, 32\) and \(8, 16\)"),
        ((_O, _P, _C.astype(jnp.int8), _C.astype(jnp.int8)), TypeError,
         "cos_cache must have dtype bfloat16 or float16 or float32, got int8"),
        ((_O, _P, jnp.ones((8, 300)), jnp.ones((8, 300))), ValueError,
         r"does not fit head_dim 512: need P >= 1 and 2 <= rd <= 512"),
        ((_O, _P, jnp.ones((0, 32)), jnp.ones((0, 32))), ValueError, "need P >= 1"),
    ],
)
def test_rope_errors(args, exc, match):
    for f in (inverse_rope, forward_rope, inverse_rope_float64):
        with pytest.raises(exc, match=match):
            f(*args)
