"""Public torch entry points: validate once per call signature, pick a backend, run.

Every function accepts torch tensors or (concrete) JAX arrays; JAX inputs are exchanged zero-copy
through DLPack (``torch_bridge.interop.jax_io``) and the results come back as JAX arrays.
Validation happens here, with ``woa_jax.checks`` (the same messages as the oracle); backends assume
valid input.

The first call with a given signature (shapes, strides, dtypes and devices of every tensor, and
the options) validates and plans (backend, output shapes); later calls with the same signature
look the plan up and launch, so a repeated eager call costs little more than the launch. Values
are never part of a signature: scale values given as floats are converted (and checked) on every
call.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Literal, NamedTuple

import torch

from woa_jax import AITER_AMAX_FLOOR, ScaleLayout, checks, scale_shape
from woa_jax.checks import as_enum

from . import _capability, _dispatch, interop, layouts
from ._dispatch import BackendName

ScaleLayoutArg = Literal["row", "mfma_tile", "n32k4"]

_FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
_SCALE_DTYPES = (torch.uint8, torch.float8_e8m0fnu)
_PUBLIC_LAYOUTS = (ScaleLayout.ROW, ScaleLayout.MFMA_TILE, ScaleLayout.N32K4)

#: Call signature -> plan (with its direct eager launcher), per op; the oldest plans go first
#: beyond ``_PLAN_LIMIT`` entries.
_PLANS: dict[tuple, Any] = {}
_PLAN_LIMIT = 512
_dispatch._on_reset.append(_PLANS.clear)
#: Stands in the signature for an argument that is not a tensor (validation then raises).
_NOT_A_TENSOR = object()


def tensor_signature(t) -> tuple | None:
    """A tensor's part of a call signature (plan cache key): shape, strides, dtype, device."""
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        return (t.shape, t.stride(), t.dtype, t.device)
    return _NOT_A_TENSOR


def backend_signature(backend) -> Any:
    """The backend request as a signature part (``WOA_BACKEND`` counts when it is ``auto``)."""
    if backend in (None, "auto"):
        return ("auto", os.environ.get("WOA_BACKEND"))
    return backend


def _lookup(key: tuple):
    """The plan of ``key``, else ``None`` (also for an unhashable option: validation names it)."""
    try:
        return _PLANS.get(key)
    except TypeError:
        return None


def _remember(key: tuple, plan, table: dict | None = None, limit: int = _PLAN_LIMIT) -> None:
    """Keep ``plan`` under ``key`` in ``table`` (the plans by default), oldest out beyond
    ``limit``; an unhashable key (a bad option, named by validation) is not kept.

    Threads may insert at once: an oldest entry another thread took out first, or a table
    that changed while its oldest key was read, only skips the eviction."""
    table = _PLANS if table is None else table
    try:
        hash(key)
    except TypeError:
        return
    if len(table) >= limit:
        try:
            del table[next(iter(table))]
        except (KeyError, RuntimeError, StopIteration):
            pass
    table[key] = plan


def _bind_eager(key: tuple, plan, op: str, *args) -> None:
    """Ask ``plan.backend`` once per signature for a direct eager launcher of ``op`` and keep it
    in the plan (``False`` where the backend binds none)."""
    be = plan.backend
    launcher = be.eager_launcher(op, *args) if op in be.eager_ops else None
    _remember(key, plan._replace(eager=launcher or False))


def bound_launcher(key: tuple):
    """The direct eager launcher kept in the plan of ``key`` (``quant_key``, ``gemm_key``),
    else ``None``."""
    plan = _lookup(key)
    return (plan.eager or None) if plan is not None else None


def require_torch(*, optional: tuple[str, ...] = (), **tensors) -> None:
    """Raise a ``TypeError`` naming the first argument that is not a tensor (``None`` is allowed
    only for the names in ``optional``)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) and not (t is None and name in optional):
            raise TypeError(f"{name} must be a torch tensor or a JAX array, got {type(t).__name__}")


def one_device(**tensors) -> torch.device:
    """The one device of the given tensors (``None`` entries ignored), else a ``ValueError``."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        where = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise ValueError(f"all tensors must be on one device, got {where}")
    return next(iter(devices.values()))


