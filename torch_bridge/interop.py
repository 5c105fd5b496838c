"""JAX <-> torch and numpy <-> torch exchange, keeping bf16, fp8 and E8M0 dtypes.

* ``to_torch`` / ``to_jax``: zero-copy through DLPack; ``jax_io`` lets a torch entry point take
  JAX arrays and give JAX arrays back.
* ``numpy_to_torch`` / ``torch_to_numpy``: the same bytes on the host (ml_dtypes types included).
* ``e8m0_bytes``: float or byte scales as E8M0 bytes, losslessly.

DLPack details:

torch >= 2.10 and jax >= 0.5.3 exchange ``float8_e4m3fn``, ``float8_e4m3fnuz`` and
``float8_e8m0fnu`` natively (``jax.dlpack.is_supported_dtype`` still says False for them, so it is
never consulted). Older pairs reject those codes; then the bytes travel as an integer array of the
same width (uint8 for 1-byte types, int16 for bf16) and are re-viewed on the other side. That
fallback copies once: JAX's ``bitcast_convert_type`` makes a new buffer (and ``to_jax`` packs a
strided tensor first). Eager arrays only: DLPack cannot see into ``jax.jit`` tracers.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import numpy as np
import torch

#: dtypes whose DLPack codes are recent; the byte-view fallback covers them.
_VIEW_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e8m0fnu")
#: Item size -> the integer type that carries those bytes (numpy / JAX name, torch dtype).
_CARRIER = {1: ("uint8", torch.uint8), 2: ("int16", torch.int16)}


#: Per Python type: whether its instances are JAX arrays (a dict lookup on the hot path).
_IS_JAX: dict[type, bool] = {torch.Tensor: False, torch.nn.Parameter: False, type(None): False}


#: Argument types that are never JAX arrays, the ones an eager call passes.
_PLAIN_TYPES = frozenset({torch.Tensor, torch.nn.Parameter, type(None), int, float, bool, str,
                          torch.dtype})


def is_jax_array(x: Any) -> bool:
    """Whether ``x`` is a JAX array (checked by module name, so JAX is never imported here)."""
    kind = type(x)
    known = _IS_JAX.get(kind)
    if known is None:
        known = _IS_JAX[kind] = kind.__module__.split(".")[0] in ("jax", "jaxlib")
    return known


def jax_io(*, outputs: tuple[str, ...] = ()):
    """Decorate a torch entry point so that it also takes JAX arrays and then returns them.

    When any positional or keyword argument is a JAX array, every JAX argument is passed on as a
    torch view (``to_torch``) and every tensor of the result (a tensor or a tuple of them) comes
    back as a JAX array (``to_jax``); otherwise the call goes straight through.

    Args:
      outputs: names of keyword output buffers; they must be ``None`` with JAX inputs (JAX arrays
        are immutable), else a ``TypeError`` says so.
    """
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if _PLAIN_TYPES.issuperset(map(type, args)) and (
                    not kwargs or _PLAIN_TYPES.issuperset(map(type, kwargs.values()))):
                return fn(*args, **kwargs)  # the common case, checked at C speed
            if not (any(map(is_jax_array, args)) or any(map(is_jax_array, kwargs.values()))):
                return fn(*args, **kwargs)
            for name in outputs:
                if kwargs.get(name) is not None:
                    raise TypeError(
                        f"{name} cannot be filled when the inputs are JAX arrays (JAX arrays are "
                        "immutable); leave it None to get a new JAX array")
            args = tuple(to_torch(a) if is_jax_array(a) else a for a in args)
            kwargs = {k: to_torch(v) if is_jax_array(v) else v for k, v in kwargs.items()}
            out = fn(*args, **kwargs)
            if isinstance(out, tuple):
                return tuple(to_jax(t) if isinstance(t, torch.Tensor) else t for t in out)
            return to_jax(out) if isinstance(out, torch.Tensor) else out
        return call
    return wrap


def numpy_to_torch(a: np.ndarray) -> torch.Tensor:
    """A CPU tensor with ``a``'s bytes, shape and dtype (ml_dtypes bf16, fp8 and E8M0 included).

    Shares ``a``'s memory when ``a`` is C-contiguous and writable (torch has no read-only
    tensors), else copies once.
    """
    if not isinstance(a, np.ndarray):
        raise TypeError(f"numpy_to_torch expects a numpy array, got {type(a).__name__}")
    a = np.ascontiguousarray(a) if a.flags.writeable else np.array(a, order="C")
    name = a.dtype.name
    if name in _VIEW_DTYPES:
        return torch.from_numpy(a.view(_CARRIER[a.dtype.itemsize][0])).view(getattr(torch, name))
    return torch.from_numpy(a)


def torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy array with ``t``'s bytes, shape and dtype (bf16, fp8 and E8M0 as ml_dtypes types);
    copies to the host when ``t`` is elsewhere."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"torch_to_numpy expects a torch tensor, got {type(t).__name__}")
    t = t.detach().cpu().contiguous()
    name = str(t.dtype).removeprefix("torch.")
    if name in _VIEW_DTYPES:
        import ml_dtypes

        carrier = _CARRIER[t.element_size()][1]
        return t.view(carrier).numpy().view(getattr(ml_dtypes, name))
    return t.numpy()


#: Float dtypes whose values may be converted to E8M0 (when they are exact powers of two).
FLOAT_SCALE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def e8m0_bytes(scale: torch.Tensor, what: str = "weight_scale", *, hint: str = "") -> torch.Tensor:
    """Scales as contiguous uint8 E8M0 bytes on ``scale``'s device, losslessly.

    ``float8_e8m0fnu`` and ``uint8`` are re-viewed. Float scales (fp32/fp64/fp16/bf16) must be
    finite, positive, exact powers of two in E8M0's range ``[2**-127, 2**127]``: the same rule as
    ``woa_jax.e8m0_from_scale``, run with torch ops where the tensor lives (one host sync).

    Args:
      scale: the scales, any shape.
      what: the tensor's name in messages.
      hint: the way out, appended to a ``ValueError``'s message.

    Raises:
      TypeError: a dtype that holds no scale.
      ValueError: a float scale that E8M0 cannot hold exactly; the message names the element.
    """
    if scale.dtype in (torch.uint8, torch.float8_e8m0fnu):
        return scale.view(torch.uint8).contiguous()
    if scale.dtype not in FLOAT_SCALE_DTYPES:
        raise TypeError(f"{what} must be float8_e8m0fnu, uint8 or a float dtype holding powers of "
                        f"two, got {str(scale.dtype).removeprefix('torch.')}")
    f = scale.detach().to(torch.float64)
    mant, exp = torch.frexp(f)  # f = mant * 2**exp, mant in [0.5, 1)
    byte = exp.to(torch.int64) + 126
    ok = torch.isfinite(f) & (f > 0) & (mant == 0.5) & (byte >= 0) & (byte <= 254)
    if not bool(ok.all()):
        idx = [int(i) for i in torch.nonzero(~ok)[0]]
        v = float(f[tuple(idx)])
        why = ("not finite" if not np.isfinite(v) else "not positive" if v <= 0
               else "not a power of two" if float(mant[tuple(idx)]) != 0.5
               else "outside the E8M0 range [2**-127, 2**127]")
        raise ValueError(f"{what} is not losslessly representable as E8M0: element {idx} = "
                         f"{v!r} is {why}" + (f"; {hint}" if hint else ""))
    return byte.to(torch.uint8).contiguous()


def _check_concrete(x) -> None:
    import jax

    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            "to_torch got a JAX tracer: DLPack exchange needs a concrete array, so call "
            "torch_bridge outside jax.jit (or use the woa_jax functions inside it)"
        )


def to_torch(x, *, via_bytes: bool = False) -> torch.Tensor:
    """A torch tensor sharing ``x``'s memory (torch tensors pass through unchanged; the byte
    fallback below returns a copy).

    Args:
      x: a concrete JAX array or a torch tensor.
      via_bytes: force the integer-view fallback even where the native code works (for testing
        and for consumers that reject the codes). It is also taken automatically when the native
        exchange raises.

    Returns:
      The tensor, same shape and dtype (bf16, fp8 and E8M0 included), on the same device.
    """
    if isinstance(x, torch.Tensor):
        return x
    if not is_jax_array(x):
        raise TypeError(f"to_torch expects a JAX array or a torch tensor, got {type(x).__name__}")
    _check_concrete(x)
    name = str(x.dtype)
    if not via_bytes:
        try:
            return torch.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError, ValueError):
            if name not in _VIEW_DTYPES:
                raise
    return _to_torch_bytes(x, name)


def _to_torch_bytes(x, name: str) -> torch.Tensor:
    import jax
    import jax.numpy as jnp

    if name not in _VIEW_DTYPES:  # plain dtypes have long-standing DLPack codes
        return torch.from_dlpack(x)
    jname, _ = _CARRIER[x.dtype.itemsize]
    raw = jax.lax.bitcast_convert_type(x, getattr(jnp, jname))
    return torch.from_dlpack(raw).view(getattr(torch, name))


def to_jax(t, *, via_bytes: bool = False):
    """A JAX array sharing ``t``'s memory (JAX arrays pass through unchanged; the byte fallback
    returns a copy).

    Args:
      t: a torch tensor (``requires_grad`` tensors are detached) or a JAX array.
      via_bytes: force the integer-view fallback (see ``to_torch``); the re-view is a
        ``jax.lax.bitcast_convert_type``.

    Returns:
      The JAX array, same shape and dtype, on the matching device.
    """
    import jax
    import jax.dlpack

    if is_jax_array(t):
        return t
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"to_jax expects a torch tensor or a JAX array, got {type(t).__name__}")
    t = t.detach()
    name = str(t.dtype).removeprefix("torch.")
    guard = contextlib.nullcontext()
    if t.device.type == "cuda":
        # torch exports a CUDA tensor only from its current device, and starting JAX's GPU
        # backend leaves its last GPU current: start it before making the tensor's device
        # current, so that a first export from another device works.
        jax.devices()
        guard = torch.cuda.device(t.device)
    with guard:
        if not via_bytes:
            try:
                return jax.dlpack.from_dlpack(t)
            except (BufferError, RuntimeError, TypeError, ValueError):
                if name not in _VIEW_DTYPES:
                    raise
        return _to_jax_bytes(t, name)


def _to_jax_bytes(t: torch.Tensor, name: str):
    import jax
    import jax.dlpack
    import jax.numpy as jnp

    if name not in _VIEW_DTYPES:
        return jax.dlpack.from_dlpack(t)
    _, carrier = _CARRIER[t.element_size()]
    raw = jax.dlpack.from_dlpack(t.contiguous().view(carrier))
    return jax.lax.bitcast_convert_type(raw, getattr(jnp, name))
