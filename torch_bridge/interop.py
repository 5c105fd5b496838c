"""Zero-copy JAX <-> torch exchange through DLPack, keeping bf16, fp8 and E8M0 dtypes.

torch >= 2.10 and jax >= 0.5.3 exchange ``float8_e4m3fn``, ``float8_e4m3fnuz`` and
``float8_e8m0fnu`` natively (``jax.dlpack.is_supported_dtype`` still says False for them, so it is
never consulted). Older pairs reject those codes; then the bytes travel as an integer array of the
same width (uint8 for 1-byte types, int16 for bf16) and are re-viewed on the other side. That
fallback copies once: JAX's ``bitcast_convert_type`` makes a new buffer (and ``to_jax`` packs a
strided tensor first). Eager arrays only: DLPack cannot see into ``jax.jit`` tracers.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

#: dtypes whose DLPack codes are recent; the byte-view fallback covers them.
_VIEW_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e8m0fnu")
_CARRIER = {1: ("uint8", torch.uint8), 2: ("int16", torch.int16)}


def is_jax_array(x: Any) -> bool:
    """Whether ``x`` is a JAX array (checked by module name, so JAX is never imported here)."""
    return type(x).__module__.split(".")[0] in ("jax", "jaxlib")


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
        # torch exports a CUDA tensor only from its current device. Starting JAX's GPU backend
        # leaves its last GPU current (cuda:1 on two H200s), so start it before choosing ours:
        # started inside ``from_dlpack``, the first export from cuda:0 failed.
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