def check_weight_device(**tensors) -> torch.device:
    """The one device of a checkpoint's tensors (``None`` entries ignored), which must hold data
    (not ``meta``): their values are checked at load. Else a ``ValueError``."""
    device = one_device(**tensors)
    if device.type == "meta":
        raise ValueError(f"{', '.join(n for n, t in tensors.items() if t is not None)} are on the "
                         "meta device, which holds no data; checkpoint tensors are checked for "
                         "corrupt values at load, so pass them on the CPU or a GPU")
    return device


def usable_device(device) -> torch.device:
    """``device`` as a ``torch.device`` that holds data in this process: ``TypeError`` for what
    is not a device, ``ValueError`` with the reason for one that cannot be used here (torch's
    own ``AssertionError`` says only that it was not compiled with CUDA)."""
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"device must be a torch.device, a string such as 'cuda:0' or a GPU "
                        f"index, got {type(device).__name__} {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"device={device!r} is not a device: {e}") from None
    why = _capability.device_missing(dev.type)
    if dev.type == "meta":
        why = "meta tensors hold no data, and checkpoint values are checked at load"
    elif why is None and dev.type == "cuda" and dev.index is not None \
            and dev.index >= torch.cuda.device_count():
        why = f"torch sees {torch.cuda.device_count()} GPU(s)"
    if why:
        raise ValueError(f"device={device!r} cannot be used: {why}")
    return dev


def check_finite(**tensors) -> None:
    """Raise ``ValueError`` naming the first bad element of an activation: NaN/Inf in a float
    tensor, a NaN byte in an fp8 one, the E8M0 NaN byte 255 in a scale (``check_finite`` and
    ``WOA_CHECK_FINITE``). Reading values syncs with the device, so calls skip this by default;
    non-tensors and ``None`` are left to the argument checks."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        if t.dtype in (torch.uint8, torch.float8_e8m0fnu):
            bad, expect = t.view(torch.uint8) == checks.E8M0_NAN, "E8M0 scale bytes below 255"
        elif t.is_floating_point():
            bad, expect = ~torch.isfinite(t.float() if t.dtype in _FP8 else t), "finite values"
        else:
            continue
        if bool(bad.any()):
            idx = [int(i) for i in bad.nonzero()[0]]
            shown = f"byte {int(t.view(torch.uint8)[tuple(idx)])}" if t.element_size() == 1 \
                else repr(float(t[tuple(idx)]))
            raise ValueError(f"{name}: element {idx} is {shown}; expected {expect} "
                             "(check_finite / WOA_CHECK_FINITE=1)")


def ready_everywhere(t: torch.Tensor, owner: str = "WoAProjection") -> torch.Tensor:
    """``t``, made on this thread's stream, once that work is done: a layer keeps it, and
    launches on every thread's stream read it.

    Raises:
      RuntimeError: under CUDA-graph capture, where the work would only run at replay.
    """
    if t.is_cuda:
        refuse_capture(t.device, owner)
        torch.cuda.current_stream(t.device).synchronize()
    return t


def refuse_capture(device: torch.device, owner: str = "WoAProjection") -> None:
    """Raise ``RuntimeError`` if a layer's one-time conversion for ``device`` is about to run
    under CUDA-graph capture: it would run only at replay, and a copy from host memory ends
    the capture, so the check comes before any of that work."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{owner}: the layer's first call on this device and dtype is being captured in "
            "a CUDA graph; call it once outside capture (it converts the weight and tables "
            "there) and capture after")


def check_contiguous(t: torch.Tensor, what: str) -> None:
    """Raise a ``ValueError`` naming ``what`` unless ``t`` is contiguous."""
    if not t.is_contiguous():
        raise ValueError(
            f"{what} must be contiguous, got shape {tuple(t.shape)} with strides {t.stride()}; "
            f"pass {what}.contiguous()"
        )


class _QuantPlan(NamedTuple):
    backend: _dispatch.Backend
    fp8: torch.dtype
    shape: tuple[int, int, int]  # [S, G, D]
    scale_shape: tuple[int, ...]
    scale_dtype: torch.dtype
    layout: ScaleLayout
    #: The backend's direct launcher for plain eager repeats; ``None`` until asked, ``False``
    #: where it has none.
    eager: Any = None


