"""Shape and dtype checks with errors that say what was wrong and what was expected.

The shape and dtype checks only read ``.shape`` and ``.dtype``, so they work on numpy, JAX (also
tracers) and torch tensors alike; ``torch_bridge`` reuses them, so both sides reject bad input with
the same words. The value checks (``check_amax_floor``, ``check_wo_a_weight_values``) read values
on the host: call them at load time, not under ``jax.jit``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._spec import E8M0_NAN, as_enum, check_fp8_dtype, e8m0_bytes_of_floats
from .testing import to_numpy

__all__ = [
    "E8M0_NAN",
    "as_enum",
    "check_amax_floor",
    "check_dtype",
    "check_fp8_dtype",
    "check_gemm_inputs",
    "check_group_split",
    "check_int",
    "check_rank",
    "check_rope_inputs",
    "check_weight_blocks",
    "check_wo_a_weight_values",
    "dtype_name",
]

_FLOAT_ACTIVATION = ("bfloat16", "float16", "float32")
_FP8 = ("float8_e4m3fn", "float8_e4m3fnuz")
_SCALE_BYTES = ("uint8", "float8_e8m0fnu")
_FLOAT_SCALES = ("float32", "float64", "float16", "bfloat16")
_FLOAT_SCALE_HINT = ("; float scales that are exact powers of two convert losslessly with "
                     "woa_jax.e8m0_from_scale")
#: Dtypes a checkpoint's weight scale may have: E8M0 bytes or float values.
_WEIGHT_SCALES = ("float8_e8m0fnu", "uint8", *_FLOAT_SCALES)


def dtype_name(x) -> str:
    """``'bfloat16'`` for numpy/ml_dtypes, JAX and torch dtypes alike."""
    dt = getattr(x, "dtype", x)
    name = str(dt)
    return name.removeprefix("torch.")


def _shape(x) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def check_rank(x, rank: int, what: str, dims: str) -> tuple[int, ...]:
    shape = _shape(x)
    if len(shape) != rank:
        raise ValueError(f"{what} must be {rank}-D {dims}, got shape {shape}")
    return shape


def check_dtype(x, allowed: tuple[str, ...], what: str, hint: str = "") -> str:
    """Return ``x``'s dtype name, or raise ``TypeError`` listing ``allowed`` (then ``hint``)."""
    name = dtype_name(x)
    if name not in allowed:
        raise TypeError(f"{what} must have dtype {' or '.join(allowed)}, got {name}{hint}")
    return name


def check_rope_inputs(o, positions, cos_cache, sin_cache, *,
                      rope_dim: int | None = None) -> tuple[int, int, int, int]:
    """Check ``o [S, H, Dh]``, ``positions [>= S]``, ``cos/sin [P, rd/2]``; return S, H, Dh, rd.

    ``rope_dim``, when the caller knows the layer's (a projection built from a config), must equal
    the tables' ``rd``: a table of another width would rotate the wrong lanes without an error.
    """
    s, h, dh = check_rank(o, 3, "o", "[S, H, Dh]")
    check_dtype(o, _FLOAT_ACTIVATION, "o")
    if len(_shape(positions)) != 1:
        raise ValueError(f"positions must be 1-D [S], got shape {_shape(positions)}")
    if dtype_name(positions) not in ("int32", "int64"):
        raise TypeError(f"positions must be int32 or int64, got {dtype_name(positions)}")
    if _shape(positions)[0] < s:
        raise ValueError(f"positions has {_shape(positions)[0]} entries, fewer than S={s} tokens")
    cshape = check_rank(cos_cache, 2, "cos_cache", "[P, rope_dim / 2]")
    if _shape(sin_cache) != cshape:
        raise ValueError(
            f"cos_cache and sin_cache must have the same shape, got {cshape} and "
            f"{_shape(sin_cache)}"
        )
    check_dtype(cos_cache, ("bfloat16", "float16", "float32"), "cos_cache")
    check_dtype(sin_cache, ("bfloat16", "float16", "float32"), "sin_cache")
    if dtype_name(cos_cache) != dtype_name(sin_cache):
        # One table dtype decides how the rotation rounds its products on every backend.
        raise TypeError(f"cos_cache and sin_cache must have one dtype, got "
                        f"{dtype_name(cos_cache)} and {dtype_name(sin_cache)}")
    rd = 2 * cshape[1]
    if cshape[0] < 1 or rd < 2 or rd > dh:
        raise ValueError(
            f"cos_cache [P, rd/2] = {cshape} does not fit head_dim {dh}: need P >= 1 and "
            f"2 <= rd <= {dh}"
        )
    if rope_dim is not None and rd != rope_dim:
        raise ValueError(
            f"cos_cache [P, rd/2] = {cshape} rotates rd = {rd} lanes, but the layer's rope_dim "
            f"is {rope_dim}: expected tables of shape [P, {rope_dim // 2}]"
        )
    return s, h, dh, rd


