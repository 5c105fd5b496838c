"""Per-token 1 x GS E8M0 (round-up power-of-two) FP8 group quantization (docs/NUMERICS.md 4, 5)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from . import checks
from ._spec import (
    AITER_AMAX_FLOOR,
    QuantSemantics,
    as_enum,
    check_fp8_dtype,
    e8m0_bytes_of_floats,
    fp8_max,
    fp8_max_reciprocal,
    upcast_f32,
)
from .rope import _rotate


def e8m0_decode(scale_bytes):
    """E8M0 bytes (uint8 or float8_e8m0fnu) to the fp32 scale ``2**(b - 127)`` by bit shift.

    Byte 0 decodes to +0.0 and 255 to +inf (the in-kernel decode; ml_dtypes gives 2**-127 and NaN
    there). Real data never reaches either end.
    """
    b = e8m0_bytes(scale_bytes).astype(jnp.uint32)
    return jax.lax.bitcast_convert_type(b << 23, jnp.float32)


def e8m0_bytes(scale):
    """E8M0 scales (uint8 or float8_e8m0fnu) as a ``uint8`` JAX array, under ``jax.jit`` too
    (kernels take no float8_e8m0fnu pointers). Float scales are converted first, at load, by
    ``e8m0_from_scale``; here they are a ``TypeError``."""
    name = checks.dtype_name(scale)
    if name == "float8_e8m0fnu":
        return jax.lax.bitcast_convert_type(jnp.asarray(scale), jnp.uint8)
    if name == "uint8":
        return jnp.asarray(scale)
    raise TypeError(f"E8M0 scales must be uint8 or float8_e8m0fnu, got {name}")


def e8m0_scale(amax, *, fp8_dtype=jnp.float8_e4m3fn, amax_floor: float = AITER_AMAX_FLOOR):
    """The round-up power-of-two scale of a group with absolute maximum ``amax``.

    Bit-exact with AITER's ``fp_f32_to_e8m0_scale<RoundUp>``: ``x = fp32(max(amax, floor) *
    fp32(1 / fp8_max))``, take x's biased exponent and add one when its mantissa is non-zero.

    Args:
      amax: fp32 array of group absolute maxima (any shape). NaN is treated like AITER's ``fmaxf``
        reduction: it is ignored and the floor applies. ``+inf`` gives byte 255 (E8M0 NaN).
      fp8_dtype: ``float8_e4m3fn`` (max 448) or ``float8_e4m3fnuz`` (max 240).
      amax_floor: 1e-8 (AITER, zero group -> byte 92) or 1e-10 (vLLM CUDA, -> 85).

    Returns:
      ``(dq_scale fp32, byte uint8)`` with ``dq_scale = 2**(byte - 127)`` (byte 255 -> +inf).

    Raises:
      ValueError: ``amax_floor`` is not a finite number > 0.
    """
    check_fp8_dtype(fp8_dtype)
    floor = checks.check_amax_floor(amax_floor)
    amax = jnp.asarray(amax, jnp.float32)
    amax = jnp.fmax(amax, jnp.float32(floor))
    x = amax * fp8_max_reciprocal(fp8_dtype)
    u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    exp = (u >> 23) & 0xFF
    bump = (exp < 0xFF) & ((u & 0x7FFFFF) != 0)
    byte = (exp + bump.astype(jnp.uint32)).astype(jnp.uint8)
    return e8m0_decode(byte), byte


def group_quant_e8m0(x, group_size: int = 128, *, fp8_dtype=jnp.float8_e4m3fn,
                     amax_floor: float = AITER_AMAX_FLOOR):
    """Quantize ``x [..., K]`` in 1 x ``group_size`` groups along the last axis.

    The round-up scale keeps ``|q| <= fp8_max``, so nothing saturates; the clamp before the cast
    is a no-op on the bytes, kept because library casts return NaN above the range
    (docs/NUMERICS.md section 5).

    Args:
      x: ``[..., K]`` float values (widened to fp32).
      group_size: GS, the group width; must divide K.
      fp8_dtype: ``float8_e4m3fn`` or ``float8_e4m3fnuz``.
      amax_floor: 1e-8 (AITER) or 1e-10 (vLLM CUDA); finite and > 0.

    Returns:
      ``(q [..., K] fp8_dtype, scale [..., K / GS] float8_e8m0fnu)`` with
      ``q = RNE(x * 2**(127 - byte))``.

    Raises:
      ValueError: ``group_size`` is not a positive integer dividing K, or a bad ``amax_floor``.
      TypeError: ``fp8_dtype`` is not an e4m3 type.
    """
    fp8 = check_fp8_dtype(fp8_dtype)
    checks.check_amax_floor(amax_floor)
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    k = x.shape[-1]
    if k % group_size != 0:
        raise ValueError(f"last dim {k} is not a multiple of group_size={group_size}")
    xf = jnp.asarray(x, jnp.float32)
    g = xf.reshape(*xf.shape[:-1], k // group_size, group_size)
    amax = jnp.nanmax(jnp.abs(g), axis=-1)
    _, byte = e8m0_scale(amax, fp8_dtype=fp8, amax_floor=amax_floor)
    # 2**(127 - byte) as fp32 bits, exact. Finite groups give bytes <= 248, so the clip (which
    # keeps the shift a normal number) never binds; byte 255 (an inf lane) makes the payload NaN.
    inv = jax.lax.bitcast_convert_type((254 - byte.astype(jnp.int32)).clip(1, 254) << 23,
                                       jnp.float32)
    inv = jnp.where(byte == 0xFF, jnp.float32(jnp.nan), inv)
    m = fp8_max(fp8)
    q = jnp.clip(g * inv[..., None], -m, m).astype(fp8).reshape(xf.shape)
    return q, jax.lax.bitcast_convert_type(byte, jnp.float8_e8m0fnu)


def group_dequant_e8m0(q, scale):
    """``q [..., K]`` fp8 times its ``[..., K / GS]`` E8M0 scales, as fp32 (exact)."""
    s = e8m0_decode(scale)
    gs = q.shape[-1] // s.shape[-1]
    qf = upcast_f32(q).reshape(*q.shape[:-1], s.shape[-1], gs)
    return (qf * s[..., None]).reshape(q.shape)


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups: int,
                             quant_group_size: int = 128, *, fp8_dtype=jnp.float8_e4m3fn,
                             amax_floor: float = AITER_AMAX_FLOOR,
                             semantics: QuantSemantics | str = QuantSemantics.FUSED):
    """Inverse RoPE fused with per-token 1 x GS E8M0 FP8 quantization (AITER's op).

    Args:
      o: ``[S, H, Dh]`` bf16 attention output (RoPE-rotated tail of ``rd`` lanes per head).
      positions: ``[S]`` int32/int64 (clamped to ``[0, P - 1]`` like AITER).
      cos_cache, sin_cache: ``[P, rd / 2]``; AITER uses ``o``'s dtype (bf16), vLLM fp32.
      num_groups: G; each group is ``H / G`` consecutive heads, ``D = H * Dh / G`` lanes.
      quant_group_size: GS in {32, 64, 128}; must divide D.
      fp8_dtype: ``float8_e4m3fn`` (gfx950, Hopper) or ``float8_e4m3fnuz`` (gfx942).
      amax_floor: 1e-8 (AITER) or 1e-10 (vLLM CUDA).
      semantics: ``"fused"`` keeps the rotation in fp32 up to the quantizer (AITER's op);
        ``"unfused"`` rounds the rotated lanes to ``o.dtype`` first.

    Raises:
      ValueError: a rank or shape does not fit, G does not split ``H * Dh`` into whole quant
        groups, or a bad ``amax_floor``/``semantics`` (the message names which).
      TypeError: a dtype does not fit.

    Returns:
      ``(x_fp8 [S, G, D] fp8_dtype, x_scale [S, G, D / GS] float8_e8m0fnu)`` in the row layout.
    """
    s, h, dh, _ = checks.check_rope_inputs(o, positions, cos_cache, sin_cache)
    d = checks.check_group_split(s, h, dh, num_groups, quant_group_size)
    mode = as_enum(QuantSemantics, semantics, "semantics")
    checks.check_amax_floor(amax_floor)
    rotated = _rotate(o, positions[:s], cos_cache, sin_cache, sign=-1)
    if mode is QuantSemantics.UNFUSED:
        rotated = upcast_f32(rotated.astype(o.dtype))
    return group_quant_e8m0(rotated.reshape(s, num_groups, d), quant_group_size,
                            fp8_dtype=fp8_dtype, amax_floor=amax_floor)


def e8m0_from_scale(weight_scale):
    """Checkpoint weight scales to E8M0 bytes, losslessly, or a ``ValueError``.

    * ``float8_e8m0fnu`` or ``uint8``: the bytes pass through unchanged.
    * fp32/fp16/bf16/fp64: every element must be finite, positive and an exact power of two with
      ``log2(s) + 127`` in ``[0, 254]``; the first offending element is named. Never rounds.
    * any other dtype: ``TypeError``.

    Host-side (numpy) because it inspects values; call it at load, not under ``jax.jit``.

    Args:
      weight_scale: checkpoint block scales of any shape (numpy, JAX or ml_dtypes array).

    Returns:
      numpy ``uint8`` array of the input's shape, C-contiguous.

    Raises:
      ValueError: a float scale is not finite, positive and an exact power of two in range.
      TypeError: a dtype that cannot hold E8M0 values losslessly.
    """
    name = checks.dtype_name(weight_scale)
    arr = np.asarray(weight_scale)
    if name in ("float8_e8m0fnu", "uint8"):
        return np.ascontiguousarray(arr.view(np.uint8))
    if name not in ("float32", "float64", "float16", "bfloat16"):
        raise TypeError(
            f"weight scale dtype {name} cannot be converted losslessly to E8M0; expected "
            "float8_e8m0fnu, uint8 or a float dtype holding powers of two"
        )
    f = arr.astype(np.float64)
    byte, ok = e8m0_bytes_of_floats(f)
    if not ok.all():
        idx = tuple(int(i) for i in np.argwhere(~ok)[0])
        v = f[idx]
        why = ("not finite" if not np.isfinite(v) else "not positive" if v <= 0
               else "outside the E8M0 range" if np.frexp(v)[0] == 0.5 else "not a power of two")
        raise ValueError(
            f"weight scale is not losslessly representable as E8M0: element {list(idx)} = "
            f"{float(v)!r} is {why}; rounding would change the weights, so this checkpoint needs "
            "the BF16 path"
        )
    return np.ascontiguousarray(byte.astype(np.uint8))


def quantize_weight_blocks(w, *, block: int = 128, fp8_dtype=ml_dtypes.float8_e4m3fn):
    """Quantize a real weight ``[R, K]`` the way DeepSeek checkpoints store it.

    Each ``block x block`` tile (ragged last tiles allowed) gets the round-up power-of-two scale
    of its absolute maximum, by the same rule as the activation quantizer (``e8m0_scale``), and
    the payload is ``RNE(w / scale)``. A weight that is already fp8 values times one power of two
    per tile comes back unchanged through ``dequant_wo_a_weight``: the chosen scale never exceeds
    the tile's own, so dividing by it only shifts exponents.

    Host-side (numpy); call it when building weights, not under ``jax.jit``.

    Args:
      w: ``[R, K]`` real-valued weight (any float dtype: numpy, JAX or ml_dtypes).
      block: tile edge B: 128 (V4) or 32 (V4.1); 64 is accepted too.
      fp8_dtype: ``float8_e4m3fn`` (max 448) or ``float8_e4m3fnuz`` (max 240).

    Returns:
      ``(weight [R, K] fp8_dtype, weight_scale [ceil(R / B), ceil(K / B)] float8_e8m0fnu)``
      as numpy arrays; ``weight_scale.view(np.uint8)`` gives the raw bytes.

    Raises:
      ValueError: ``w`` is not 2-D, ``block`` is not 32, 64 or 128, or an element is not finite.
      TypeError: ``w`` is not a float array, or ``fp8_dtype`` is not an e4m3 type.
    """
    fp8 = check_fp8_dtype(fp8_dtype)
    if block not in (32, 64, 128):
        raise ValueError(f"block must be 32, 64 or 128, got {block!r}")
    checks.check_rank(w, 2, "w", "[R, K]")
    checks.check_dtype(w, ("bfloat16", "float16", "float32", "float64"), "w")
    wf = np.asarray(w).astype(np.float32)
    bad = ~np.isfinite(wf)
    if bad.any():
        idx = [int(i) for i in np.argwhere(bad)[0]]
        raise ValueError(f"w: element {idx} = {float(wf[tuple(idx)])!r}; expected finite values")
    q, byte = quantize_blocks(wf, block, fp8)
    return np.asarray(q), np.asarray(byte).view(ml_dtypes.float8_e8m0fnu)


@functools.partial(jax.jit, static_argnums=(1, 2))
def quantize_blocks(w, block: int, fp8_dtype):
    """``quantize_weight_blocks`` without its checks, under ``jax.jit`` on ``w``'s device.

    For weights built where they are used (``examples.inputs_from_draws``): ``w`` is a finite
    fp32 ``[R, K]`` array, ``block`` and ``fp8_dtype`` valid. Returns ``(q fp8, byte uint8)``.
    """
    rows, k = w.shape
    rb, kb = -(-rows // block), -(-k // block)
    tiles = jnp.pad(jnp.abs(w), ((0, rb * block - rows), (0, kb * block - k)))
    amax = tiles.reshape(rb, block, kb, block).max(axis=(1, 3))
    byte = e8m0_scale(amax, fp8_dtype=fp8_dtype)[1]
    # Finite tiles get bytes in [92, 248], so 2**(127 - byte) is a normal fp32 number: exact.
    inv = jax.lax.bitcast_convert_type((254 - byte.astype(jnp.int32)) << 23, jnp.float32)
    inv = jnp.repeat(jnp.repeat(inv, block, 0), block, 1)[:rows, :k]
    m = jnp.float32(fp8_max(fp8_dtype))
    return jnp.clip(w * inv, -m, m).astype(fp8_dtype), byte
