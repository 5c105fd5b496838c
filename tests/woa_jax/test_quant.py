"""1 x GS E8M0 group quantization, the fused inverse-RoPE + quant op and the weight quantizer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from woa_jax import (
    CUDA_AMAX_FLOOR,
    QuantSemantics,
    dequant_wo_a_weight,
    e8m0_scale,
    group_dequant_e8m0,
    group_quant_e8m0,
    inverse_rope,
    inverse_rope_group_quant,
    quantize_weight_blocks,
)
from woa_jax._spec import fp8_max_reciprocal
from woa_jax.testing import assert_bitwise_equal

F32 = np.float32
E4M3FN, E4M3FNUZ = jnp.float8_e4m3fn, jnp.float8_e4m3fnuz


def _numpy_group_quant(x: np.ndarray, gs: int, fp8_dtype, floor=1e-8):
    """Independent numpy reference: bit-bump scale byte, ml_dtypes RNE of ``x / 2**(b-127)``."""
    g = x.astype(F32).reshape(*x.shape[:-1], -1, gs)
    amax = np.fmax(np.nanmax(np.abs(g), axis=-1), F32(floor))
    u = (amax * fp8_max_reciprocal(fp8_dtype)).astype(F32).view(np.uint32).astype(np.int64)
    e = (u >> 23) & 0xFF
    byte = e + ((e < 0xFF) & ((u & 0x7FFFFF) != 0))
    q = (g * np.exp2(127.0 - byte)[..., None].astype(F32)).astype(fp8_dtype)
    return q.reshape(x.shape), byte.astype(np.uint8)


def _bytes(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


@pytest.fixture
def aiter_case(rng):
    """AITER's op-test data: ``o = randn / 10`` bf16, cos/sin of ``randn`` angles in bf16."""
    s, h = 96, 16
    o = jnp.asarray((rng.standard_normal((s, h, 512), dtype=F32) / 10).astype(ml_dtypes.bfloat16))
    ang = rng.standard_normal((512, 32)).astype(F32)
    cos = jnp.asarray(np.cos(ang).astype(ml_dtypes.bfloat16))
    sin = jnp.asarray(np.sin(ang).astype(ml_dtypes.bfloat16))
    positions = (np.arange(s) % 512).astype(np.int64)
    return o, positions, cos, sin


# --------------------------------------------------------------------------- group_quant_e8m0


