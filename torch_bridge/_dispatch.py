"""Backend registry and selection.

Each backend lives in a module ``torch_bridge/backends/<module>`` (``BACKEND_MODULES`` maps the
backend name to it: ``torch`` lives in ``torch_ref.py`` so that nothing shadows the ``torch``
package) and exposes a module-level ``BACKEND`` object satisfying the ``Backend`` protocol: its
``ops`` say which op callables it defines, so nothing here probes attributes.

Rules: ``backend="auto"`` walks ``AUTO_ORDER[op]`` and takes the first backend that is available and
supports the call, logging each rejection once per (op, backend, reason). An explicit backend
(argument, else ``WOA_BACKEND``) runs or raises ``BackendUnavailableError`` with the reason.

The ``wo_a`` op is a chain: a backend whose ``ops`` hold ``wo_a_bf16`` runs it as the BF16 chain;
any other runs it as its own ``inverse_rope_group_quant`` followed by its own
``batched_gemm_a8w8_mxscale`` (``FP8_CHAIN``), and must accept the call's case for both; one whose
``ops`` also hold ``wo_a_fp8`` runs the chain through it (the triton backend fuses it at decode
sizes). A backend whose module fails to import, or whose object does not satisfy the protocol, is
reported unavailable with the reason, never raised.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
from typing import Any, Literal, Protocol, runtime_checkable

log = logging.getLogger("woa")

#: What a caller dispatches: the two ops and the whole ``wo_a`` chain.
Op = Literal["inverse_rope_group_quant", "batched_gemm_a8w8_mxscale", "wo_a"]
#: The op callables a backend object can define (its ``ops``).
BackendOp = Literal["inverse_rope_group_quant", "batched_gemm_a8w8_mxscale", "wo_a_fp8",
                    "wo_a_bf16"]
#: The ``backend=`` argument of every entry point (and the values of ``WOA_BACKEND``).
BackendName = Literal["auto", "aiter", "triton", "deepgemm", "torch", "bf16"]
BACKENDS: tuple[str, ...] = ("aiter", "triton", "deepgemm", "torch", "bf16")
#: Backend name -> module (or package) under ``torch_bridge.backends``.
BACKEND_MODULES: dict[str, str] = {"aiter": "aiter", "triton": "triton", "deepgemm": "deepgemm",
                                   "torch": "torch_ref", "bf16": "bf16"}
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


def _name(dtype_or_array) -> str:
    """A dtype's name (torch, numpy, JAX or ml_dtypes dtypes, or arrays of them)."""
    from woa_jax import checks

    return checks.dtype_name(dtype_or_array)


def rope_case(o, cos_cache, quant_group_size: int | None, fp8_dtype, *,
              num_groups: int | None, amax_floor: float | None, device_type: str) -> Case:
    """The ``Case`` of an ``inverse_rope_group_quant`` call from its arrays (torch tensors, JAX
    arrays or shape structs: shapes and dtype names only; backends always write the row scale
    layout). ``o [S, H, Dh]``; ``cos_cache [P, rd / 2]`` (``rd = 0``: no rotation). A rotation
    alone (the BF16 chain's) passes ``None`` for the quant's fields."""
    extra = tuple((key, value) for key, value in (("num_groups", num_groups),
                                                  ("amax_floor", amax_floor))
                  if value is not None)
    return Case(
        device_type=device_type,
        fp8_dtype=None if fp8_dtype is None else _name(fp8_dtype),
        act_dtype=_name(o),
        rope_dtype=_name(cos_cache),
        head_dim=int(o.shape[2]),
        rope_dim=2 * int(cos_cache.shape[1]),
        quant_group_size=quant_group_size,
        extra=extra,
    )