@interop.jax_io(outputs=("x_fp8", "x_scale"))
def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups: int,
                             quant_group_size: int = 128, *,
                             scale_layout: ScaleLayoutArg | ScaleLayout = "row",
                             backend: BackendName = "auto", x_fp8=None, x_scale=None,
                             fp8_dtype: torch.dtype | None = None,
                             amax_floor: float = AITER_AMAX_FLOOR):
    """Inverse RoPE fused with per-token 1 x GS E8M0 FP8 quantization (``woa_jax``'s op).

    Args:
      o: ``[S, H, Dh]`` bf16/fp16/fp32 attention output, contiguous, RoPE-rotated in its last
        ``rd`` lanes per head (GPT-J interleaved pairs).
      positions: ``[>= S]`` int32/int64 token positions. The contract is ``0 <= p < P``;
        out-of-range values are clamped to ``[0, P - 1]`` as AITER's kernel does.
      cos_cache, sin_cache: ``[P, rd / 2]`` bf16/fp16/fp32 tables (the AITER backend converts
        them to ``o``'s dtype, as vLLM's ROCm path does; convert once yourself to save the copy).
      num_groups: G; each group is ``H / G`` consecutive heads, ``D = H * Dh / G`` lanes.
      quant_group_size: GS in {32, 64, 128}; must divide D.
      scale_layout: ``"row"`` (``[S, G, D / GS]``, what the GEMM consumes), ``"mfma_tile"`` or
        ``"n32k4"`` (AITER main's tiled buffers, ``woa_jax.scale_shape``; padding undefined).
      backend: ``"auto"`` or a backend name; ``None``/``"auto"`` defers to ``WOA_BACKEND``.
      x_fp8: optional ``[S, G, D]`` contiguous fp8 output buffer; its dtype sets the fp8 flavour.
      x_scale: optional output buffer of the layout's shape, uint8 or float8_e8m0fnu.
      fp8_dtype: ``torch.float8_e4m3fn`` (default) or ``torch.float8_e4m3fnuz`` when no
        ``x_fp8`` is given.
      amax_floor: a finite positive float: 1e-8 (AITER, default) or 1e-10 (vLLM CUDA).

    Returns:
      ``(x_fp8 [S, G, D], x_scale)``; ``x_scale`` is float8_e8m0fnu (or ``x_scale``'s dtype when
      given) in ``scale_layout``. Bytes equal ``woa_jax.inverse_rope_group_quant``'s (fused
      semantics). ``S = 0`` returns empty tensors without running a backend.

    Raises:
      TypeError: an argument of the wrong type or dtype.
      ValueError: a wrong shape, stride, device, option or ``amax_floor``.
      BackendUnavailableError: the requested backend cannot run the call.
    """
    key = quant_key(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                    scale_layout, backend, x_fp8, x_scale, fp8_dtype, amax_floor)
    plan = _lookup(key)
    if plan is not None and plan.eager:  # row layout only; new scales come as float8_e8m0fnu
        got = plan.eager(o, positions, cos_cache, sin_cache, x_fp8, x_scale)
        if got is not None:
            return got
    given_fp8, given_scale = x_fp8, x_scale
    if plan is None:
        plan = _plan_quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                           scale_layout, backend, x_fp8, x_scale, fp8_dtype, amax_floor)
        _remember(key, plan)
    s, g, d = plan.shape
    if x_fp8 is None:
        x_fp8 = torch.empty(plan.shape, dtype=plan.fp8, device=o.device)
    if plan.backend is None:  # S = 0
        if x_scale is None:
            x_scale = torch.empty(plan.scale_shape, dtype=plan.scale_dtype, device=o.device)
        return x_fp8, x_scale
    # Backends always write the row layout; tiled layouts are built from it below.
    row = plan.layout is ScaleLayout.ROW
    row_buf = x_scale.view(torch.uint8) if (x_scale is not None and row) else None
    q, byte = plan.backend.inverse_rope_group_quant(
        o, positions, cos_cache, sin_cache, num_groups, quant_group_size, amax_floor=amax_floor,
        x_fp8=x_fp8, x_scale=row_buf)
    byte = byte.view(torch.uint8)
    if row and plan.eager is None:
        _bind_eager(key, plan, "inverse_rope_group_quant", o, positions, cos_cache, sin_cache,
                    num_groups, quant_group_size, amax_floor, plan.fp8, given_fp8, given_scale)
    if row:
        return q, (x_scale if x_scale is not None else byte.view(plan.scale_dtype))
    out = x_scale.view(torch.uint8) if x_scale is not None else None
    buf = layouts.to_scale_layout(byte, plan.layout, quant_group_size=quant_group_size, out=out)
    return q, (x_scale if x_scale is not None else buf.view(plan.scale_dtype))


