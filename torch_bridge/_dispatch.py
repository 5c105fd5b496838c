"""Backend registry and selection.

Each backend lives in a module ``torch_bridge/backends/<module>`` (``BACKEND_MODULES`` maps the
backend name to it: ``torch`` lives in ``torch_ref.py`` so that nothing shadows the ``torch``
package) and exposes a module-level ``BACKEND`` object with:

* ``name: str`` (also its ``WOA_BACKEND`` value),
* ``is_available() -> tuple[bool, str]``: lazy, cached, no side effects (no GPU work at import),
* ``supports(op: Op, case: Case) -> tuple[bool, str]``: can it run this call,
* one callable per op it implements, named like the op.

Rules: ``backend="auto"`` walks ``AUTO_ORDER[op]`` and takes the first backend that is available and
supports the call, logging each rejection once per (op, backend, reason). An explicit backend
(argument, else ``WOA_BACKEND``) runs or raises ``BackendUnavailableError`` with the reason.

The ``wo_a`` op is a chain: a backend with ``wo_a_bf16`` runs it as the BF16 chain; any other
backend runs it as its own ``inverse_rope_group_quant`` followed by its own
``batched_gemm_a8w8_mxscale`` (``FP8_CHAIN``), and must accept the call's case for both; one that
also has ``wo_a_fp8`` runs the chain through it (the triton backend fuses it at decode sizes).
A backend whose module fails to import is reported unavailable with the import error, never
raised.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
from typing import Any, Literal

log = logging.getLogger("woa")

Op = Literal["inverse_rope_group_quant", "batched_gemm_a8w8_mxscale", "wo_a"]
BackendName = Literal["auto", "aiter", "triton", "torch", "bf16"]
BACKENDS: tuple[str, ...] = ("aiter", "triton", "torch", "bf16")
#: Backend name -> module (or package) under ``torch_bridge.backends``.
BACKEND_MODULES: dict[str, str] = {"aiter": "aiter", "triton": "triton", "torch": "torch_ref",
                                   "bf16": "bf16"}
#: The two ops that make up the FP8 ``wo_a`` chain on one backend.
FP8_CHAIN: tuple[str, str] = ("inverse_rope_group_quant", "batched_gemm_a8w8_mxscale")

#: The walk of ``backend="auto"`` per op. The whole ``wo_a`` chain falls back to the BF16 path (the
#: production fallback); the pure-torch FP8 reference runs the chain only when asked for by name.
AUTO_ORDER: dict[str, tuple[str, ...]] = {
    "inverse_rope_group_quant": ("aiter", "triton", "torch"),
    "batched_gemm_a8w8_mxscale": ("aiter", "triton", "torch"),
    "wo_a": ("aiter", "triton", "bf16"),
}


class BackendUnavailableError(RuntimeError):
    """An explicitly requested backend cannot run the call; the message says why."""


@dataclasses.dataclass(frozen=True)
class Case:
    """What a backend needs to know to accept or refuse one call (no tensor data)."""

    device_type: str  # "cpu" or "cuda" (ROCm builds of torch report "cuda" too)
    fp8_dtype: str | None = None  # "float8_e4m3fn" / "float8_e4m3fnuz"
    act_dtype: str | None = None  # dtype of ``o``
    rope_dtype: str | None = None  # dtype of cos/sin
    head_dim: int | None = None
    rope_dim: int | None = None
    quant_group_size: int | None = None
    scale_layout: str = "row"
    out_dtype: str | None = None
    #: Further facts as ``(key, value)`` pairs, e.g. ``num_groups``, ``n``, ``k``, ``amax_floor``,
    #: ``x_k_contiguous``, and for ``wo_a`` ``fp8_unavailable`` (why the FP8 chain cannot run).
    extra: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` in ``extra``, else ``default``."""
        return dict(self.extra).get(key, default)


_loaded: dict[str, Any] = {}
_logged: set[tuple[str, str, str]] = set()


class _Unimportable:
    """Stands in for a backend whose module cannot be imported; never available."""

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason

    def is_available(self) -> tuple[bool, str]:
        return False, self.reason

    def supports(self, op: str, case: Case) -> tuple[bool, str]:
        return False, self.reason


