"""woa_jax.wo_b: the FP8 path is the 1 x B quant then a one-group block-scaled GEMM, the BF16
path the exact dequantized weight; both validate the weight and their options first."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from woa_jax import batched_gemm_float64, dequant_weight, e8m0_decode, group_quant_e8m0, wo_b
from woa_jax.testing import assert_bitwise_equal, assert_close


def _wo_b_inputs(seed=1, t=16, hidden=256, k=512):
    rng = np.random.default_rng(seed)
    z = jnp.asarray(rng.standard_normal((t, k), dtype=np.float32) * 0.1, jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((hidden, k), dtype=np.float32).astype(
        ml_dtypes.float8_e4m3fn))
    s = jnp.asarray(rng.integers(118, 123, (hidden // 128, k // 128), dtype=np.uint8))
    return z, w, s


def test_wo_b_fp8_is_quant_then_one_group_gemm():
    z, w, s = _wo_b_inputs()
    y = jax.jit(wo_b.wo_b_fp8)(z, w, s)
    assert y.dtype == jnp.float32 and y.shape == (16, 256)
    q, qs = group_quant_e8m0(z, 128)
    truth = batched_gemm_float64(q[:, None], w[None], qs[:, None], s[None])[:, 0]
    assert_close(y, truth, tolerance="gemm_fp32", name="wo_b_fp8")
    assert wo_b.wo_b_fp8(z, w, s, dtype=jnp.bfloat16).dtype == jnp.bfloat16


def test_wo_b_paths_agree_and_float_scales_are_lossless():
    z, w, s = _wo_b_inputs()
    y8 = wo_b.wo_b_fp8(z, w, s)
    y16 = wo_b.wo_b_bf16(z, w, s)
    wd = np.asarray(dequant_weight(w[None], s[None])[0], np.float64)  # exact in fp32
    truth = np.asarray(z.astype(jnp.float32), np.float64) @ wd.T
    assert_close(y16, truth, tolerance="gemm_fp32", name="wo_b_bf16 vs truth")
    assert_close(y8, truth, tolerance="fp8_chain_vs_bf16", name="wo_b_fp8 vs truth")
    sf = np.asarray(e8m0_decode(s))  # the same scales as fp32 powers of two
    assert_bitwise_equal(wo_b.wo_b_fp8(z, w, sf), y8)
    assert_bitwise_equal(wo_b.wo_b_bf16(z, w, sf), y16)


def test_wo_b_fp8_rejects_non_power_of_two_scales():
    z, w, s = _wo_b_inputs()
    sf = np.asarray(e8m0_decode(s)) * np.float32(0.75)
    with pytest.raises(ValueError, match="not losslessly representable as E8M0"):
        wo_b.wo_b_fp8(z, w, sf)


def test_wo_b_shape_errors():
    z, w, s = _wo_b_inputs()
    with pytest.raises(ValueError, match=r"does not match wo_b's 512 input columns"):
        wo_b.wo_b_fp8(z[:, :384], w, s)
    with pytest.raises(ValueError, match=r"wo_b weight must be 2-D \[hidden, G \* N\]"):
        wo_b.wo_b_fp8(z, w[None], s)
    with pytest.raises(ValueError, match="hidden=200 must be a multiple of the 128-wide block"):
        wo_b.wo_b_bf16(z, w[:200], s)
    with pytest.raises(TypeError, match="wo_b weight must have dtype"):
        wo_b.wo_b_bf16(z, w.astype(jnp.bfloat16), s)


@pytest.mark.parametrize("floor", [float("nan"), 0.0, -1.0, float("inf")])
def test_wo_b_fp8_checks_the_amax_floor_first(floor):
    """No tensor is needed to see the error."""
    with pytest.raises(ValueError, match="amax_floor must be a finite number > 0"):
        wo_b.wo_b_fp8(None, None, None, amax_floor=floor)