@pytest.mark.parametrize("fp8_dtype", [E4M3FN, E4M3FNUZ], ids=["e4m3fn", "fnuz"])
@pytest.mark.parametrize("gs", [32, 128])
def test_group_quant_matches_independent_numpy(rng, fp8_dtype, gs):
    # Signed randn with each 128-lane block scaled by 2**randint(-4, 4) (AITER's GEMM test data),
    # plus a far wider spread so that subnormal fp8 outputs occur.
    x = rng.standard_normal((5, 3, 512), dtype=F32)
    x *= np.exp2(rng.integers(-4, 5, size=(5, 3, 4, 1))).repeat(128, -1).reshape(x.shape)
    x[0, 0, :] *= np.exp2(rng.integers(-30, 30, size=512)).astype(F32)
    q, scale = group_quant_e8m0(x, gs, fp8_dtype=fp8_dtype)
    q_ref, b_ref = _numpy_group_quant(x, gs, fp8_dtype)
    assert q.shape == x.shape and q.dtype == fp8_dtype
    assert scale.shape == (5, 3, 512 // gs) and scale.dtype == jnp.float8_e8m0fnu
    assert_bitwise_equal(_bytes(scale), b_ref, name="scale bytes")
    assert_bitwise_equal(q, q_ref, name="fp8 payload")


def test_zero_group_payload_and_floors():
    x = np.zeros((2, 256), F32)
    x[1, 128:] = 1.0
    q, s = group_quant_e8m0(x)
    assert _bytes(s).tolist() == [[92, 92], [92, 119]]
    assert not _bytes(q)[:, :128].any() and not _bytes(q)[0].any()
    _, s10 = group_quant_e8m0(x, amax_floor=CUDA_AMAX_FLOOR)
    assert _bytes(s10).tolist() == [[85, 85], [85, 119]]


@pytest.mark.parametrize("fp8_dtype", [E4M3FN, E4M3FNUZ], ids=["e4m3fn", "fnuz"])
def test_amax_on_a_power_of_two_reaches_fp8_max_without_saturating(fp8_dtype):
    m = float(ml_dtypes.finfo(fp8_dtype).max)
    x = np.full((3, 128), 2.0**-12, F32)
    x[0, 7] = -m * 2.0**-10  # exactly on 448 * 2**k
    x[1, 7] = np.nextafter(F32(m * 2.0**5), F32(np.inf))  # one ulp above: next byte, q = m/2
    x[2, 7] = np.nextafter(F32(m * 2.0**5), F32(0))  # one ulp below: q rounds to m
    q, s = group_quant_e8m0(x, fp8_dtype=fp8_dtype)
    qf = np.asarray(q.astype(jnp.float32))
    assert _bytes(s)[:, 0].tolist() == [117, 133, 132]
    assert qf[:, 7].tolist() == [-m, m / 2, m]
    assert not np.isnan(qf).any()


def test_nan_and_inf_lanes():
    """Outside the contract, documented: NaN lanes are ignored in amax (AITER's fmaxf) and become
    NaN payload; an inf lane gives byte 255 and turns its whole group's payload into NaN."""
    x = np.ones((4, 128), F32)
    x[0, 3] = np.nan
    x[1, 3] = np.inf
    x[2, 3] = -np.inf
    x[3, :] = np.nan
    q, s = group_quant_e8m0(x)
    qf = np.asarray(q.astype(jnp.float32))
    assert _bytes(s)[:, 0].tolist() == [119, 255, 255, 92]
    assert np.isnan(qf[0, 3]) and (np.delete(qf[0], 3) == 256.0).all()
    assert np.isnan(qf[1:]).all()


def test_dequant_is_exact():
    rng = np.random.default_rng(3)
    q = rng.integers(0, 256, (4, 256), dtype=np.uint8)
    q[(q & 0x7F) == 0x7F] = 0  # drop the NaN codes
    q = q.view(ml_dtypes.float8_e4m3fn)
    b = rng.integers(100, 140, (4, 2), dtype=np.uint8)
    got = np.asarray(group_dequant_e8m0(q, b.view(ml_dtypes.float8_e8m0fnu)))
    expect = q.astype(np.float64) * np.exp2(b.astype(np.float64) - 127).repeat(128, axis=1)
    np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(np.asarray(group_dequant_e8m0(q, b)), got)


def test_group_quant_errors():
    with pytest.raises(ValueError, match="last dim 200 is not a multiple of group_size=128"):
        group_quant_e8m0(np.zeros((2, 200), F32))
    with pytest.raises(ValueError, match="group_size must be a positive integer, got 0"):
        group_quant_e8m0(np.zeros((2, 128), F32), 0)
    with pytest.raises(TypeError, match="fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz"):
        group_quant_e8m0(np.zeros((2, 128), F32), fp8_dtype=jnp.bfloat16)


# --------------------------------------------------------------------------- fused op


def test_fused_op_is_rotation_then_quant_in_the_group_view(aiter_case):
    o, positions, cos, sin = aiter_case
    x, xs = inverse_rope_group_quant(o, positions, cos, sin, 2, 128)
    assert x.shape == (96, 2, 4096) and xs.shape == (96, 2, 32)
    rotated = np.asarray(inverse_rope(o, positions, cos, sin, out_dtype=jnp.float32))
    q_ref, b_ref = _numpy_group_quant(rotated.reshape(96, 2, 4096), 128, E4M3FN)
    assert_bitwise_equal(_bytes(xs), b_ref, name="scale bytes")
    assert_bitwise_equal(x, q_ref, name="fp8 payload")


def test_group_view_places_heads_in_order():
    """Group g holds heads g*hpg .. g*hpg+hpg-1; its chunk k is chunk k % 4 of head k // 4."""
    s, h, g = 1, 4, 2
    o = np.zeros((s, h, 512), F32)
    for head in range(h):
        o[0, head, :448] = 2.0**head  # NoPE lanes only, so the rotation leaves them alone
    cos, sin = np.ones((1, 32), F32), np.zeros((1, 32), F32)
    _, xs = inverse_rope_group_quant(o, np.zeros(1, np.int32), cos, sin, g, 128)
    # amax 2**head -> byte 119 + head; four 128-lane chunks per head.
    expect = [[119 + 2 * gi] * 4 + [120 + 2 * gi] * 4 for gi in range(g)]
    assert _bytes(xs)[0].tolist() == expect


def test_unfused_differs_from_fused_by_at_most_one_step_on_few_rope_groups(aiter_case):
    o, positions, cos, sin = aiter_case
    for gs, rope_chunks in ((128, {3}), (32, {14, 15})):
        x, xs = inverse_rope_group_quant(o, positions, cos, sin, 2, gs)
        xu, xsu = inverse_rope_group_quant(o, positions, cos, sin, 2, gs,
                                           semantics=QuantSemantics.UNFUSED)
        d = _bytes(xs).astype(int) - _bytes(xsu).astype(int)
        frac = float((d != 0).mean())
        print(f"GS={gs}: {int((d != 0).sum())} of {d.size} scale bytes differ ({frac:.2e})")
        assert np.abs(d).max() <= 1
        assert frac <= 0.01
        # Only chunks that hold rotated lanes can differ (chunk index within its 512-lane head).
        chunk_in_head = np.nonzero(d)[2] % (512 // gs)
        assert set(chunk_in_head.tolist()) <= rope_chunks
        # Unfused is exactly "round the rotation to o.dtype, then quantize".
        rot16 = np.asarray(inverse_rope(o, positions, cos, sin)).astype(F32)
        q_ref, b_ref = _numpy_group_quant(rot16.reshape(96, 2, 4096), gs, E4M3FN)
        assert_bitwise_equal(_bytes(xsu), b_ref, name="unfused scale bytes")
        assert_bitwise_equal(xu, q_ref, name="unfused payload")


def test_fused_op_options(aiter_case):
    o, positions, cos, sin = aiter_case
    x, xs = inverse_rope_group_quant(o, positions, cos, sin, 4, 64, fp8_dtype=E4M3FNUZ,
                                     amax_floor=CUDA_AMAX_FLOOR, semantics="unfused")
    assert x.dtype == E4M3FNUZ and x.shape == (96, 4, 2048) and xs.shape == (96, 4, 32)
    rot16 = np.asarray(inverse_rope(o, positions, cos, sin)).astype(F32)
    q_ref, b_ref = _numpy_group_quant(rot16.reshape(96, 4, 2048), 64, E4M3FNUZ, CUDA_AMAX_FLOOR)
    assert_bitwise_equal(_bytes(xs), b_ref)
    assert_bitwise_equal(x, q_ref)


def test_fused_op_under_jit_matches_eager(aiter_case):
    o, positions, cos, sin = aiter_case
    f = jax.jit(inverse_rope_group_quant, static_argnums=(4, 5),
                static_argnames=("fp8_dtype", "amax_floor", "semantics"))
    for kw in ({}, {"semantics": "unfused", "amax_floor": CUDA_AMAX_FLOOR}):
        xe, se = inverse_rope_group_quant(o, positions, cos, sin, 2, 128, **kw)
        xj, sj = f(o, positions, cos, sin, 2, 128, **kw)
        assert_bitwise_equal(xj, xe)
        assert_bitwise_equal(_bytes(sj), _bytes(se))


def test_fused_op_empty_batch():
    cos, sin = jnp.ones((8, 32), jnp.bfloat16), jnp.zeros((8, 32), jnp.bfloat16)
    o = jnp.zeros((0, 8, 512), jnp.bfloat16)
    for f in (inverse_rope_group_quant,
              jax.jit(inverse_rope_group_quant, static_argnums=(4, 5))):
        x, xs = f(o, np.zeros(0, np.int64), cos, sin, 1, 128)
        assert x.shape == (0, 1, 4096) and x.dtype == E4M3FN
        assert xs.shape == (0, 1, 32) and xs.dtype == jnp.float8_e8m0fnu


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"num_groups": 3}, ValueError, r"H \* Dh = 2 \* 512 = 1024 is not divisible by "
                                        r"num_groups=3"),
        ({"num_groups": 0}, ValueError, "num_groups must be a positive integer, got 0"),
        ({"quant_group_size": 48}, ValueError, "quant_group_size must be 32, 64 or 128, got 48"),
        ({"num_groups": 8, "quant_group_size": 256}, ValueError, "must be 32, 64 or 128"),
        ({"num_groups": 16}, ValueError,
         "group width D = 64 is not a multiple of quant_group_size=128"),
        ({"semantics": "roundtrip"}, ValueError,
         "semantics must be one of 'fused', 'unfused', got 'roundtrip'"),
        ({"fp8_dtype": jnp.float8_e5m2}, TypeError,
         "fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz, got float8_e5m2"),
    ],
)
def test_fused_op_errors(kwargs, exc, match):
    o = jnp.zeros((3, 2, 512), jnp.bfloat16)
    cos, sin = jnp.ones((8, 32), jnp.bfloat16), jnp.zeros((8, 32), jnp.bfloat16)
    args = {"num_groups": 1, "quant_group_size": 128, **kwargs}
    ng, gs = args.pop("num_groups"), args.pop("quant_group_size")
    with pytest.raises(exc, match=match):
        inverse_rope_group_quant(o, np.arange(3), cos, sin, ng, gs, **args)


