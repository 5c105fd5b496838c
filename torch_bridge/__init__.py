"""torch_bridge: DeepSeek V4's FP8 ``wo_a`` projection for PyTorch (and JAX arrays via DLPack).

Backends: ``aiter`` (AITER ops, ROCm gfx950), ``triton``, ``torch`` (pure-torch reference,
bit-identical to ``woa_jax`` on fp8 and scale bytes) and ``bf16`` (the BF16 chain, the fallback of
the whole projection). Importing this package touches no GPU and imports no vendor package.

Errors: every public entry point (the two ops, ``wo_a_fp8``, ``wo_a_bf16``, ``WoAProjection``,
``TPOutputProjection``, ``WoBProjection``, ``to_jax``/``to_torch``) checks its input before any
kernel runs and raises

* ``TypeError`` for an argument of the wrong type or dtype (a numpy array where a tensor is
  expected, an int32 ``o``, a float16 GEMM output, ``num_groups=2.0``, ``layer="0"``);
* ``ValueError`` for a wrong shape, stride, device mix or value: ``amax_floor`` that is not a
  finite positive number, a rope table of the wrong width, float scales that are not exact powers
  of two where E8M0 is required, a corrupt checkpoint (NaN weight bytes, NaN/Inf/zero/negative
  scales), a ``config`` or ``num_groups`` that does not tile the stored weight, a ``device=`` this
  process cannot use (with the reason); the message names the tensor, the element where it
  applies, and what was expected;
* ``CheckpointError`` (a ``ValueError``) for anything about files: a missing path, a file that
  cannot be read (empty, truncated, not safetensors, bad JSON), a layer the checkpoint does not
  have (the message lists those it has); its subclass ``NonFiniteTensorError`` for NaN/Inf in a
  stored weight or scale;
* ``BackendUnavailableError`` (a ``RuntimeError``) when the requested backend cannot run the call,
  with the reason.

Activation values are not checked (that would sync with the device on every call) unless asked:
``WoAProjection(..., check_finite=True)`` or ``WOA_CHECK_FINITE=1``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from . import _dispatch
from ._capability import ENV_VARS
from ._dispatch import BACKENDS, BackendName, BackendUnavailableError, Case

if TYPE_CHECKING:
    from .checkpoint import CheckpointError, NonFiniteTensorError, read_wo_a, save_wo_a_layer
    from .interop import to_jax, to_torch
    from .layouts import from_scale_layout, to_scale_layout
    from .ops import batched_gemm_a8w8_mxscale, inverse_rope_group_quant
    from .projection import WoAProjection, wo_a_bf16, wo_a_fp8
    from .tp import TPOutputProjection
    from .wo_b import WoBProjection

#: Public names imported on first use (torch and JAX take seconds to import; ``woa --help`` and
#: the dispatch registry need neither).
_LAZY = {
    "CheckpointError": "checkpoint", "NonFiniteTensorError": "checkpoint",
    "read_wo_a": "checkpoint", "save_wo_a_layer": "checkpoint", "to_jax": "interop",
    "to_torch": "interop", "from_scale_layout": "layouts", "to_scale_layout": "layouts",
    "batched_gemm_a8w8_mxscale": "ops", "inverse_rope_group_quant": "ops",
    "WoAProjection": "projection", "wo_a_bf16": "projection", "wo_a_fp8": "projection",
    "TPOutputProjection": "tp", "WoBProjection": "wo_b",
}


def __getattr__(name: str):
    """A public name (or submodule) imported on first use, then kept as a module attribute."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}"):
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


_DEFAULT_CASES = {
    "inverse_rope_group_quant": dict(fp8_dtype="float8_e4m3fn", act_dtype="bfloat16",
                                     rope_dtype="bfloat16", head_dim=512, rope_dim=64,
                                     quant_group_size=128),
    "batched_gemm_a8w8_mxscale": dict(fp8_dtype="float8_e4m3fn", quant_group_size=128,
                                      out_dtype="bfloat16",
                                      extra=(("n", 1024), ("k", 4096), ("x_k_contiguous", True))),
    "wo_a": dict(fp8_dtype="float8_e4m3fn", act_dtype="bfloat16", rope_dtype="float32",
                 head_dim=512, rope_dim=64, quant_group_size=128, out_dtype="bfloat16",
                 extra=(("n", 1024), ("k", 4096), ("x_k_contiguous", True))),
}


def _default_device_type() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def available_backends() -> dict[str, tuple[bool, str]]:
    """``{backend: (ok, reason)}``: which backends can run at all in this process."""
    return {name: _dispatch.get_backend(name).is_available() for name in BACKENDS}


def explain(op: str | None = None, case: Case | None = None, *,
            device_type: str | None = None) -> dict:
    """Which backends can run ``op`` here, each with its reason.

    Args:
      op: ``"inverse_rope_group_quant"``, ``"batched_gemm_a8w8_mxscale"`` or ``"wo_a"``; ``None``
        explains all three.
      case: the call to judge (``torch_bridge._dispatch.rope_case`` / ``gemm_case`` build one
        from arrays; ``WoAProjection.explain(o)`` for a layer). Default: a DeepSeek V4 call (bf16
        ``o [S, 64, 512]``, e4m3fn, GS 128, N 1024, K 4096) on ``device_type``.
      device_type: ``"cuda"`` or ``"cpu"``; default the GPU if torch sees one.

    Returns:
      ``{backend: (ok, reason)}``, or ``{op: {backend: (ok, reason)}}`` when ``op`` is None.
    """
    if op is None:
        return {name: explain(name, case, device_type=device_type) for name in _DEFAULT_CASES}
    if op not in _DEFAULT_CASES:
        raise ValueError(f"op must be one of {', '.join(_DEFAULT_CASES)}, got {op!r}")
    if case is None:
        case = Case(device_type=device_type or _default_device_type(), **_DEFAULT_CASES[op])
    return _dispatch.explain(op, case)


__all__ = [
    "BACKENDS",
    "ENV_VARS",
    "BackendName",
    "BackendUnavailableError",
    "CheckpointError",
    "Case",
    "NonFiniteTensorError",
    "TPOutputProjection",
    "WoAProjection",
    "WoBProjection",
    "available_backends",
    "batched_gemm_a8w8_mxscale",
    "explain",
    "from_scale_layout",
    "inverse_rope_group_quant",
    "read_wo_a",
    "save_wo_a_layer",
    "to_jax",
    "to_scale_layout",
    "to_torch",
    "wo_a_bf16",
    "wo_a_fp8",
]