def get_backend(name: str):
    """The ``BACKEND`` object of backend ``name`` (imported on first use).

    A module that fails to import, or has no ``BACKEND``, yields a stand-in whose ``is_available``
    reports ``"<Name> backend not importable: <error>"``.
    """
    if name not in BACKENDS:
        raise ValueError(
            f"unknown backend {name!r}; expected 'auto' or one of {', '.join(BACKENDS)}")
    if name not in _loaded:
        module = f"torch_bridge.backends.{BACKEND_MODULES[name]}"
        label = {"aiter": "AITER", "bf16": "BF16"}.get(name, name.capitalize())
        try:
            _loaded[name] = importlib.import_module(module).BACKEND
        except ImportError as e:
            _loaded[name] = _Unimportable(name, f"{label} backend not importable: {e}")
        except AttributeError:
            _loaded[name] = _Unimportable(
                name, f"{label} backend not importable: {module} defines no BACKEND")
    return _loaded[name]


def requested_backend(backend: str | None) -> str:
    """Argument, else ``WOA_BACKEND``, else ``"auto"``; validated."""
    name = backend if backend not in (None, "auto") else os.environ.get("WOA_BACKEND", "auto")
    if not isinstance(name, str):
        raise TypeError(f"backend must be 'auto' or one of {', '.join(BACKENDS)}, got {name!r}")
    name = name.strip().lower() or "auto"
    if name != "auto" and name not in BACKENDS:
        source = "backend" if backend not in (None, "auto") else "WOA_BACKEND"
        raise ValueError(f"{source}={name!r} is not a backend; expected 'auto' or one of "
                         f"{', '.join(BACKENDS)}")
    return name


def check(name: str, op: str, case: Case) -> tuple[bool, str]:
    """``(ok, reason)`` for backend ``name`` running ``op`` on ``case``."""
    be = get_backend(name)
    ok, reason = be.is_available()
    if not ok:
        return False, reason
    if op == "wo_a" and hasattr(be, "wo_a_bf16"):
        return be.supports(op, case)
    if op == "wo_a":
        missing = [o for o in FP8_CHAIN if not hasattr(be, o)]
        if missing:
            return False, f"{name} does not implement {' and '.join(missing)}"
        fp8_blocker = case.get("fp8_unavailable")
        if fp8_blocker:
            return False, fp8_blocker
        for sub in FP8_CHAIN:
            ok, reason = be.supports(sub, case)
            if not ok:
                return False, f"{sub}: {reason}"
        return True, f"FP8 chain on {name}"
    if not hasattr(be, op):
        return False, f"{name} does not implement {op}"
    return be.supports(op, case)


def _log_once(op: str, name: str, reason: str) -> None:
    key = (op, name, reason)
    if key not in _logged:
        _logged.add(key)
        log.info("woa: %s: backend %s not used: %s", op, name, reason)


def resolve(op: str, case: Case, backend: str | None = None) -> tuple[str, list[str]]:
    """The backend name for ``op`` and the ``"name: reason"`` of each ``auto`` candidate passed
    over before it (empty for an explicit backend); see the module docstring for the rules."""
    name = requested_backend(backend)
    if name != "auto":
        ok, reason = check(name, op, case)
        if not ok:
            raise BackendUnavailableError(f"backend {name!r} cannot run {op}: {reason}")
        return name, []
    reasons = []
    for cand in AUTO_ORDER[op]:
        ok, reason = check(cand, op, case)
        if ok:
            return cand, reasons
        _log_once(op, cand, reason)
        reasons.append(f"{cand}: {reason}")
    raise BackendUnavailableError(f"no backend can run {op}: " + "; ".join(reasons))


def select(op: str, case: Case, backend: str | None = None):
    """Pick the backend object for ``op``; see the module docstring for the rules."""
    return get_backend(resolve(op, case, backend)[0])


def explain(op: str, case: Case) -> dict[str, tuple[bool, str]]:
    """``{backend: (ok, reason)}`` for every registered backend (``ok`` is False, with the
    reason, for one that is unavailable or does not implement ``op``)."""
    return {name: check(name, op, case) for name in BACKENDS}


def reset_caches() -> None:
    """Forget loaded backends, cached probes and logged reasons (tests, env changes)."""
    from . import _capability

    _capability.cache_clear()
    imported = (sys.modules.get(f"torch_bridge.backends.{m}") for m in BACKEND_MODULES.values())
    for be in {*_loaded.values(), *(getattr(m, "BACKEND", None) for m in imported)} - {None}:
        clear = getattr(be, "cache_clear", None)
        if clear is not None:
            clear()
    _loaded.clear()
    _logged.clear()