# ----------------------------------------------------------------------------- weight blocks


@pytest.mark.parametrize("fp8_dtype", [E4M3FN, E4M3FNUZ])
@pytest.mark.parametrize("block", [32, 128])
def test_weight_blocks_use_the_activation_rule_per_tile(rng, fp8_dtype, block):
    """Each tile's byte is ``e8m0_scale`` of its amax; the payload is RNE of ``w / scale``."""
    rows, k = 2 * block + 5, 3 * block  # a ragged last row tile
    w = rng.standard_normal((rows, k), dtype=F32) * F32(0.02)
    q, s = quantize_weight_blocks(w, block=block, fp8_dtype=fp8_dtype)
    assert q.dtype == np.dtype(fp8_dtype) and q.shape == (rows, k)
    assert s.dtype == np.dtype(ml_dtypes.float8_e8m0fnu) and s.shape == (3, 3)
    for r in range(3):
        for c in range(3):
            tile = w[r * block:(r + 1) * block, c * block:(c + 1) * block]
            _, byte = e8m0_scale(np.abs(tile).max(), fp8_dtype=fp8_dtype)
            assert _bytes(s)[r, c] == int(byte)
            want = (tile * np.exp2(127.0 - int(byte)).astype(F32)).astype(fp8_dtype)
            got = q[r * block:(r + 1) * block, c * block:(c + 1) * block]
            assert_bitwise_equal(got, want, name=f"tile {r, c}")


