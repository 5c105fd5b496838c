"""The two full ``wo_a`` chains (BF16 reference and FP8 fast path) and a float64 truth."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import checks
from ._spec import AITER_AMAX_FLOOR, QuantSemantics
from .gemm import batched_gemm_a8w8_mxscale
from .quant import e8m0_bytes, e8m0_decode, e8m0_from_scale, inverse_rope_group_quant
from .rope import inverse_rope, inverse_rope_float64


def check_wo_a_weight(weight, weight_scale, num_groups: int) -> tuple[int, int, int]:
    """Validate a checkpoint ``wo_a`` weight's shapes and dtypes; return ``(N, K, block)``.

    Only ``.shape`` and ``.dtype`` are read (works under ``jax.jit`` and on torch tensors);
    ``checks.check_wo_a_weight_values`` inspects the values.

    Args:
      weight: ``[G * N, K]`` fp8.
      weight_scale: ``[ceil(G * N / B), K / B]`` E8M0 bytes or float scales, B in {32, 128}.
      num_groups: G.

    Raises:
      ValueError: a rank or shape does not fit, or G does not divide the rows.
      TypeError: a dtype does not fit, or ``num_groups`` is not an integer.
    """
    rows, k, srows, block = checks.check_weight_blocks(
        weight, weight_scale, ("weight", "weight_scale"), ("[G * N, K]", "[G * N / B, K / B]"))
    if rows % checks.check_int(num_groups, "num_groups") != 0:
        raise ValueError(f"weight rows {rows} are not divisible by num_groups={num_groups}")
    if srows != -(-rows // block):
        raise ValueError(
            f"weight_scale has {srows} rows; a {rows}-row weight in {block}x{block} blocks needs "
            f"{-(-rows // block)}"
        )
    return rows // num_groups, k, block


def _weight_scale_f32(weight_scale):
    if checks.dtype_name(weight_scale) in checks._FLOAT_SCALES:
        return jnp.asarray(weight_scale, jnp.float32)
    return e8m0_decode(weight_scale)


def _dequant_2d(weight, weight_scale, block: int):
    """``[R, K]`` weight times its ``block x block`` scales (a ragged last row block is cut)."""
    s = _weight_scale_f32(weight_scale)
    full = jnp.repeat(jnp.repeat(s, block, axis=0), block, axis=1)[: weight.shape[0]]
    return weight.astype(jnp.float32) * full


def _scale_bytes(weight_scale):
    """Weight scales as E8M0 ``uint8`` bytes: float scales through the lossless (host-side)
    ``e8m0_from_scale``, ``float8_e8m0fnu`` re-viewed."""
    if checks.dtype_name(weight_scale) in checks._FLOAT_SCALES:
        weight_scale = e8m0_from_scale(weight_scale)
    return e8m0_bytes(weight_scale)


def dequant_wo_a_weight(weight, weight_scale, num_groups: int, *, dtype=jnp.bfloat16):
    """``[G*N, K]`` checkpoint weight to ``[G, N, K]`` in ``dtype``, per-block scale applied.

    Exact in bf16 for E8M0 scales; fp32 non-power-of-two scales (V4-Flash-Base) make the bf16
    rounding part of the result, as in the BF16 reference path.
    """
    n, k, block = check_wo_a_weight(weight, weight_scale, num_groups)
    return _dequant_2d(weight, weight_scale, block).astype(dtype).reshape(num_groups, n, k)


def wo_a_weight_e8m0(weight, weight_scale, num_groups: int):
    """Checkpoint weight and scale as the GEMM's ``w [G, N, K]`` and ``w_scale [G, N/B, K/B]``.

    Float scales go through the lossless ``e8m0_from_scale`` (host-side; raises on any scale that is
    not a power of two).
    """
    n, k, block = check_wo_a_weight(weight, weight_scale, num_groups)
    if n % block != 0:
        raise ValueError(f"N={n} is not a multiple of the {block}-row weight block")
    ws = _scale_bytes(weight_scale)
    return weight.reshape(num_groups, n, k), ws.reshape(num_groups, n // block, k // block)


def _group_view(o, num_groups: int):
    """``o [S, H, Dh]`` as ``[S, G, H * Dh / G]`` (callers ran ``_check_k`` first)."""
    s, h, dh = o.shape
    return o.reshape(s, num_groups, h * dh // num_groups)


def wo_a_bf16(o, positions, cos_cache, sin_cache, weight, weight_scale, num_groups: int):
    """The BF16 reference chain (vLLM ``rocm_inv_rope_einsum``; DeepSeek's own inference).

    Inverse RoPE in fp32 rounded to bf16, the weight dequantized to bf16 (exact for E8M0 scales),
    bf16 GEMM with fp32 accumulation, bf16 out. Upstream's BF16 path passes fp32 cos/sin. Float
    scales need not be powers of two here.

    Args:
      o: ``[S, H, Dh]`` bf16 attention output of the rank's H heads (rope tail rotated).
      positions: ``[S]`` int32/int64 token positions, clamped to ``[0, P - 1]``.
      cos_cache, sin_cache: ``[P, rd / 2]`` bf16 or fp32 rope tables (``rope_cos_sin``).
      weight: ``[G * N, K]`` fp8 checkpoint weight, groups stacked along rows, as stored.
      weight_scale: ``[ceil(G * N / B), K / B]`` scales of its ``B x B`` blocks (B = 128, or 32
        for V4.1) as stored: ``float8_e8m0fnu`` or ``uint8`` bytes, or float values.
      num_groups: G; ``H * Dh`` must equal ``G * K``.

    Returns:
      ``[S, G, N]`` bf16.

    Raises:
      ValueError, TypeError: a shape, rank or dtype does not fit (the message says which).
    """
    check_wo_a_weight(weight, weight_scale, num_groups)
    _check_k(o, weight, num_groups)
    x = inverse_rope(o, positions, cos_cache, sin_cache, out_dtype=jnp.bfloat16)
    w = dequant_wo_a_weight(weight, weight_scale, num_groups, dtype=jnp.bfloat16)
    y = jnp.einsum("sgk,gnk->sgn", _group_view(x, num_groups), w,
                   preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    return y.astype(jnp.bfloat16)


def wo_a_fp8(o, positions, cos_cache, sin_cache, weight, weight_scale, num_groups: int, *,
             amax_floor: float = AITER_AMAX_FLOOR,
             semantics: QuantSemantics | str = QuantSemantics.FUSED, dtype=jnp.bfloat16):
    """The FP8 chain: ``inverse_rope_group_quant`` then ``batched_gemm_a8w8_mxscale``.

    Takes the checkpoint's 2-D tensors exactly as ``wo_a_bf16`` does and views them as the GEMM's
    ``w [G, N, K]`` and ``w_scale [G, N / B, K / B]`` (``wo_a_weight_e8m0``). The activation quant
    group is the weight block B and the activation fp8 dtype is the weight's. AITER's semantics
    are bf16 cos/sin and ``amax_floor=1e-8``.

    Args:
      o, positions, cos_cache, sin_cache, weight, weight_scale, num_groups: as ``wo_a_bf16``.
      amax_floor: the quantizer's floor: 1e-8 (AITER) or 1e-10 (vLLM CUDA); finite and > 0.
      semantics: ``"fused"`` (fp32 rotation straight into the quantizer) or ``"unfused"``.
      dtype: output dtype, bf16 or fp32.

    Returns:
      ``[S, G, N]`` in ``dtype``.

    Raises:
      ValueError: a shape does not fit, ``amax_floor`` is not finite and > 0, ``N`` is not a
        multiple of B, or a float scale is not an exact power of two (use ``wo_a_bf16``).
      TypeError: a dtype does not fit.
    """
    checks.check_amax_floor(amax_floor)
    w, ws = wo_a_weight_e8m0(weight, weight_scale, num_groups)
    _check_k(o, weight, num_groups)
    block = weight.shape[1] // weight_scale.shape[1]
    x, xs = inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups, block,
                                     fp8_dtype=weight.dtype, amax_floor=amax_floor,
                                     semantics=semantics)
    return batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=dtype)


def wo_a_truth(o, positions, cos_cache, sin_cache, weight, weight_scale,
               num_groups: int) -> np.ndarray:
    """Exact math in numpy float64, no quantization or rounding: ``[S, G, N]`` float64.

    Same arguments as ``wo_a_bf16``.

    This is the yardstick for error measurement (``relative_error(y, truth)``), not an oracle for
    bytes.
    """
    n, k, block = check_wo_a_weight(weight, weight_scale, num_groups)
    _check_k(o, weight, num_groups)
    x = inverse_rope_float64(o, positions, cos_cache, sin_cache)
    s = np.asarray(_weight_scale_f32(weight_scale), np.float64)
    full = np.repeat(np.repeat(s, block, axis=0), block, axis=1)[: num_groups * n]
    w = (np.asarray(jnp.asarray(weight).astype(jnp.float32), np.float64) * full)
    w = w.reshape(num_groups, n, k)
    return np.einsum("sgk,gnk->sgn", _group_view(x, num_groups), w)


def _check_k(o, weight, num_groups: int) -> None:
    _, h, dh = checks.check_rank(o, 3, "o", "[S, H, Dh]")
    k = weight.shape[1]
    if h * dh != num_groups * k:
        raise ValueError(
            f"o [S, H, Dh] = {tuple(o.shape)} gives G * K = {h * dh}, but the weight expects "
            f"num_groups * K = {num_groups} * {k} = {num_groups * k}"
        )
