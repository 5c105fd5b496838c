"""Block-scaled FP8 batched GEMM reference and weight dequantization (docs/NUMERICS.md 6, 8)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import checks
from ._spec import upcast_f32
from .quant import e8m0_decode


def _expand_weight_scale(w_scale_f32, n: int, k: int):
    """``[G, ceil(N/B), K/B]`` fp32 scales to ``[G, N, K]`` (ragged last N tile allowed)."""
    bk = k // w_scale_f32.shape[2]
    full = jnp.repeat(jnp.repeat(w_scale_f32, bk, axis=1), bk, axis=2)
    return full[:, :n, :]


def dequant_weight(w, w_scale, *, dtype=jnp.float32):
    """Exact dequantized weight ``fp8(w) * 2**(byte - 127)`` per block, ``[G, N, K]``.

    With E8M0 scales the product fits bf16 exactly, so ``dtype=jnp.bfloat16`` is lossless.
    """
    g, n, k = checks.check_rank(w, 3, "w", "[G, N, K]")
    ws = checks.check_rank(w_scale, 3, "w_scale", "[G, ceil(N / B), K / B]")
    block = k // ws[2] if ws[2] >= 1 and k % ws[2] == 0 else 0
    if block not in (32, 64, 128) or ws != (g, -(-n // block), ws[2]):
        raise ValueError(f"w_scale must be [G, ceil(N / B), K / B] with B in 32, 64, 128 for "
                         f"w [G, N, K] = {(g, n, k)}, got {ws}")
    s = e8m0_decode(w_scale)
    return (upcast_f32(w) * _expand_weight_scale(s, n, k)).astype(dtype)


def batched_gemm_a8w8_mxscale(x, w, x_scale, w_scale, dtype=jnp.bfloat16):
    """``y[m, g, n] = sum_k dq(x)[m, g, k] * dq(w)[g, n, k]``: fp32 accumulation, one rounding.

    Args:
      x: ``[M, G, K]`` fp8 (e4m3fn or e4m3fnuz) activations.
      w: ``[G, N, K]`` fp8 weight, same dtype as ``x``.
      x_scale: ``[M, G, K / B]`` E8M0 (uint8 or float8_e8m0fnu), 1 x B activation groups.
      w_scale: ``[G, ceil(N / B), K / B]`` E8M0, B x B weight blocks; B = 128 (V4) or 32 (V4.1).
      dtype: output dtype, bf16 (default) or fp32.

    Returns:
      ``[M, G, N]`` in ``dtype``. Operands are upcast exactly to fp32 and contracted with
      ``precision=HIGHEST``; summation order is the only freedom, so kernels agree with this to
      the output rounding (relative Frobenius error about 1.7e-3 for bf16), not bit for bit.

    Raises:
      ValueError: a rank or shape does not fit (the message names the operand and the shape
        expected).
      TypeError: a dtype does not fit; float ``w_scale`` points to ``e8m0_from_scale``.
    """
    m, g, n, k, _ = checks.check_gemm_inputs(x, w, x_scale, w_scale)
    if np.dtype(dtype) not in (np.dtype(jnp.bfloat16), np.dtype(jnp.float32)):
        raise TypeError(f"dtype must be bfloat16 or float32, got {np.dtype(dtype).name}")
    xs = e8m0_decode(x_scale)
    bk = k // xs.shape[-1]
    xd = (upcast_f32(x).reshape(m, g, k // bk, bk) * xs[..., None]).reshape(m, g, k)
    wd = dequant_weight(w, w_scale)
    y = jnp.einsum("mgk,gnk->mgn", xd, wd, precision=jax.lax.Precision.HIGHEST,
                   preferred_element_type=jnp.float32)
    return y.astype(dtype)


def batched_gemm_float64(x, w, x_scale, w_scale) -> np.ndarray:
    """The same product in numpy float64 (test reference; exact up to float64 summation)."""
    checks.check_gemm_inputs(x, w, x_scale, w_scale)
    xs = np.asarray(e8m0_decode(x_scale), np.float64)
    bk = x.shape[2] // xs.shape[-1]
    xd = np.asarray(x.astype(jnp.float32), np.float64)
    xd = (xd.reshape(*xd.shape[:2], xs.shape[-1], bk) * xs[..., None]).reshape(xd.shape)
    wd = np.asarray(dequant_weight(w, w_scale), np.float64)
    return np.einsum("mgk,gnk->mgn", xd, wd)