def quant_key(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, scale_layout,
              backend, x_fp8, x_scale, fp8_dtype, amax_floor) -> tuple:
    """The call signature of an ``inverse_rope_group_quant`` call: its plan's key."""
    sig = tensor_signature
    # Options go in with their types: 2.0 == 2 and True == 1 would otherwise let a value the
    # checks reject reuse the plan of one they accepted.
    return ("quant", sig(o), sig(positions), sig(cos_cache), sig(sin_cache),
            type(num_groups), num_groups, type(quant_group_size), quant_group_size,
            type(scale_layout), scale_layout, type(fp8_dtype), fp8_dtype, type(amax_floor),
            amax_floor, backend_signature(backend), sig(x_fp8), sig(x_scale))


def _plan_quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, scale_layout,
                backend, x_fp8, x_scale, fp8_dtype, amax_floor) -> _QuantPlan:
    """Validate an ``inverse_rope_group_quant`` call and plan it (no tensor data is read)."""
    require_torch(o=o, positions=positions, cos_cache=cos_cache, sin_cache=sin_cache,
                  x_fp8=x_fp8, x_scale=x_scale, optional=("x_fp8", "x_scale"))
    checks.check_amax_floor(amax_floor)
    layout = as_enum(ScaleLayout, scale_layout, "scale_layout")
    if layout not in _PUBLIC_LAYOUTS:
        raise ValueError(
            f"scale_layout must be 'row', 'mfma_tile' or 'n32k4', got {layout.value!r}")
    s, h, dh, _ = checks.check_rope_inputs(o, positions, cos_cache, sin_cache)
    d = checks.check_group_split(s, h, dh, num_groups, quant_group_size)
    check_contiguous(o, "o")
    one_device(o=o, positions=positions, cos_cache=cos_cache, sin_cache=sin_cache, x_fp8=x_fp8,
               x_scale=x_scale)
    fp8 = _resolve_fp8(x_fp8, fp8_dtype, (s, num_groups, d))
    ks = d // quant_group_size
    sshape = scale_shape(s, num_groups, ks, layout, quant_group_size)
    if x_scale is not None:
        if x_scale.dtype not in _SCALE_DTYPES:
            raise TypeError(f"x_scale must be uint8 or float8_e8m0fnu, got "
                            f"{checks.dtype_name(x_scale)}")
        if tuple(x_scale.shape) != sshape:
            raise ValueError(f"x_scale for scale_layout={layout.value!r} must have shape "
                             f"{sshape}, got {tuple(x_scale.shape)}")
        check_contiguous(x_scale, "x_scale")
    scale_dtype = x_scale.dtype if x_scale is not None else torch.float8_e8m0fnu
    be = None
    if s > 0:
        case = _dispatch.rope_case(o, cos_cache, quant_group_size, fp8, num_groups=num_groups,
                                   amax_floor=amax_floor, device_type=o.device.type)
        be = _dispatch.select("inverse_rope_group_quant", case, backend)
    return _QuantPlan(be, fp8, (s, num_groups, d), sshape, scale_dtype, layout)


