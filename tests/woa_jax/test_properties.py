"""Property tests (hypothesis): quantization bounds, RoPE invariants, layout bijections.

Shapes come from small fixed sets so that XLA compiles each function only a few times.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from woa_jax import (
    forward_rope,
    from_scale_layout,
    group_quant_e8m0,
    inverse_rope,
    scale_shape,
    to_scale_layout,
)
from woa_jax.testing import assert_bitwise_equal

F32 = np.float32
FP8 = {"e4m3fn": jnp.float8_e4m3fn, "e4m3fnuz": jnp.float8_e4m3fnuz}
SETTINGS = settings(max_examples=30, deadline=None)

jit_quant = jax.jit(group_quant_e8m0, static_argnums=(1,),
                    static_argnames=("fp8_dtype", "amax_floor"))
jit_inverse = jax.jit(inverse_rope, static_argnames=("out_dtype",))
jit_forward = jax.jit(forward_rope, static_argnames=("out_dtype",))

ROWS, WIDTH = 4, 256


@st.composite
def wide_range_groups(draw):
    """``[4, 256]`` fp32: mantissas in [-2, 2] times a per-32-lane power of two in [2**-100,
    2**100], so groups span normal and subnormal fp8 outputs; some groups are all zero."""
    m = draw(arrays(F32, (ROWS, WIDTH), elements=st.floats(-2, 2, width=32)))
    e = draw(arrays(np.int32, (ROWS, WIDTH // 32), elements=st.integers(-100, 100)))
    x = m * np.exp2(e.astype(F32)).repeat(32, axis=1)
    zero_rows = draw(st.lists(st.integers(0, ROWS - 1), max_size=2))
    x[zero_rows] = 0
    return x.astype(F32)


@SETTINGS
@given(x=wide_range_groups(), gs=st.sampled_from([32, 128]), flavour=st.sampled_from(list(FP8)))
def test_quant_bounds(x, gs, flavour):
    fp8 = FP8[flavour]
    info = ml_dtypes.finfo(fp8)
    fmax = float(info.max)
    q, scale = jit_quant(x, gs, fp8_dtype=fp8)
    byte = np.asarray(scale).view(np.uint8).astype(np.int64)
    qf = np.asarray(q.astype(jnp.float32)).astype(np.float64)
    dq = np.exp2(byte - 127.0)
    amax = np.abs(x.astype(np.float64)).reshape(ROWS, -1, gs).max(-1)

    # Every scale is a power of two (bit pattern with an empty mantissa) ...
    bits = np.asarray(jax.lax.bitcast_convert_type(
        jnp.asarray(byte.astype(np.uint32) << 23), jnp.float32)).view(np.uint32)
    assert ((bits & 0x7FFFFF) == 0).all()
    # ... and the smallest one with amax / scale <= fp8 max (above the 1e-8 floor).
    floored = np.maximum(amax, F32(1e-8).astype(np.float64))
    assert (floored <= fmax * dq).all()
    assert (floored > fmax * dq / 2).all()

    # |q| <= fp8 max, no NaN from finite input.
    assert not np.isnan(qf).any() and (np.abs(qf) <= fmax).all()

    # Dequantized values are within half an fp8 step of the input, the step being the spacing
    # of the fp8 grid around x / scale (subnormal spacing below the smallest normal).
    y = x.astype(np.float64) / dq.repeat(gs, axis=1)
    min_exp = int(np.log2(float(info.smallest_normal)))
    e = np.floor(np.log2(np.maximum(np.abs(y), 2.0**min_exp)))
    half_step = np.exp2(e - info.nmant) / 2
    assert (np.abs(qf - y) <= half_step).all()


HEAD_SHAPES = [(3, 2, 16), (1, 1, 64)]


@st.composite
def rope_inputs(draw, allow_special: bool):
    s, h, dh = draw(st.sampled_from(HEAD_SHAPES))
    half = draw(st.sampled_from([1, dh // 4]))
    elem = (st.floats(width=32, allow_nan=True, allow_infinity=True) if allow_special
            else st.floats(-1e4, 1e4, width=32))
    o = draw(arrays(F32, (s, h, dh), elements=elem))
    ang = draw(arrays(F32, (5, half), elements=st.floats(-1e3, 1e3, width=32)))
    pos = draw(arrays(np.int32, (s,), elements=st.integers(0, 4)))
    return o, pos, np.cos(ang), np.sin(ang)


@SETTINGS
@given(case=rope_inputs(allow_special=True), dtype=st.sampled_from(["bfloat16", "float32"]),
       tables=st.sampled_from(["bfloat16", "float32"]))
def test_nope_lanes_bit_identical(case, dtype, tables):
    o, pos, cos, sin = case
    o = o.astype(getattr(ml_dtypes, dtype) if dtype == "bfloat16" else F32)
    cos, sin = (t.astype(ml_dtypes.bfloat16) if tables == "bfloat16" else t for t in (cos, sin))
    nope = o.shape[-1] - 2 * cos.shape[1]
    got = np.asarray(jit_inverse(o, pos, cos, sin))
    assert_bitwise_equal(got[..., :nope], o[..., :nope], name="NoPE lanes")


@SETTINGS
@given(case=rope_inputs(allow_special=False))
def test_inverse_undoes_forward(case):
    o, pos, cos, sin = case
    back = np.asarray(jit_inverse(jit_forward(o, pos, cos, sin), pos, cos, sin))
    half = cos.shape[1]
    a, b = o[..., -2 * half :: 2], o[..., -2 * half + 1 :: 2]
    mag = np.abs(a).astype(np.float64) + np.abs(b)
    err = np.maximum(np.abs(back[..., -2 * half :: 2] - a),
                     np.abs(back[..., -2 * half + 1 :: 2] - b))
    # Two rotations of a few fp32 roundings each, and cos^2 + sin^2 = 1 only to fp32 rounding.
    # The absolute term covers products below the smallest normal: XLA on CPU flushes them to 0.
    assert (err <= 8 * 2.0**-24 * mag + 8 * 2.0**-126).all()


def _documented_address(s, g, k, layout, gs, num_g, s_pad, ks_pad, ks):
    """AITER's layout formulas, written out independently of woa_jax.layouts."""
    if layout == "row":
        return (s * num_g + g) * ks + k
    if layout == "n32k4":
        return ((s // 32) * num_g + g) * ks * 32 + (k // 4) * 128 + (s % 32) * 4 + k % 4
    tile = g * s_pad * ks_pad
    if layout == "mfma_tile" and gs == 128:
        return (tile + (s // 32) * ks_pad * 32 + (k // 2) * 64 + (s % 16) * 4 + (k % 2) * 2
                + (s // 16) % 2)
    return (tile + ((s // 32) * (ks_pad // 8) + k // 8) * 256 + ((k % 4) * 16 + s % 16) * 4
            + (s // 16) % 2 + ((k // 4) % 2) * 2)


@st.composite
def layout_case(draw):
    layout, gs = draw(st.sampled_from([("row", 128), ("mfma_tile", 128), ("mfma_tile", 32),
                                       ("scale_shuffle", 128), ("n32k4", 32)]))
    s = draw(st.integers(0, 80))
    g = draw(st.integers(1, 3))
    ks = 4 * draw(st.integers(1, 3)) if layout == "n32k4" else draw(st.integers(1, 11))
    x = draw(arrays(np.uint8, (s, g, ks)))
    return layout, gs, x


@settings(max_examples=20, deadline=None)
@given(case=layout_case(), data=st.data())
def test_layout_round_trip_and_addresses(case, data):
    layout, gs, x = case
    s, g, ks = x.shape
    buf = to_scale_layout(x, layout, quant_group_size=gs, pad_value=0)
    shape = scale_shape(s, g, ks, layout, gs)
    assert buf.shape == shape
    np.testing.assert_array_equal(
        np.asarray(from_scale_layout(buf, layout, s, g, ks, quant_group_size=gs)), x)
    if s == 0:
        return
    raw = np.asarray(buf).ravel()
    s_pad, ks_pad = (shape[1], shape[2]) if layout in ("mfma_tile", "scale_shuffle") else (0, 0)
    for _ in range(3):
        si = data.draw(st.integers(0, s - 1))
        gi = data.draw(st.integers(0, g - 1))
        ki = data.draw(st.integers(0, ks - 1))
        addr = _documented_address(si, gi, ki, layout, gs, g, s_pad, ks_pad, ks)
        assert raw[addr] == x[si, gi, ki], (si, gi, ki, addr)
