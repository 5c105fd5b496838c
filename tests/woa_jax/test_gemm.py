"""Block-scaled FP8 batched GEMM reference (docs/NUMERICS.md, "GEMM")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from woa_jax import (
    batched_gemm_a8w8_mxscale,
    batched_gemm_float64,
    dequant_weight,
    group_quant_e8m0,
    quantize_weight_blocks,
)
from woa_jax.testing import TOLERANCES, assert_bitwise_equal, assert_close, relative_error

F32 = np.float32
E4M3FN, E4M3FNUZ = jnp.float8_e4m3fn, jnp.float8_e4m3fnuz
jit_gemm = jax.jit(batched_gemm_a8w8_mxscale, static_argnames=("dtype",))


def _block_scaled_randn(rng, shape, block: int) -> np.ndarray:
    """AITER's GEMM test data: signed randn, each ``block``-wide K block times 2**randint(-4, 4)."""
    x = rng.standard_normal(shape, dtype=F32)
    e = rng.integers(-4, 5, size=(*shape[:-1], shape[-1] // block, 1))
    return x * np.exp2(e).astype(F32).repeat(block, -1).reshape(shape)


def _make_case(rng, m, g, n, k, block, fp8_dtype=E4M3FN):
    x, xs = group_quant_e8m0(_block_scaled_randn(rng, (m, g, k), block), block,
                             fp8_dtype=fp8_dtype)
    per_group = [quantize_weight_blocks(wg, block=block, fp8_dtype=fp8_dtype)
                 for wg in _block_scaled_randn(rng, (g, n, k), block)]
    w = np.stack([q for q, _ in per_group])
    ws = np.stack([sc for _, sc in per_group]).view(np.uint8)
    return np.asarray(x), np.asarray(xs).view(np.uint8), w, ws


def _loop_reference(x, w, xs, ws) -> np.ndarray:
    """Straight from the formula: per output, per K block, an exact fp8 dot times both scales."""
    m, g, k = x.shape
    n = w.shape[1]
    bk = k // xs.shape[2]
    xf, wf = x.astype(np.float64), w.astype(np.float64)
    y = np.zeros((m, g, n))
    for mi in range(m):
        for gi in range(g):
            for ni in range(n):
                acc = 0.0
                for kb in range(k // bk):
                    sl = slice(kb * bk, (kb + 1) * bk)
                    dot = float(np.dot(xf[mi, gi, sl], wf[gi, ni, sl]))  # exact in float64
                    acc += dot * 2.0 ** (int(xs[mi, gi, kb]) - 127) * 2.0 ** (
                        int(ws[gi, ni // bk, kb]) - 127)
                y[mi, gi, ni] = acc
    return y


@pytest.mark.parametrize("fp8_dtype", [E4M3FN, E4M3FNUZ], ids=["e4m3fn", "fnuz"])
@pytest.mark.parametrize(("block", "n", "k"), [(128, 130, 256), (32, 40, 128), (128, 128, 384)],
                         ids=["b128-ragged", "b32-ragged", "b128"])
def test_gemm_against_float64_and_a_loop(rng, block, n, k, fp8_dtype):
    x, xs, w, ws = _make_case(rng, 3, 2, n, k, block, fp8_dtype)
    assert ws.shape == (2, -(-n // block), k // block)
    y64 = batched_gemm_float64(x, w, xs, ws)
    np.testing.assert_allclose(y64, _loop_reference(x, w, xs, ws), rtol=1e-12, atol=0)

    y32 = batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=jnp.float32)
    assert y32.shape == (3, 2, n) and y32.dtype == jnp.float32
    assert_close(y32, y64, tolerance="gemm_fp32")
    # Elementwise: fp32 accumulation error is bounded by K ulps of the sum of |terms|.
    xd = x.astype(np.float64) * np.exp2(xs.astype(np.float64) - 127).repeat(block, -1)
    wd = np.asarray(dequant_weight(w, ws), np.float64)
    bound = k * 2.0**-24 * np.einsum("mgk,gnk->mgn", np.abs(xd), np.abs(wd))
    assert (np.abs(np.asarray(y32, np.float64) - y64) <= bound).all()

    y16 = batched_gemm_a8w8_mxscale(x, w, xs, ws)  # default bf16
    assert y16.dtype == jnp.bfloat16
    # One final rounding of the fp32 accumulation.
    assert_bitwise_equal(y16, np.asarray(y32).astype(ml_dtypes.bfloat16))
    err = assert_close(y16, y64, tolerance="gemm_bf16")
    print(f"block {block} N {n} K {k} {np.dtype(fp8_dtype).name}: bf16 out rel err {err:.2e}, "
          f"fp32 out {relative_error(y32, y64):.2e}")


def test_e8m0_typed_scales_equal_uint8_scales(rng):
    x, xs, w, ws = _make_case(rng, 2, 2, 64, 64, 32)
    e8 = ml_dtypes.float8_e8m0fnu
    a = batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=jnp.float32)
    b = batched_gemm_a8w8_mxscale(x, w, xs.view(e8), jnp.asarray(ws).view(jnp.float8_e8m0fnu),
                                  dtype=jnp.float32)
    assert_bitwise_equal(a, b)


def test_a_wrong_scale_is_detected(rng):
    """The tolerance is tight enough that one E8M0 step in one weight tile fails it."""
    x, xs, w, ws = _make_case(rng, 4, 2, 256, 512, 128)
    y64 = batched_gemm_float64(x, w, xs, ws)
    bad = ws.copy()
    bad[1, 1, 2] += 1
    err = relative_error(batched_gemm_a8w8_mxscale(x, w, xs, bad), y64)
    assert err > 10 * TOLERANCES["gemm_bf16"].rel


def test_gemm_under_jit_and_empty_batch(rng):
    x, xs, w, ws = _make_case(rng, 5, 2, 130, 256, 128)
    for dtype in (jnp.bfloat16, jnp.float32):
        assert_bitwise_equal(jit_gemm(x, w, xs, ws, dtype=dtype),
                             batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=dtype))
    for f in (batched_gemm_a8w8_mxscale, jit_gemm):
        y = f(x[:0], w, xs[:0], ws)
        assert y.shape == (0, 2, 130) and y.dtype == jnp.bfloat16
    assert batched_gemm_float64(x[:0], w, xs[:0], ws).shape == (0, 2, 130)


def test_dequant_weight_is_exact_and_fits_bf16(rng):
    _, _, w, ws = _make_case(rng, 1, 2, 130, 256, 128)
    full = np.exp2(ws.astype(np.float64) - 127).repeat(128, 1).repeat(128, 2)[:, :130]
    expect = w.astype(np.float64) * full
    np.testing.assert_array_equal(np.asarray(dequant_weight(w, ws), np.float64), expect)
    np.testing.assert_array_equal(
        np.asarray(dequant_weight(w, ws, dtype=jnp.bfloat16)).astype(np.float64), expect)


def _ops():
    x = np.zeros((2, 3, 256), ml_dtypes.float8_e4m3fn)
    w = np.zeros((3, 130, 256), ml_dtypes.float8_e4m3fn)
    return x, w, np.zeros((2, 3, 2), np.uint8), np.zeros((3, 2, 2), np.uint8)


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        (lambda x, w, xs, ws: (x[0], w, xs, ws), ValueError,
         r"x must be 3-D \[M, G, K\], got shape \(3, 256\)"),
        (lambda x, w, xs, ws: (x.astype(F32), w, xs, ws), TypeError,
         "x must have dtype float8_e4m3fn or float8_e4m3fnuz, got float32"),
        (lambda x, w, xs, ws: (x, w.astype(ml_dtypes.float8_e4m3fnuz), xs, ws), TypeError,
         "x and w must share one fp8 dtype, got float8_e4m3fn and float8_e4m3fnuz"),
        (lambda x, w, xs, ws: (x, w[:2], xs, ws), ValueError,
         r"w \[G, N, K\] = \(2, 130, 256\) does not match x \[M, G, K\] = \(2, 3, 256\)"),
        (lambda x, w, xs, ws: (x, w, xs.astype(F32), ws), TypeError,
         "x_scale must have dtype uint8 or float8_e8m0fnu, got float32"),
        (lambda x, w, xs, ws: (x, w, xs[:, :, :1].repeat(3, 2), ws), ValueError,
         r"x_scale must be \[M, G, K / block\] with block dividing K=256, got \(2, 3, 3\)"),
        (lambda x, w, xs, ws: (x, w, xs[:, :, :1].repeat(16, 2), ws), ValueError,
         r"scale block K / x_scale.shape\[2\] = 16; expected 32, 64 or 128"),
        (lambda x, w, xs, ws: (x, w, xs, ws[:, :1]), ValueError,
         r"w_scale must be \[G, ceil\(N / 128\), K / 128\] = \(3, 2, 2\), got \(3, 1, 2\)"),
        (lambda x, w, xs, ws: (x, w, xs, ws[0]), ValueError,
         r"w_scale must be 3-D \[G, N / block, K / block\], got shape \(2, 2\)"),
    ],
)
def test_gemm_errors(change, exc, match):
    args = change(*_ops())
    with pytest.raises(exc, match=match):
        batched_gemm_a8w8_mxscale(*args)
    with pytest.raises(exc, match=match):
        batched_gemm_float64(*args)


def test_gemm_output_dtype_error():
    with pytest.raises(TypeError, match="dtype must be bfloat16 or float32, got float16"):
        batched_gemm_a8w8_mxscale(*_ops(), dtype=jnp.float16)


def test_dequant_weight_rejects_a_scale_that_does_not_tile_w():
    w = np.zeros((2, 130, 256), ml_dtypes.float8_e4m3fn)
    for ws in (np.zeros((2, 1, 2), np.uint8), np.zeros((2, 3, 2), np.uint8),
               np.zeros((2, 2, 3), np.uint8)):
        with pytest.raises(ValueError, match=r"w_scale must be \[G, ceil\(N / B\), K / B\] with B "
                                             r"in 32, 64, 128 for w \[G, N, K\] = \(2, 130, 256\)"):
            dequant_weight(w, ws)
    with pytest.raises(ValueError, match=r"w_scale must be 3-D"):
        dequant_weight(w, np.zeros((2, 2), np.uint8))


def test_float_weight_scales_point_to_the_lossless_converter():
    x, w, xs, ws = _ops()
    with pytest.raises(TypeError, match=r"w_scale must have dtype uint8 or float8_e8m0fnu, got "
                                        r"float32; .* losslessly with woa_jax.e8m0_from_scale"):
        batched_gemm_a8w8_mxscale(x, w, xs, ws.astype(F32))