def _resolve_fp8(x_fp8, fp8_dtype, shape: tuple[int, int, int]) -> torch.dtype:
    if fp8_dtype is not None and fp8_dtype not in _FP8:
        raise TypeError(f"fp8_dtype must be torch.float8_e4m3fn or torch.float8_e4m3fnuz, got "
                        f"{fp8_dtype}")
    if x_fp8 is None:
        return fp8_dtype or torch.float8_e4m3fn
    if x_fp8.dtype not in _FP8:
        raise TypeError(f"x_fp8 must be float8_e4m3fn or float8_e4m3fnuz, got "
                        f"{checks.dtype_name(x_fp8)}")
    if fp8_dtype is not None and fp8_dtype != x_fp8.dtype:
        raise TypeError(f"fp8_dtype={fp8_dtype} contradicts x_fp8.dtype={x_fp8.dtype}")
    if tuple(x_fp8.shape) != shape:
        raise ValueError(f"x_fp8 must have shape [S, G, D] = {shape}, got {tuple(x_fp8.shape)}")
    check_contiguous(x_fp8, "x_fp8")
    return x_fp8.dtype


class _GemmPlan(NamedTuple):
    backend: _dispatch.Backend | None  # None: M = 0
    shape: tuple[int, int, int]  # [M, G, N]
    float_scales: tuple[bool, bool]  # (x_scale, w_scale) given as float powers of two
    eager: Any = None  # as _QuantPlan's


@interop.jax_io(outputs=("out",))
def batched_gemm_a8w8_mxscale(x, w, x_scale, w_scale, dtype: torch.dtype = torch.bfloat16, *,
                              backend: BackendName = "auto", out=None):
    """Block-scaled FP8 batched GEMM ``y[m, g, n] = sum_k dq(x)[m, g, k] * dq(w)[g, n, k]``.

    Args:
      x: ``[M, G, K]`` fp8 activations (e4m3fn or e4m3fnuz); K must be the unit-stride dim for
        AITER (a transposed ``[G, M, K]`` buffer is fine).
      w: ``[G, N, K]`` fp8 weight, same dtype as ``x``.
      x_scale: ``[M, G, K / B]`` 1 x B activation group scales: E8M0 (uint8 or float8_e8m0fnu),
        or float32/float64/float16/bfloat16 values that are exact powers of two (converted to
        E8M0 bytes on every call, losslessly; pass bytes to skip that host work).
      w_scale: ``[G, ceil(N / B), K / B]`` B x B weight block scales, B = 128 (V4) or 32 (V4.1),
        in the same dtypes as ``x_scale``.
      dtype: ``torch.bfloat16`` (default) or ``torch.float32``.
      backend: ``"auto"`` or a backend name (see ``inverse_rope_group_quant``).
      out: optional ``[M, G, N]`` output of ``dtype`` with unit stride along N.

    Returns:
      ``[M, G, N]`` in ``dtype`` (``out`` when given); fp32 accumulation, one final rounding. It
      matches ``woa_jax.batched_gemm_a8w8_mxscale`` to the output rounding, not bit for bit.

    Raises:
      TypeError: an argument of the wrong type or dtype.
      ValueError: a wrong shape, stride or device, or a float scale that is not a power of two
        in E8M0's range (convert such scales yourself with ``woa_jax.e8m0_from_scale``).
      BackendUnavailableError: the requested backend cannot run the call.
    """
    key = gemm_key(x, w, x_scale, w_scale, dtype, backend, out)
    plan = _lookup(key)
    if plan is not None and plan.eager:
        got = plan.eager(x, w, x_scale, w_scale, out)
        if got is not None:
            return got
    if plan is None:
        plan = _plan_gemm(x, w, x_scale, w_scale, dtype, backend, out)
        _remember(key, plan)
    if plan.float_scales[0]:
        x_scale = interop.e8m0_bytes(x_scale, "x_scale", hint=_FLOAT_SCALES_HINT)
    if plan.float_scales[1]:
        w_scale = interop.e8m0_bytes(w_scale, "w_scale", hint=_FLOAT_SCALES_HINT)
    if plan.backend is None:
        return out if out is not None else torch.empty(plan.shape, dtype=dtype, device=x.device)
    y = plan.backend.batched_gemm_a8w8_mxscale(x, w, x_scale.view(torch.uint8),
                                               w_scale.view(torch.uint8), dtype=dtype, out=out)
    # Float scales are converted (and checked) on every call: no direct launch for them.
    if not any(plan.float_scales) and plan.eager is None:
        _bind_eager(key, plan, "batched_gemm_a8w8_mxscale", x, w, x_scale, w_scale, dtype, out)
    return y


