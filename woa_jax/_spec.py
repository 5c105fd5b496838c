"""Constants, enums and small validators shared by the whole oracle."""

from __future__ import annotations

import enum

import jax.numpy as jnp
import ml_dtypes
import numpy as np

#: AITER's ``kAbsmaxFloor``: an all-zero group gets scale byte 92 (2**-35).
AITER_AMAX_FLOOR = 1e-8
#: vLLM's CUDA fused quant floor: an all-zero group gets scale byte 85 (2**-42).
CUDA_AMAX_FLOOR = 1e-10

#: Quant group width along K used by DeepSeek V4 (V4.1 uses 32x32 weight blocks and 1x32 groups).
QUANT_GROUP_SIZE = 128

E8M0_BIAS = 127
E8M0_NAN = 0xFF
#: The largest finite E8M0 byte, 2**127.
E8M0_MAX_FINITE = 0xFE


class ScaleLayout(str, enum.Enum):
    """Byte layout of the activation scales ``x_scale``.

    ``ROW`` is the logical ``[S, G, Ks]`` layout the GEMM consumes. ``MFMA_TILE`` and ``N32K4`` are
    the layouts of AITER main (``scale_layout=``); ``SCALE_SHUFFLE`` is the tile written by released
    AITER (v0.1.19.post1 .. v0.1.20.post1) with ``scale_shuffle=True``.
    """

    ROW = "row"
    MFMA_TILE = "mfma_tile"
    N32K4 = "n32k4"
    SCALE_SHUFFLE = "scale_shuffle"


class QuantSemantics(str, enum.Enum):
    """Whether the rotated rope lanes are rounded to ``o.dtype`` before quantization.

    ``FUSED`` (AITER's op, vLLM CUDA): the fp32 rotation feeds the quantizer directly.
    ``UNFUSED``: rotate, round to ``o.dtype``, then quantize (AITER oracle ``roundtrip=True``).
    """

    FUSED = "fused"
    UNFUSED = "unfused"


class RopeKind(str, enum.Enum):
    """Which rope table a layer uses (docs/NUMERICS.md section 2)."""

    #: Window-only layers and MTP: ``rope_theta`` 10000, no YaRN.
    WINDOW = "window"
    #: Compressed-attention layers: ``compress_rope_theta`` 160000 with YaRN factor 16.
    COMPRESS = "compress"


FP8_DTYPES = (jnp.float8_e4m3fn, jnp.float8_e4m3fnuz)


def fp8_max(fp8_dtype) -> float:
    """Largest finite value of ``fp8_dtype`` (448 for e4m3fn, 240 for e4m3fnuz), from finfo."""
    return float(ml_dtypes.finfo(check_fp8_dtype(fp8_dtype)).max)


def fp8_max_reciprocal(fp8_dtype) -> np.float32:
    """``fp32(1 / fp8_max)``: 0x3B124925 for e4m3fn, 0x3B888889 for e4m3fnuz."""
    return np.float32(1.0) / np.float32(fp8_max(fp8_dtype))


def fp8_min_normal_exp(fp8_dtype) -> int:
    """log2 of the smallest normal of ``fp8_dtype`` (-6 for e4m3fn, -7 for e4m3fnuz)."""
    return int(ml_dtypes.finfo(check_fp8_dtype(fp8_dtype)).minexp)


def check_fp8_dtype(fp8_dtype):
    dt = np.dtype(fp8_dtype)
    if dt not in [np.dtype(d) for d in FP8_DTYPES]:
        raise TypeError(
            f"fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz, got {dt.name}"
        )
    return dt


def as_enum(enum_type, value, what: str):
    """Coerce ``value`` to ``enum_type`` with an error naming the accepted values: ``TypeError``
    for a value that is not a string (or member), ``ValueError`` for an unknown string."""
    allowed = ", ".join(repr(m.value) for m in enum_type)
    if not isinstance(value, (str, enum_type)):
        raise TypeError(f"{what} must be one of {allowed}, got {type(value).__name__} {value!r}")
    try:
        return enum_type(value)
    except ValueError:
        raise ValueError(f"{what} must be one of {allowed}, got {value!r}") from None


def _fp8_table(dtype_name: str) -> np.ndarray:
    return np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, dtype_name)).astype(np.float32)


_FP8_TO_F32 = {name: _fp8_table(name) for name in ("float8_e4m3fn", "float8_e4m3fnuz")}


def upcast_f32(x):
    """Widen fp8/bf16 ``x`` to fp32 through its bits, so a jitted program keeps the narrow value.

    XLA (``--xla_allow_excess_precision``, on by default) may fold a narrowing convert followed by
    a widening one, which would skip the fp8 rounding between the quant and the GEMM; a bitcast
    consumer pins the narrow value.
    """
    import jax

    name = np.dtype(x.dtype).name
    if name in _FP8_TO_F32:
        return jnp.asarray(_FP8_TO_F32[name])[jax.lax.bitcast_convert_type(x, jnp.uint8)]
    if name == "bfloat16":
        bits = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32) << 16
        return jax.lax.bitcast_convert_type(bits, jnp.float32)
    return x.astype(jnp.float32)


def e8m0_bytes_of_floats(f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(byte, ok)`` for float64 scales: ``ok`` where ``f`` is exactly ``2**(byte - 127)``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mant, exp = np.frexp(f)  # f = mant * 2**exp with mant in [0.5, 1)
        byte = exp.astype(np.int64) + (E8M0_BIAS - 1)
        ok = np.isfinite(f) & (f > 0) & (mant == 0.5) & (byte >= 0) & (byte <= E8M0_MAX_FINITE)
    return byte, ok