def check_group_split(s: int, h: int, dh: int, num_groups: int, quant_group_size: int) -> int:
    """Return D, one group's width; require whole heads per group and whole quant groups."""
    check_int(num_groups, "num_groups")
    if (h * dh) % num_groups != 0:
        raise ValueError(
            f"H * Dh = {h} * {dh} = {h * dh} is not divisible by num_groups={num_groups}"
        )
    d = h * dh // num_groups
    if check_int(quant_group_size, "quant_group_size") not in (32, 64, 128):
        raise ValueError(f"quant_group_size must be 32, 64 or 128, got {quant_group_size}")
    if d % quant_group_size != 0:
        raise ValueError(
            f"group width D = {d} is not a multiple of quant_group_size={quant_group_size}"
        )
    return d


def check_gemm_inputs(x, w, x_scale, w_scale) -> tuple[int, int, int, int, int]:
    """Validate the block-scaled GEMM operands; return ``(M, G, N, K, block)``.

    ``block`` is the K width of one scale group (128, or 32 for V4.1), read from ``x_scale``; the
    weight uses square ``block x block`` tiles (ragged last tile allowed along N).
    """
    m, g, k = check_rank(x, 3, "x", "[M, G, K]")
    gw, n, kw = check_rank(w, 3, "w", "[G, N, K]")
    check_dtype(x, _FP8, "x")
    check_dtype(w, _FP8, "w")
    if dtype_name(x) != dtype_name(w):
        raise TypeError(
            f"x and w must share one fp8 dtype, got {dtype_name(x)} and {dtype_name(w)}"
        )
    if (gw, kw) != (g, k):
        raise ValueError(f"w [G, N, K] = {(gw, n, kw)} does not match x [M, G, K] = {(m, g, k)}")
    xs = check_rank(x_scale, 3, "x_scale", "[M, G, K / block]")
    ws = check_rank(w_scale, 3, "w_scale", "[G, N / block, K / block]")
    check_dtype(x_scale, _SCALE_BYTES, "x_scale")
    is_float = dtype_name(w_scale) in _FLOAT_SCALES
    check_dtype(w_scale, _SCALE_BYTES, "w_scale", _FLOAT_SCALE_HINT if is_float else "")
    if xs[:2] != (m, g) or xs[2] < 1 or k % xs[2] != 0:
        raise ValueError(f"x_scale must be [M, G, K / block] with block dividing K={k}, got {xs}")
    block = k // xs[2]
    if block not in (32, 64, 128):
        raise ValueError(f"scale block K / x_scale.shape[2] = {block}; expected 32, 64 or 128")
    expect_ws = (g, -(-n // block), k // block)
    if ws != expect_ws:
        raise ValueError(
            f"w_scale must be [G, ceil(N / {block}), K / {block}] = {expect_ws}, got {ws}"
        )
    return m, g, n, k, block


def check_int(value, what: str, *, low: int = 1) -> int:
    """Return ``value`` if it is an int of at least ``low``: ``TypeError`` for another type (a
    float ``2.0``, a string ``"2"``, a bool), ``ValueError`` below ``low``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__} {value!r}")
    if value < low:
        at_least = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ValueError(f"{what} must be {at_least}, got {value!r}")
    return int(value)


def check_amax_floor(amax_floor) -> float:
    """Return ``amax_floor`` as a float: ``TypeError`` unless it is a real number (not a bool),
    ``ValueError`` unless it is finite and > 0.

    The floor is the smallest group absolute maximum the quantizer uses; NaN would make every
    scale byte 255 and zero or a negative value would let an all-zero group divide by zero.
    """
    if not isinstance(amax_floor, numbers.Real) or isinstance(amax_floor, bool):
        raise TypeError(f"amax_floor must be a finite number > 0, got "
                        f"{type(amax_floor).__name__} {amax_floor!r}")
    if not (math.isfinite(amax_floor) and amax_floor > 0):
        raise ValueError(f"amax_floor must be a finite number > 0, got {amax_floor!r}")
    return float(amax_floor)


def check_weight_blocks(weight, weight_scale, names: tuple[str, str],
                        dims: tuple[str, str]) -> tuple[int, int, int, int]:
    """Check an fp8 checkpoint weight ``[R, K]`` and its block scale ``[Rs, K / B]``: ranks,
    dtypes, and scale columns that cut K into whole blocks (B = 128, or 32 for V4.1).

    Only ``.shape`` and ``.dtype`` are read. How many rows ``Rs`` the scale needs is the caller's
    rule (``wo_a`` allows a ragged last row block, ``wo_b`` does not).

    Args:
      weight, weight_scale: the tensors as stored.
      names: how errors name the weight and the scale.
      dims: the named dims of the weight and of the scale, e.g.
        ``("[G * N, K]", "[G * N / B, K / B]")``.

    Returns:
      ``(R, K, Rs, B)``.
    """
    w_name, s_name = names
    rows, k = check_rank(weight, 2, w_name, dims[0])
    check_dtype(weight, _FP8, w_name)
    srows, scols = check_rank(weight_scale, 2, s_name, dims[1])
    check_dtype(weight_scale, _WEIGHT_SCALES, s_name)
    if scols < 1 or k % scols != 0 or k // scols not in (32, 128):
        raise ValueError(f"{s_name} {(srows, scols)} does not tile weight {(rows, k)} in 128x128 "
                         "or 32x32 blocks")
    return rows, k, srows, k // scols


def _first_bad(bad: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(bad)[0])


def check_wo_a_weight_values(weight, weight_scale, *, require_e8m0: bool = False,
                             names: tuple[str, str] = ("weight", "weight_scale")) -> None:
    """Raise ``ValueError`` naming the first corrupt element of a checkpoint weight or its scale.

    Corrupt means: a NaN fp8 byte in ``weight`` (0x7F/0xFF in e4m3fn, 0x80 in e4m3fnuz; neither
    format has Inf), the E8M0 NaN byte 255 in a byte scale, or a float scale that is NaN, Inf,
    zero or negative. Such a checkpoint has no right answer, so no path (FP8 or BF16) may run it.

    Args:
      weight: ``[R, K]`` fp8 weight (numpy, JAX or torch; read on the host).
      weight_scale: its block scales: ``float8_e8m0fnu``/``uint8`` bytes or float values.
      require_e8m0: also require every float scale to be an exact power of two in the E8M0
        range, which the FP8 path needs; without it such scales are valid for the BF16 path.
      names: how errors name the two tensors, e.g. their checkpoint keys
        (``("layers.0.attn.wo_a.weight", "layers.0.attn.wo_a.scale")``).

    Raises:
      ValueError: the tensor, the first bad element's index and value, and what was expected.
    """
    w_name, s_name = names
    check_dtype(weight, _FP8, w_name)
    scale_dtype = check_dtype(weight_scale, _WEIGHT_SCALES, s_name)
    w = to_numpy(weight)
    w_bytes = w.view(np.uint8)
    nan = w_bytes == 0x80 if w.dtype.name == "float8_e4m3fnuz" else (w_bytes & 0x7F) == 0x7F
    if nan.any():
        idx = _first_bad(nan)
        raise ValueError(
            f"{w_name}: element {list(idx)} is NaN (fp8 byte 0x{int(w_bytes[idx]):02x}); expected "
            "finite fp8 values, so the checkpoint is corrupt"
        )
    scale = to_numpy(weight_scale)
    if scale_dtype in _SCALE_BYTES:
        bad = scale.view(np.uint8) == E8M0_NAN
        if bad.any():
            raise ValueError(
                f"{s_name}: element {list(_first_bad(bad))} is the E8M0 NaN byte 255; "
                "expected bytes 0..254, so the checkpoint is corrupt"
            )
        return
    f = scale.astype(np.float64)
    bad = ~(np.isfinite(f) & (f > 0))
    if bad.any():
        idx = _first_bad(bad)
        raise ValueError(
            f"{s_name}: element {list(idx)} = {float(f[idx])!r}; expected finite scales > 0, "
            "so the checkpoint is corrupt"
        )
    if require_e8m0:
        _, ok = e8m0_bytes_of_floats(f)
        if not ok.all():
            idx = _first_bad(~ok)
            raise ValueError(
                f"{s_name}: element {list(idx)} = {float(f[idx])!r} is not a power of two "
                "in the E8M0 range [2**-127, 2**127]; the FP8 path needs E8M0 scales (the BF16 "
                "path takes this checkpoint)"
            )