def test_weight_blocks_round_trip_through_dequant_exactly(rng, make_weight):
    """fp8 values times one power of two per tile come back byte for byte."""
    w, ws = make_weight(256, 512, 128, rng)
    real = np.asarray(dequant_wo_a_weight(w, ws, 2, dtype=jnp.float32)).reshape(256, 512)
    q, s = quantize_weight_blocks(real)
    assert_bitwise_equal(dequant_wo_a_weight(q, s, 2, dtype=jnp.float32),
                         dequant_wo_a_weight(w, ws, 2, dtype=jnp.float32))
    assert np.abs(q.astype(F32)).max() <= 448


def test_weight_blocks_zero_tile_and_ragged_k():
    w = np.zeros((128, 160), F32)
    w[0, 150] = 3.0
    q, s = quantize_weight_blocks(w)
    assert s.shape == (1, 2)
    assert _bytes(s)[0, 0] == 92  # the amax floor, as an all-zero activation group
    assert float(q[0, 150]) * 2.0 ** (int(_bytes(s)[0, 1]) - 127) == 3.0


@pytest.mark.parametrize("w, kwargs, exc, match", [
    (np.zeros((4, 128, 128), F32), {}, ValueError, r"w must be 2-D \[R, K\]"),
    (np.zeros((128, 128), np.int32), {}, TypeError, "w must have dtype"),
    (np.zeros((128, 128), F32), {"block": 96}, ValueError, "block must be 32, 64 or 128"),
    (np.zeros((128, 128), F32), {"fp8_dtype": np.float16}, TypeError, "fp8_dtype"),
    (np.full((128, 128), np.inf, F32), {}, ValueError, r"w: element \[0, 0\] = inf"),
])
def test_weight_blocks_errors(w, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        quantize_weight_blocks(w, **kwargs)


@pytest.mark.parametrize("floor", [float("nan"), 0.0, -1.0, float("inf"), "x", None])
def test_every_quantizer_rejects_a_bad_amax_floor(floor, aiter_case):
    o, pos, cos, sin = aiter_case
    calls = [
        lambda: e8m0_scale(np.ones(2, F32), amax_floor=floor),
        lambda: group_quant_e8m0(np.ones((1, 128), F32), 128, amax_floor=floor),
        lambda: inverse_rope_group_quant(o, pos, cos, sin, 2, 128, amax_floor=floor),
    ]
    for call in calls:  # a floor of another type is a TypeError
        with pytest.raises(ValueError if isinstance(floor, float) else TypeError,
                           match=r"amax_floor must be a finite number > 0, got"):
            call()
