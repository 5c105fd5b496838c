"""DeepSeek V4's ``wo_b``: ``z [T, K'] -> [T, hidden]`` (``K' = G * N``), the projection after
``wo_a``, on FP8 or BF16 numerics.

The FP8 path quantizes ``z`` per row in 1 x B E8M0 groups (``group_quant_e8m0``, the fp32 value of
each element) and runs ``batched_gemm_a8w8_mxscale`` with one group against the B x B block-scaled
weight; the BF16 path multiplies bf16 ``z`` by the exact BF16 dequantized weight with fp32
accumulation. Both return fp32 by default: under tensor parallelism ``wo_b`` gives a partial sum
(``woa_jax.tp``), which must not be rounded before the reduction.
"""

from __future__ import annotations

import enum

import jax
import jax.numpy as jnp

from . import checks
from ._spec import AITER_AMAX_FLOOR
from .gemm import batched_gemm_a8w8_mxscale
from .quant import group_quant_e8m0
from .woa import _dequant_2d, _scale_bytes


class ProjectionPath(str, enum.Enum):
    """Which numerics a projection uses.

    ``FP8``: 1 x B E8M0 activation quant and the block-scaled FP8 GEMM (the fast path).
    ``BF16``: exact BF16 dequantized weight, bf16 GEMM with fp32 accumulation (the fallback).
    """

    FP8 = "fp8"
    BF16 = "bf16"


def check_wo_b_weight(weight, weight_scale) -> tuple[int, int, int]:
    """Validate a checkpoint ``wo_b`` weight ``[hidden, G * N]`` and scale; return
    ``(hidden, in_features, block)``.

    Both dimensions must be whole blocks: the row-parallel split cuts the input columns at block
    boundaries and the GEMM's weight tiles are square.
    """
    hidden, k, srows, block = checks.check_weight_blocks(
        weight, weight_scale, ("wo_b weight", "wo_b weight_scale"),
        ("[hidden, G * N]", "[hidden / B, G * N / B]"))
    if hidden % block != 0 or srows != hidden // block:
        raise ValueError(
            f"wo_b weight {(hidden, k)} with scale {(srows, k // block)}: hidden={hidden} must be "
            f"a multiple of the {block}-wide block and the scale must have hidden / {block} rows"
        )
    return hidden, k, block


def wo_b_weight_e8m0(weight, weight_scale):
    """``wo_b`` as the GEMM's one-group operands.

    Returns ``w [1, hidden, K']`` and ``w_scale [1, hidden / B, K' / B]`` uint8.

    Float scales go through the lossless ``e8m0_from_scale`` (host-side; raises on any scale that is
    not a power of two, which then needs the BF16 path).
    """
    hidden, k, block = check_wo_b_weight(weight, weight_scale)
    ws = _scale_bytes(weight_scale)
    return weight.reshape(1, hidden, k), ws.reshape(1, hidden // block, k // block)


def _check_z(z, in_features: int) -> int:
    t, k = checks.check_rank(z, 2, "z", "[T, G * N]")
    checks.check_dtype(z, ("bfloat16", "float16", "float32"), "z")
    if k != in_features:
        raise ValueError(
            f"z [T, G * N] = {(t, k)} does not match wo_b's {in_features} input columns"
        )
    return t


def wo_b_fp8(z, weight, weight_scale, *, amax_floor: float = AITER_AMAX_FLOOR,
             dtype=jnp.float32):
    """FP8 ``wo_b``: 1 x B E8M0 quant of ``z`` (fp32 of its values), then the block-scaled GEMM.

    The GEMM is ``batched_gemm_a8w8_mxscale`` with one group: ``x [T, 1, K']`` against
    ``w [1, hidden, K']``.

    Args:
      z: ``[T, K']`` activations (``wo_a``'s bf16 output flattened, ``K' = G_l * N``).
      weight: ``[hidden, K']`` fp8 (this rank's column slice under TP).
      weight_scale: ``[hidden / B, K' / B]`` E8M0/uint8 bytes or power-of-two float scales.
      amax_floor: the quantizer's floor, 1e-8 (AITER) or 1e-10 (vLLM CUDA).
      dtype: output dtype; fp32 (default) for a partial that will be summed, bf16 for a final value.

    Returns:
      ``[T, hidden]`` in ``dtype``.
    """
    checks.check_amax_floor(amax_floor)
    w, ws = wo_b_weight_e8m0(weight, weight_scale)
    block = weight.shape[1] // weight_scale.shape[1]
    _check_z(z, weight.shape[1])
    xq, xs = group_quant_e8m0(z, block, fp8_dtype=weight.dtype, amax_floor=amax_floor)
    return batched_gemm_a8w8_mxscale(xq[:, None], w, xs[:, None], ws, dtype=dtype)[:, 0]


def dequant_wo_b_weight(weight, weight_scale, *, dtype=jnp.bfloat16):
    """``[hidden, K']`` checkpoint weight times its block scales, in ``dtype`` (exact in bf16 for
    E8M0 scales)."""
    _, _, block = check_wo_b_weight(weight, weight_scale)
    return _dequant_2d(weight, weight_scale, block).astype(dtype)


def wo_b_bf16(z, weight, weight_scale, *, dtype=jnp.float32):
    """BF16 ``wo_b``: bf16 ``z`` times the exact BF16 dequantized weight, fp32 accumulation.

    Same arguments as ``wo_b_fp8``; returns ``[T, hidden]`` in ``dtype``.
    """
    w = dequant_wo_b_weight(weight, weight_scale)
    _check_z(z, weight.shape[1])
    y = jnp.einsum("tk,hk->th", z.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32,
                   precision=jax.lax.Precision.HIGHEST)
    return y.astype(dtype)