def gemm_case(x, w, block: int, out_dtype, *, device_type: str, x_k_contiguous: bool) -> Case:
    """The ``Case`` of a ``batched_gemm_a8w8_mxscale`` call from ``x [M, G, K]`` and
    ``w [G, N, K]`` (any array kind, as ``rope_case``)."""
    m, g, k = (int(d) for d in x.shape)
    return Case(
        device_type=device_type,
        fp8_dtype=_name(x),
        quant_group_size=block,
        out_dtype=_name(out_dtype),
        extra=(("num_groups", g), ("m", m), ("n", int(w.shape[1])), ("k", k),
               ("x_k_contiguous", x_k_contiguous)),
    )


def wo_a_case(act_dtype, cos_cache, head_dim: int, *, device_type: str, fp8_dtype,
              quant_group_size: int | None, num_groups: int, n: int, k: int,
              amax_floor: float, fp8_unavailable: str | None = None) -> Case:
    """The ``Case`` of a whole ``wo_a`` chain (``fp8_dtype`` ``None`` for an unquantized
    weight; ``fp8_unavailable``: why the FP8 chain cannot run)."""
    extra = [("num_groups", num_groups), ("n", n), ("k", k), ("amax_floor", amax_floor),
             ("x_k_contiguous", True)]
    if fp8_unavailable:
        extra.append(("fp8_unavailable", fp8_unavailable))
    return Case(
        device_type=device_type,
        fp8_dtype=None if fp8_dtype is None else _name(fp8_dtype),
        act_dtype=_name(act_dtype),
        rope_dtype=_name(cos_cache),
        head_dim=head_dim,
        rope_dim=2 * int(cos_cache.shape[1]),
        quant_group_size=quant_group_size,
        out_dtype="bfloat16",
        extra=tuple(extra),
    )


@runtime_checkable
class Backend(Protocol):
    """What every ``BACKEND`` object provides.

    Attributes:
      name: the backend's name (also its ``WOA_BACKEND`` value).
      ops: the op callables it defines, each named like the op and called with the launcher
        arguments of ``torch_bridge.backends.torch_ref.TorchBackend``'s methods.
      rope_in_activation_dtype: whether its quant wants cos/sin in ``o``'s dtype (callers that
        keep the tables convert them once instead of on every call).
      eager_ops: the ops for which ``eager_launcher(op, *call arguments)`` may return a direct
        launcher that callers keep per call signature (eager host time near a bare launch).

    A backend that caches probes may also define ``cache_clear()``; ``reset_caches`` calls it.
    """

    name: str
    ops: frozenset[str]
    eager_ops: frozenset[str]
    rope_in_activation_dtype: bool

    def is_available(self) -> tuple[bool, str]:
        """Whether it can run at all here, and why; lazy, cached, no GPU work at import."""

    def supports(self, op: str, case: Case) -> tuple[bool, str]:
        """Whether it can run ``op`` on ``case``, and why."""


_loaded: dict[str, Any] = {}
_logged: set[tuple[str, str, str]] = set()


class _Unusable:
    """Stands in for a backend that cannot be imported or breaks the protocol; never available."""

    ops: frozenset[str] = frozenset()
    rope_in_activation_dtype = False

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason

    def is_available(self) -> tuple[bool, str]:
        return False, self.reason

    def supports(self, op: str, case: Case) -> tuple[bool, str]:
        return False, self.reason


def _load(name: str) -> Backend:
    module = f"torch_bridge.backends.{BACKEND_MODULES[name]}"
    label = {"aiter": "AITER", "bf16": "BF16", "deepgemm": "DeepGEMM"}.get(name, name.capitalize())
    try:
        be = importlib.import_module(module).BACKEND
    except ImportError as e:
        return _Unusable(name, f"{label} backend not importable: {e}")
    except AttributeError:
        return _Unusable(name, f"{label} backend not importable: {module} defines no BACKEND")
    if not isinstance(be, Backend):
        missing = [a for a in ("name", "ops", "rope_in_activation_dtype", "is_available",
                               "supports") if not hasattr(be, a)]
        return _Unusable(name, f"{label} backend object {module}.BACKEND does not satisfy the "
                               f"backend protocol: it lacks {', '.join(missing)}")
    return be