_FLOAT_SCALES_HINT = ("the GEMM takes E8M0 bytes (uint8 or float8_e8m0fnu) or float scales that "
                      "are exact powers of two (woa_jax.e8m0_from_scale converts and checks them)")


def gemm_key(x, w, x_scale, w_scale, dtype, backend, out) -> tuple:
    """The call signature of a ``batched_gemm_a8w8_mxscale`` call: its plan's key."""
    sig = tensor_signature
    return ("gemm", sig(x), sig(w), sig(x_scale), sig(w_scale), type(dtype), dtype,
            backend_signature(backend), sig(out))


def _plan_gemm(x, w, x_scale, w_scale, dtype, backend, out) -> _GemmPlan:
    """Validate a ``batched_gemm_a8w8_mxscale`` call and plan it (no tensor data is read)."""
    require_torch(x=x, w=w, x_scale=x_scale, w_scale=w_scale, out=out, optional=("out",))
    floats = tuple(t.dtype in interop.FLOAT_SCALE_DTYPES for t in (x_scale, w_scale))
    # Shapes are checked on the bytes' stand-ins: meta tensors of E8M0 with the same shapes.
    as_bytes = [torch.empty(t.shape, dtype=torch.uint8, device="meta") if f else t
                for t, f in zip((x_scale, w_scale), floats, strict=True)]
    m, g, n, k, block = checks.check_gemm_inputs(x, w, *as_bytes)
    if dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"dtype must be torch.bfloat16 or torch.float32, got {dtype}")
    one_device(x=x, w=w, x_scale=x_scale, w_scale=w_scale, out=out)
    if out is not None:
        if tuple(out.shape) != (m, g, n) or out.dtype != dtype:
            raise ValueError(f"out must be [M, G, N] = {(m, g, n)} of {dtype}, got "
                             f"{tuple(out.shape)} of {out.dtype}")
        if n > 1 and out.stride(2) != 1:
            raise ValueError(f"out must have unit stride along N, got strides {out.stride()}")
    be = None
    if m > 0:
        case = _dispatch.gemm_case(x, w, block, dtype, device_type=x.device.type,
                                   x_k_contiguous=x.stride(2) == 1 or k == 1)
        be = _dispatch.select("batched_gemm_a8w8_mxscale", case, backend)
    return _GemmPlan(be, (m, g, n), floats)


def finite_checked(fn, names: tuple[str, ...], outputs: tuple[str, ...] = ()):
    """``fn`` (a ``jax_io`` entry point) that first runs ``check_finite`` on its arguments
    ``names`` (the leading positional ones, or keywords). Bound in ``fn``'s place when
    ``WOA_CHECK_FINITE=1`` at import, so that the check costs nothing when it is off."""
    raw = fn.__wrapped__

    @functools.wraps(raw)
    def checked(*args, **kwargs):
        given = dict(zip(names, args, strict=False))
        given.update((k, kwargs[k]) for k in names if k in kwargs)
        check_finite(**given)
        return raw(*args, **kwargs)

    return interop.jax_io(outputs=outputs)(checked)


def finite_check_wanted(check_finite: bool | None) -> bool:
    """``check_finite``, or ``WOA_CHECK_FINITE`` for ``None``; ``TypeError`` for another type."""
    if check_finite is None:
        return _capability.env_flag("WOA_CHECK_FINITE", False)
    if not isinstance(check_finite, bool):
        raise TypeError(f"check_finite must be True, False or None, got {check_finite!r}")
    return check_finite


if _capability.env_flag("WOA_CHECK_FINITE", False):
    inverse_rope_group_quant = finite_checked(inverse_rope_group_quant, ("o",),
                                              ("x_fp8", "x_scale"))
    batched_gemm_a8w8_mxscale = finite_checked(batched_gemm_a8w8_mxscale,
                                               ("x", "w", "x_scale", "w_scale"), ("out",))
