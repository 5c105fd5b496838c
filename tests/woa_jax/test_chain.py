"""The full wo_a chains on DeepSeek V4 shapes: FP8 vs BF16 vs float64 truth (docs/NUMERICS.md 7)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from woa_jax import (
    CUDA_AMAX_FLOOR,
    batched_gemm_a8w8_mxscale,
    dequant_weight,
    dequant_wo_a_weight,
    inverse_rope_group_quant,
    local_shapes,
    wo_a_bf16,
    wo_a_fp8,
    wo_a_truth,
    wo_a_weight_e8m0,
)
from woa_jax.testing import TOLERANCES, assert_bitwise_equal, assert_close, relative_error

F32 = np.float32
P_FULL = 1_048_576

jit_fp8 = jax.jit(wo_a_fp8, static_argnums=(6,),
                  static_argnames=("amax_floor", "semantics", "dtype"))
jit_bf16 = jax.jit(wo_a_bf16, static_argnums=(6,))
jit_quant = jax.jit(inverse_rope_group_quant, static_argnums=(4, 5),
                    static_argnames=("fp8_dtype", "amax_floor", "semantics"))


def _positions(rng, s: int, p: int) -> np.ndarray:
    pos = rng.integers(0, p, s).astype(np.int64)
    pos[0] = p - 1  # the last table row is always exercised
    if s > 1:
        pos[1] = 0
    return pos


def test_fp8_chain_error_budget_on_v4_flash(rng, make_weight, bf16_o, compress_table,
                                            compress_table_bf16):
    """Measure and gate: FP8 vs BF16 chain, each vs the float64 truth (V4-Flash, TP 1, S 16)."""
    ls = local_shapes("v4-flash", 1)
    s = 16
    w, ws = make_weight(*ls.weight_shape, ls.block_size, rng)
    o = bf16_o((s, *ls.o_shape_per_token), rng)
    pos = _positions(rng, s, P_FULL)
    cos, sin = compress_table
    y8 = jit_fp8(o, pos, *compress_table_bf16, w, ws, ls.num_groups)  # AITER: bf16 cos/sin
    yb = jit_bf16(o, pos, cos, sin, w, ws, ls.num_groups)  # BF16 path: fp32 cos/sin
    truth = wo_a_truth(o, pos, cos, sin, w, ws, ls.num_groups)
    assert y8.shape == yb.shape == truth.shape == (s, 8, 1024)
    e_8b = assert_close(y8, yb, tolerance="fp8_chain_vs_bf16", name="fp8 vs bf16")
    e_8t = assert_close(y8, truth, tolerance="fp8_chain_vs_bf16", name="fp8 vs truth")
    e_bt = assert_close(yb, truth, tolerance="bf16_chain_vs_truth", name="bf16 vs truth")
    print(f"\nV4-Flash TP1 S={s} (H 64, G 8, K 4096, N 1024), o = randn * 0.1: "
          f"fp8 vs bf16 {e_8b:.3e}, fp8 vs truth {e_8t:.3e}, bf16 vs truth {e_bt:.3e}")
    # The errors are what quantization implies, not accidentally small (a chain that skipped
    # the quantizer would pass the upper gates).
    assert e_8t > 0.25 * TOLERANCES["fp8_chain_vs_bf16"].rel
    assert e_bt > 0.25 * TOLERANCES["bf16_chain_vs_truth"].rel
    # The CUDA flavour (fp32 cos/sin, floor 1e-10) lands in the same budget.
    y8c = jit_fp8(o, pos, cos, sin, w, ws, ls.num_groups, amax_floor=CUDA_AMAX_FLOOR)
    assert_close(y8c, truth, tolerance="fp8_chain_vs_bf16", name="cuda fp8 vs truth")


DS_CASES = [("v4-flash", 1), ("v4-flash", 2), ("v4-flash", 8),
            ("v4-pro", 1), ("v4-pro", 2), ("v4-pro", 8)]


@pytest.mark.parametrize("s", [1, 7, 128])
@pytest.mark.parametrize(("name", "tp"), DS_CASES, ids=[f"{n}-tp{t}" for n, t in DS_CASES])
def test_quant_op_on_deepseek_shapes(name, tp, s, rng, bf16_o, compress_table_bf16):
    ls = local_shapes(name, tp)
    h, g = ls.num_heads, ls.num_groups
    o = np.asarray(bf16_o((s, h, 512), rng)).copy()
    o[0] = 0  # an all-zero token: every scale is the floor byte
    if s > 1:
        o[s - 1, 0, 0] = ml_dtypes.finfo(ml_dtypes.bfloat16).max  # a NoPE lane: stays finite
    x, xs = jit_quant(jnp.asarray(o), _positions(rng, s, P_FULL), *compress_table_bf16, g, 128)
    assert x.shape == (s, g, 4096) and x.dtype == jnp.float8_e4m3fn
    assert xs.shape == (s, g, 32) and xs.dtype == jnp.float8_e8m0fnu
    b = np.asarray(xs).view(np.uint8)
    assert b.min() >= 92 and b.max() <= 247
    assert (b[0] == 92).all() and (np.asarray(x[0].astype(jnp.float32)) == 0).all()  # maybe -0
    if s > 1:
        assert b[s - 1, 0, 0] == 247
        # bf16 max = 255 * 2**120 at scale 2**120: 255 rounds to e4m3's 256.
        assert np.asarray(x.astype(jnp.float32))[s - 1, 0, 0] == 256.0


CHAIN_CASES = [*DS_CASES, ("v4.1-flash", 1), ("v4.1-flash", 8)]


@pytest.mark.parametrize(("name", "tp"), CHAIN_CASES, ids=[f"{n}-tp{t}" for n, t in CHAIN_CASES])
def test_full_chain_on_deepseek_shapes(name, tp, rng, make_weight, bf16_o, compress_table,
                                       compress_table_bf16):
    ls = local_shapes(name, tp)
    s = 3
    w, ws = make_weight(*ls.weight_shape, ls.block_size, rng)
    assert ws.shape == ls.scale_shape
    o = bf16_o((s, *ls.o_shape_per_token), rng)
    pos = _positions(rng, s, P_FULL)
    y8 = jit_fp8(o, pos, *compress_table_bf16, w, ws, ls.num_groups)
    yb = jit_bf16(o, pos, *compress_table, w, ws, ls.num_groups)
    assert y8.shape == (s, ls.num_groups, 1024) and y8.dtype == jnp.bfloat16
    err = assert_close(y8, yb, tolerance="fp8_chain_vs_bf16", name=f"{name} tp{tp}")
    print(f"{name} tp{tp} block {ls.block_size}: fp8 vs bf16 {err:.3e}")


@pytest.fixture
def small_case(rng, make_weight, bf16_o, small_table):
    """A cut-down wo_a: H 4, Dh 512, G 2 (K 1024), N 256, 128 x 128 blocks."""
    w, ws = make_weight(512, 1024, 128, rng)
    o = bf16_o((5, 4, 512), rng)
    pos = _positions(rng, 5, small_table[0].shape[0])
    return o, pos, small_table, w, ws


def test_chain_is_quant_then_gemm_and_jit_matches_eager(small_case):
    o, pos, (cos, sin), w, ws = small_case
    c16, s16 = cos.astype(jnp.bfloat16), sin.astype(jnp.bfloat16)
    y = wo_a_fp8(o, pos, c16, s16, w, ws, 2)
    wg, wsg = wo_a_weight_e8m0(w, ws, 2)
    x, xs = inverse_rope_group_quant(o, pos, c16, s16, 2, 128)
    assert_bitwise_equal(y, batched_gemm_a8w8_mxscale(x, wg, xs, wsg))
    assert_bitwise_equal(jit_fp8(o, pos, c16, s16, w, ws, 2), y)
    yf = wo_a_fp8(o, pos, c16, s16, w, ws, 2, dtype=jnp.float32, semantics="unfused")
    assert yf.dtype == jnp.float32
    assert_bitwise_equal(jit_fp8(o, pos, c16, s16, w, ws, 2, dtype=jnp.float32,
                                 semantics="unfused"), yf)
    assert_bitwise_equal(jit_bf16(o, pos, cos, sin, w, ws, 2),
                         wo_a_bf16(o, pos, cos, sin, w, ws, 2))


def test_weight_split_follows_checkpoint_rows(small_case):
    """Row r = g*N + n of the [G*N, K] weight; scale row r div B = g*(N/B) + n div B."""
    *_, w, ws = small_case
    wg, wsg = wo_a_weight_e8m0(w, ws, 2)
    assert wg.shape == (2, 256, 1024) and wsg.shape == (2, 2, 8) and wsg.dtype == jnp.uint8
    assert_bitwise_equal(wg[1, 130], w[256 + 130])
    assert int(wsg[1, 1, 5]) == int(ws[2 + 1, 5])
    deq = dequant_wo_a_weight(w, ws, 2, dtype=jnp.float32)
    assert_bitwise_equal(deq, dequant_weight(wg, wsg))
    assert_bitwise_equal(dequant_wo_a_weight(w, ws, 2), deq.astype(jnp.bfloat16))  # exact


def test_float_checkpoint_scales(small_case):
    o, pos, (cos, sin), w, ws = small_case
    pow2 = np.exp2(ws.astype(np.float64) - 127).astype(F32)
    assert_bitwise_equal(wo_a_fp8(o, pos, cos, sin, w, pow2, 2),
                         wo_a_fp8(o, pos, cos, sin, w, ws, 2))
    assert_bitwise_equal(wo_a_bf16(o, pos, cos, sin, w, pow2, 2),
                         wo_a_bf16(o, pos, cos, sin, w, ws, 2))
    # E8M0-typed bytes, as the checkpoint stores them, are the same bytes.
    assert_bitwise_equal(wo_a_fp8(o, pos, cos, sin, w, ws.view(ml_dtypes.float8_e8m0fnu), 2),
                         wo_a_fp8(o, pos, cos, sin, w, ws, 2))
    # V4-Flash-Base style non-power-of-two scales: the FP8 chain refuses, BF16 and truth work.
    odd = pow2 * F32(0.75)
    with pytest.raises(ValueError, match=r"element \[0, 0\] = .* is not a power of two"):
        wo_a_fp8(o, pos, cos, sin, w, odd, 2)
    yb = wo_a_bf16(o, pos, cos, sin, w, odd, 2)
    assert_close(yb, wo_a_truth(o, pos, cos, sin, w, odd, 2), tolerance="bf16_chain_vs_truth")


def test_fnuz_weights_quantize_activations_in_fnuz(rng, make_weight, bf16_o, small_table):
    w, ws = make_weight(512, 1024, 128, rng, jnp.float8_e4m3fnuz)
    o = bf16_o((5, 4, 512), rng)
    pos = _positions(rng, 5, small_table[0].shape[0])
    cos, sin = small_table
    y = wo_a_fp8(o, pos, cos, sin, w, ws, 2)
    wg, wsg = wo_a_weight_e8m0(w, ws, 2)
    x, xs = inverse_rope_group_quant(o, pos, cos, sin, 2, 128, fp8_dtype=jnp.float8_e4m3fnuz)
    assert_bitwise_equal(y, batched_gemm_a8w8_mxscale(x, wg, xs, wsg))
    assert_close(y, wo_a_truth(o, pos, cos, sin, w, ws, 2), tolerance="fp8_chain_vs_bf16")


def test_empty_batch_chains(small_case):
    o, pos, (cos, sin), w, ws = small_case
    o0, p0 = o[:0], pos[:0]
    for f in (wo_a_fp8, wo_a_bf16, jit_fp8, jit_bf16):
        y = f(o0, p0, cos, sin, w, ws, 2)
        assert y.shape == (0, 2, 256) and y.dtype == jnp.bfloat16
    assert wo_a_truth(o0, p0, cos, sin, w, ws, 2).shape == (0, 2, 256)


def test_v41_block_32_chain_uses_32_wide_activation_groups(rng, make_weight, bf16_o, small_table):
    w, ws = make_weight(512, 1024, 32, rng)
    assert ws.shape == (16, 32)
    o = bf16_o((4, 4, 512), rng)
    pos = _positions(rng, 4, small_table[0].shape[0])
    cos, sin = small_table
    y = wo_a_fp8(o, pos, cos, sin, w, ws, 2)
    wg, wsg = wo_a_weight_e8m0(w, ws, 2)
    x, xs = inverse_rope_group_quant(o, pos, cos, sin, 2, 32)
    assert xs.shape == (4, 2, 32)
    assert_bitwise_equal(y, batched_gemm_a8w8_mxscale(x, wg, xs, wsg))
    e32 = relative_error(y, wo_a_truth(o, pos, cos, sin, w, ws, 2))
    assert e32 <= TOLERANCES["fp8_chain_vs_bf16"].rel


def test_truth_is_float64_and_unrounded(small_case):
    o, pos, (cos, sin), w, ws = small_case
    t = wo_a_truth(o, pos, cos, sin, w, ws, 2)
    assert t.dtype == np.float64
    yf = jit_bf16(o, pos, cos, sin, w, ws, 2)
    assert relative_error(yf, t) > 0  # the bf16 chain rounds; the truth does not


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        (lambda w, ws: (w[0], ws, 2), ValueError, r"weight must be 2-D \[G \* N, K\]"),
        (lambda w, ws: (w.astype(ml_dtypes.bfloat16), ws, 2), TypeError,
         "weight must have dtype float8_e4m3fn or float8_e4m3fnuz, got bfloat16"),
        (lambda w, ws: (w, ws, 3), ValueError,
         "weight rows 512 are not divisible by num_groups=3"),
        (lambda w, ws: (w, ws[:, :4], 2), ValueError,
         r"weight_scale \(4, 4\) does not tile weight \(512, 1024\) in 128x128 or 32x32 blocks"),
        (lambda w, ws: (w, ws[:3], 2), ValueError,
         "weight_scale has 3 rows; a 512-row weight in 128x128 blocks needs 4"),
        (lambda w, ws: (w, ws.astype(np.int32), 2), TypeError,
         "weight_scale must have dtype float8_e8m0fnu or uint8 or float32"),
        (lambda w, ws: (w, ws, 4), ValueError,
         r"o \[S, H, Dh\] = \(5, 4, 512\) gives G \* K = 2048, but the weight expects "
         r"num_groups \* K = 4 \* 1024 = 4096"),
    ],
)
def test_chain_errors(small_case, change, exc, match):
    o, pos, (cos, sin), w, ws = small_case
    w2, ws2, g = change(w, ws)
    for f in (wo_a_fp8, wo_a_bf16, wo_a_truth):
        with pytest.raises(exc, match=match):
            f(o, pos, cos, sin, w2, ws2, g)


@pytest.mark.parametrize("floor", [float("nan"), 0.0, -1e-8])
def test_fp8_chain_rejects_a_bad_amax_floor(small_case, floor):
    o, pos, (cos, sin), w, ws = small_case
    with pytest.raises(ValueError, match="amax_floor must be a finite number > 0"):
        wo_a_fp8(o, pos, cos, sin, w, ws, 2, amax_floor=floor)


def test_chains_take_the_checkpoint_tensors_by_name(small_case):
    o, pos, (cos, sin), w, ws = small_case
    kw = {"weight": w, "weight_scale": ws, "num_groups": 2}
    assert_bitwise_equal(wo_a_fp8(o, pos, cos, sin, **kw), wo_a_fp8(o, pos, cos, sin, w, ws, 2))
    assert_bitwise_equal(wo_a_bf16(o, pos, cos, sin, **kw), wo_a_bf16(o, pos, cos, sin, w, ws, 2))


def test_chain_rejects_o_of_the_wrong_rank(small_case):
    o, pos, (cos, sin), w, ws = small_case
    for f in (wo_a_fp8, wo_a_bf16, wo_a_truth):
        with pytest.raises(ValueError, match=r"o must be 3-D \[S, H, Dh\], got shape \(5, 2048\)"):
            f(o.reshape(5, -1), pos, cos, sin, w, ws, 2)