def get_backend(name: str) -> Backend:
    """The ``BACKEND`` object of backend ``name`` (imported on first use).

    A module that fails to import, has no ``BACKEND`` or one that breaks the protocol yields a
    stand-in whose ``is_available`` gives the reason
    (``"<Name> backend not importable: <error>"``).
    """
    if name not in BACKENDS:
        raise ValueError(
            f"unknown backend {name!r}; expected 'auto' or one of {', '.join(BACKENDS)}")
    if name not in _loaded:
        _loaded[name] = _load(name)
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
    if op == "wo_a" and "wo_a_bf16" in be.ops:
        return be.supports(op, case)
    if op == "wo_a":
        missing = [o for o in FP8_CHAIN if o not in be.ops]
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
    if op not in be.ops:
        return False, f"{name} does not implement {op}"
    return be.supports(op, case)


def _log_once(op: str, name: str, reason: str) -> None:
    key = (op, name, reason)
    if key not in _logged:
        _logged.add(key)
        log.info("%s: backend %s not used: %s", op, name, reason)


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


def select(op: str, case: Case, backend: str | None = None) -> Backend:
    """Pick the backend object for ``op``; see the module docstring for the rules."""
    return get_backend(resolve(op, case, backend)[0])


def picked(op: str, table: dict[str, tuple[bool, str]]) -> str | None:
    """The backend a call without ``backend=`` runs for ``op`` given ``explain``-style ``table``:
    ``WOA_BACKEND``'s if it names one (``None`` if that one cannot run), else ``auto``'s."""
    name = requested_backend(None)
    if name != "auto":
        return name if table[name][0] else None
    return next((cand for cand in AUTO_ORDER[op] if table[cand][0]), None)


def explain(op: str, case: Case) -> dict[str, tuple[bool, str]]:
    """``{backend: (ok, reason)}`` for every registered backend, saying which one runs.

    ``ok`` is False, with the reason, for one that is unavailable or does not implement ``op``,
    and for every backend when ``case``'s device does not exist here ("no such device here").
    The reason of the backend a call without ``backend=`` runs starts with ``"auto picks it: "``
    (or ``"WOA_BACKEND picks it: "``); one that could run but is not picked says why not, so
    that no row reads as what runs when it is not.
    """
    from . import _capability

    missing = _capability.device_missing(case.device_type)
    if missing:
        return {name: (False, missing) for name in BACKENDS}
    table = {name: check(name, op, case) for name in BACKENDS}
    chosen = picked(op, table)
    requested = requested_backend(None)
    for name, (ok, why) in table.items():
        if name == chosen:
            by = "auto" if requested == "auto" else "WOA_BACKEND"
            table[name] = (ok, f"{by} picks it: {why}")
        elif ok and requested != "auto":
            table[name] = (ok, f"{why}; not used: WOA_BACKEND={requested}")
        elif ok and name not in AUTO_ORDER[op]:
            table[name] = (ok, f"{why}; only when named: auto does not take {name} for {op}")
        elif ok:
            table[name] = (ok, f"{why}; auto takes {chosen} first")
    return table


def reset_caches() -> None:
    """Forget loaded backends, cached probes, logged reasons and the entry points' call plans
    (tests, env changes)."""
    from . import _capability

    _capability.cache_clear()
    imported = (sys.modules.get(f"torch_bridge.backends.{m}") for m in BACKEND_MODULES.values())
    for be in {*_loaded.values(), *(getattr(m, "BACKEND", None) for m in imported)} - {None}:
        clear = getattr(be, "cache_clear", None)
        if clear is not None:
            clear()
    _loaded.clear()
    _logged.clear()
    for forget in _on_reset:
        forget()


#: Callbacks that drop plans built from dispatch decisions (``ops`` registers its plan cache).
_on_reset: list = []
