"""``WoAProjection``: a checkpoint's ``wo_a`` on the fastest correct path, with the reason if not.

The FP8 chain on a backend is its ``inverse_rope_group_quant`` followed by its
``batched_gemm_a8w8_mxscale``; the BF16 chain (``bf16`` backend) is the fallback. ``backend="auto"``
walks ``_dispatch.AUTO_ORDER["wo_a"]`` (aiter, triton, bf16); the pure-torch FP8 chain runs only
when asked for by name (``backend="torch"`` or ``WOA_BACKEND=torch``). The choice is made once per
(device, activation dtype, head_dim) at the first call and cached; each rejection is logged once.
A call plan (backend, tensors on the call's device) is kept per call signature (shapes, strides,
dtypes and devices of ``o`` and ``positions``), so a repeated call only looks it up and launches.

The BF16 fallback is for a valid checkpoint the FP8 path cannot take (an unquantized weight, or
finite positive float scales that are not powers of two); a corrupt checkpoint (NaN fp8 weight
bytes, NaN/Inf/zero/negative scales, E8M0 NaN bytes) raises ``ValueError`` instead.
"""

from __future__ import annotations

import collections
import functools
import logging
import pathlib
import threading
import weakref
from typing import Any, NamedTuple

import torch

import woa_jax
from woa_jax import AITER_AMAX_FLOOR, checks

from . import _capability, _dispatch, _shapes, _weights, interop, ops
from ._dispatch import BackendName, Case

log = logging.getLogger("woa")

_WO_A = _weights.Projection("wo_a", "weight", "weight_scale", "[G * N, K]", "[G, N, K]",
                            "WoAProjection")
#: Call plans kept per projection; the oldest go first beyond this many signatures.
_PLAN_LIMIT = 64


class _Plan(NamedTuple):
    """What one call signature runs: ``kind`` is ``"empty"``, ``"bf16"``, ``"fused"`` (the
    backend's own ``wo_a_fp8``) or ``"chain"`` (its quant, then its GEMM). ``eager`` is the
    backend's direct launcher for later plain eager calls once asked for (``False`` where it
    binds none; ``None`` until asked)."""

    kind: str
    backend: _dispatch.Backend | None
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    w: torch.Tensor | None = None
    ws: torch.Tensor | None = None
    eager: Any = None


class WoAProjection:
    """The ``wo_a`` projection of one layer (one tensor-parallel rank).

    Args:
      weight: ``[G * N, K]`` checkpoint weight: float8_e4m3fn/e4m3fnuz with a scale, or
        bf16/fp16/fp32 with ``weight_scale=None`` (an unquantized checkpoint: BF16 chain only).
      weight_scale: ``[G * N / B, K / B]`` block scales (B = 128, or 32 for V4.1):
        float8_e8m0fnu, uint8 E8M0 bytes, or positive float powers of two. Finite positive float
        scales that are not exact powers of two (V4-Flash-Base) keep the FP8 chain off, with the
        reason, and dequantize as they are.
      num_groups: G of this rank.
      cos_cache, sin_cache: ``[P, rope_dim / 2]`` RoPE tables of this layer (fp32 for the BF16
        chain as upstream; AITER gets them converted to the activation dtype once per device).
      rope_dim: the layer's rotated lanes per head (64 in DeepSeek V4); the tables must have
        ``rope_dim / 2`` columns. ``None`` takes the width from the tables.
      backend: ``"auto"`` (default; ``WOA_BACKEND`` applies) or a backend name, which must run the
        chain or the call raises ``BackendUnavailableError`` with the reason.
      amax_floor: the activation quantizer's floor, a finite positive float (1e-8, AITER's).
      config: a ``woa_jax.DSV4Config`` or name the weight must match: ``num_groups`` of its
        groups (``_shapes.check_wo_a``). Without one, a weight with the released K (4096) must
        hold groups of the released N (1024): a wrong ``num_groups`` fails here, not at a call.
      check_finite: check ``o`` for NaN/Inf on every call (``ValueError`` naming the element; a
        device sync per call). ``None`` reads ``WOA_CHECK_FINITE`` here; off, it costs nothing.

    Raises:
      TypeError: a weight, scale or table of the wrong dtype, a ``num_groups`` that is not an int.
      ValueError: a wrong shape, a ``num_groups`` or ``config`` that does not tile the weight, a
        table width other than ``rope_dim / 2``, a bad ``amax_floor``, or a corrupt checkpoint
        (``woa_jax.checks.check_wo_a_weight_values``: NaN fp8 bytes, NaN/Inf/zero/negative float
        scales, the E8M0 NaN byte).

    Validation happens once here, as for ``WoBProjection`` (``_weights.take_weight``): rank,
    dtypes, scale shape (``woa_jax.check_wo_a_weight``), values, and the lossless E8M0
    conversion. The FP8 weight is kept as a zero-copy ``[G, N, K]`` view; the BF16 dequantized
    weight is built only if the BF16 chain runs (``weight_bf16``).
    """

    @interop.jax_io()
    def __init__(self, weight, weight_scale, num_groups: int, cos_cache, sin_cache, *,
                 rope_dim: int | None = 64, backend: BackendName = "auto",
                 amax_floor: float = AITER_AMAX_FLOOR,
                 config: woa_jax.DSV4Config | str | None = None,
                 check_finite: bool | None = None):
        finite = ops.finite_check_wanted(check_finite)
        (self.block, self.weight_fp8, self.weight_scale_e8m0,
         self.fp8_unavailable) = _weights.take_weight(
            weight, weight_scale, num_groups, _WO_A,
            lambda w, s: _wo_a_block(w, s, num_groups, config))
        ops.require_torch(cos_cache=cos_cache, sin_cache=sin_cache)
        ops.check_weight_device(cos_cache=cos_cache, sin_cache=sin_cache)  # copied per device
        cshape = checks.check_rank(cos_cache, 2, "cos_cache", "[P, rope_dim / 2]")
        if tuple(sin_cache.shape) != cshape:
            raise ValueError(f"cos_cache and sin_cache must have the same shape, got {cshape} "
                             f"and {tuple(sin_cache.shape)}")
        checks.check_dtype(cos_cache, _weights.PLAIN_NAMES, "cos_cache")
        checks.check_dtype(sin_cache, _weights.PLAIN_NAMES, "sin_cache")
        if rope_dim is not None and cshape[1] * 2 != rope_dim:
            raise ValueError(
                f"cos_cache [P, rope_dim / 2] = {cshape} rotates {2 * cshape[1]} lanes per head, "
                f"but this layer's rope_dim is {rope_dim}: pass the layer's table "
                f"({rope_dim // 2} columns) or rope_dim={2 * cshape[1]}")
        self.amax_floor = checks.check_amax_floor(amax_floor)
        _dispatch.requested_backend(backend)  # reject a bad name now, not at the first call
        rows, self.k = weight.shape
        self.num_groups = num_groups
        self.n = rows // num_groups
        self.cos_cache, self.sin_cache = cos_cache, sin_cache
        self._backend = backend
        self._weight2d, self._scale = weight, weight_scale
        self._w_bf16: torch.Tensor | None = None
        self._paths: dict[tuple, tuple[str, str | None]] = {}
        #: The signature of the last call's ``o`` (``path`` and ``fallback_reason`` follow it).
        self._last: tuple | None = None
        self._per_device: dict[tuple, torch.Tensor] = {}
        #: Call signature -> its plan (with its eager launcher), for the layer's calls and for
        #: ``wo_a_fp8``'s (keys starting with ``"wo_a_fp8"``).
        self._plans: dict[tuple, _Plan] = {}
        #: Whether every call checks ``o`` for NaN/Inf first (a device sync per call).
        self.check_finite = finite
        _LAYERS.add(self)

    @classmethod
    def from_tensors(cls, weight, weight_scale, num_groups: int, cos_cache, sin_cache,
                     **kwargs) -> WoAProjection:
        """Build from in-memory checkpoint tensors (same arguments as the constructor)."""
        return cls(weight, weight_scale, num_groups, cos_cache, sin_cache, **kwargs)

    @classmethod
    def from_checkpoint(cls, path: str | pathlib.Path, layer: int, tp_rank: int = 0,
                        tp_size: int = 1, *, config: woa_jax.DSV4Config | str | None = None,
                        num_groups: int | None = None, layer_kind: str | None = None,
                        cos_cache=None, sin_cache=None, max_positions: int | None = None,
                        device: torch.device | str | None = None,
                        **kwargs) -> WoAProjection:
        """Read layer ``layer``'s ``wo_a`` (one TP rank) from a safetensors checkpoint.

        Args:
          path: ``.safetensors`` file or checkpoint directory (``torch_bridge.checkpoint``).
          layer: layer index; tp_rank, tp_size: this rank, the TP degree (must divide G).
          config: a ``woa_jax.DSV4Config`` or name. Default: the released config whose
            ``o_groups * o_lora_rank``, K and weight block match the tensors (all released
            configs share one RoPE table per layer kind).
          num_groups: G of the tensor stored in the checkpoint; default ``config.o_groups``,
            else ``o_groups`` of a ``config.json`` beside it, else rows / 1024
            (``checkpoint.N_DEFAULT``). A checkpoint already split per rank stores ``G_l``
            groups: read it with ``tp_size=1``.
          layer_kind: ``"compress"`` or ``"window"``; default from ``compress_ratios`` in a
            ``config.json`` beside the checkpoint. Needed unless cos/sin are given.
          cos_cache, sin_cache: ``[P, rd / 2]`` tables to use instead of building them.
          max_positions: rows of the built tables (default all P = 1,048,576: 128 MiB of fp32).
          device: where to put weight, scale and tables (default CPU).
          **kwargs: ``backend``, ``amax_floor``, ``rope_dim`` (default the config's),
            ``check_finite``.

        Raises:
          TypeError: ``layer``, a rank or ``num_groups`` that is not an integer.
          CheckpointError: a missing path, an unreadable file, or a layer the checkpoint does not
            have (the message lists those it has); ``NonFiniteTensorError``: NaN/Inf in it.
          ValueError: a ``config`` or ``num_groups`` that does not tile the stored weight (the
            message names both), a ``device`` this process cannot use, no RoPE table.
        """
        from . import checkpoint

        t, cos_cache, sin_cache, cfg = checkpoint.load_wo_a_layer(
            path, layer, tp_rank, tp_size, config=config, num_groups=num_groups,
            layer_kind=layer_kind, cos_cache=cos_cache, sin_cache=sin_cache,
            max_positions=max_positions, device=device)
        if cfg is not None:
            kwargs.setdefault("rope_dim", cfg.rope_dim)
        return cls(t.weight, t.scale, t.local_groups, cos_cache, sin_cache, config=cfg, **kwargs)

    # -- state ---------------------------------------------------------------------------------

    @property
    def weight(self) -> torch.Tensor:
        """The checkpoint weight ``[G * N, K]`` as loaded."""
        return self._weight2d

    @property
    def weight_bf16(self) -> torch.Tensor:
        """The dequantized ``[G, N, K]`` bf16 weight, built on first use and cached."""
        if self._w_bf16 is None:
            self._w_bf16 = _weights.dequant_bf16(self._weight2d, self._scale, self.block,
                                                 _WO_A).view(self.num_groups, self.n, self.k)
        return self._w_bf16

    @property
    def path(self) -> str:
        """Backend running the chain: of the last call, else as decided for bf16 ``o`` with
        ``Dh = 512`` on the weight's device."""
        return self._decision()[0]

    @property
    def fallback_reason(self) -> str | None:
        """Why ``path`` is not the first choice of ``auto`` (``None`` when it is, or when a
        backend was requested explicitly), e.g. ``"bfloat16 checkpoint has no scale"``."""
        return self._decision()[1]

    def explain(self, o=None) -> dict[str, tuple[bool, str]]:
        """``{backend: (ok, reason)}`` for this layer's chain (on ``o``'s case, if given)."""
        return _dispatch.explain("wo_a", self._case(*self._case_args(o)))

    # -- dispatch ------------------------------------------------------------------------------

    def _case_args(self, o) -> tuple:
        if o is None:
            return self._weight2d.device, torch.bfloat16, 512
        return o.device, o.dtype, int(o.shape[2])

    def _case(self, device, act_dtype, head_dim) -> Case:
        return _dispatch.wo_a_case(
            act_dtype, self.cos_cache, head_dim, device_type=torch.device(device).type,
            fp8_dtype=self._weight2d if self.weight_fp8 is not None else None,
            quant_group_size=self.block, num_groups=self.num_groups, n=self.n, k=self.k,
            amax_floor=self.amax_floor, fp8_unavailable=self.fp8_unavailable)

    def _decision(self, key: tuple | None = None) -> tuple[str, str | None]:
        if key is None and self._last is not None:
            shape, _, dtype, device = self._last
            key = (device, dtype, int(shape[2]))
        key = key or self._case_args(None)
        cached = (key, ops.backend_signature(self._backend))
        if cached not in self._paths:
            self._paths[cached] = self._decide(self._case(*key))
        return self._paths[cached]

    def _forget_plans(self) -> None:
        self._plans.clear()
        self._paths.clear()

    def _decide(self, case: Case) -> tuple[str, str | None]:
        cand, reasons = _dispatch.resolve("wo_a", case, self._backend)
        why = None
        if reasons:
            why = self.fp8_unavailable if (cand == "bf16" and self.fp8_unavailable) \
                else "; ".join(reasons)
            log.info("wo_a runs on %s (%s): %s", cand, case.device_type, why)
        return cand, why

    def _on(self, what: str, device: torch.device, dtype: torch.dtype | None = None):
        """``what`` (``"w"``, ``"ws"``, ``"w_bf16"``, ``"cos"``, ``"sin"``) on ``device``, as
        ``dtype`` when given, contiguous; converted once and cached (no copy when it already is)."""
        key = (what, str(device), dtype)
        if key not in self._per_device:
            ops.refuse_capture(torch.device(device))
            src = {"w": lambda: self.weight_fp8, "ws": lambda: self.weight_scale_e8m0,
                   "w_bf16": lambda: self.weight_bf16, "cos": lambda: self.cos_cache,
                   "sin": lambda: self.sin_cache}[what]()
            made = src.to(device=device, dtype=dtype or src.dtype).contiguous()
            self._per_device[key] = made if made is src else ops.ready_everywhere(made)
        return self._per_device[key]

    # -- call ----------------------------------------------------------------------------------

    @interop.jax_io()
    def __call__(self, o, positions, *, overwrite_o: bool = False):
        """``o [S, H, Dh]``, ``positions [>= S]`` -> ``[S, G, N]`` bf16 (JAX in, JAX out).

        Args:
          o: ``[S, H, Dh]`` attention output (bf16/fp16/fp32), contiguous, on the layer's tables'
            device or any other (weights and tables are copied there once).
          positions: ``[>= S]`` int32/int64 with the contract ``0 <= p < P``; out-of-range values
            are clamped to ``[0, P - 1]`` (AITER's behaviour) on every path.
          overwrite_o: allow the BF16 chain to rotate ``o`` in place instead of copying it (for
            engines whose ``o`` is a temporary); ``o``'s contents are then unspecified. The FP8
            chain never writes ``o`` and ignores it.

        Returns:
          ``[S, G, N]`` bf16; ``S = 0`` gives ``[0, G, N]``.

        Raises:
          TypeError: a non-tensor argument or a wrong dtype.
          ValueError: a wrong shape, stride or device mix.
          BackendUnavailableError: the requested backend cannot run the chain.
        """
        if self.check_finite:
            ops.check_finite(o=o)
        key = (ops.tensor_signature(o), ops.tensor_signature(positions),
               ops.backend_signature(self._backend))
        plan = self._plans.get(key)
        if plan is not None and plan.eager and not overwrite_o:
            out = plan.eager(o, positions)
            if out is not None:
                self._last = key[0]
                return out
        if plan is None:
            plan = self._plan(o, positions)
            ops._remember(key, plan, self._plans, _PLAN_LIMIT)
        self._last = key[0]
        if plan.kind == "empty":
            return torch.empty((0, self.num_groups, self.n), dtype=torch.bfloat16,
                               device=o.device)
        if plan.kind == "bf16":
            out = plan.backend.wo_a_bf16(o, positions, plan.cos, plan.sin, plan.w,
                                         self.num_groups, overwrite_o=overwrite_o)
            if not overwrite_o:
                self._bind_eager(key, plan, "wo_a_bf16", o, positions, plan.cos, plan.sin,
                                 plan.w, self.num_groups)
            return out
        if plan.kind == "fused":  # the backend runs the chain itself (fused at decode)
            out = plan.backend.wo_a_fp8(o, positions, plan.cos, plan.sin, plan.w, plan.ws,
                                        self.num_groups, amax_floor=self.amax_floor,
                                        dtype=torch.bfloat16)
            self._bind_eager(key, plan, "wo_a_fp8", o, positions, plan.cos, plan.sin, plan.w,
                             plan.ws, self.num_groups, self.amax_floor)
            return out
        x_fp8 = torch.empty((o.shape[0], self.num_groups, self.k), dtype=plan.w.dtype,
                            device=o.device)
        x, xs = plan.backend.inverse_rope_group_quant(
            o, positions, plan.cos, plan.sin, self.num_groups, self.block,
            amax_floor=self.amax_floor, x_fp8=x_fp8)
        return plan.backend.batched_gemm_a8w8_mxscale(x, plan.w, xs.view(torch.uint8), plan.ws,
                                                      dtype=torch.bfloat16)

    def _bind_eager(self, key: tuple, plan: _Plan, op: str, *args) -> None:
        """Once per call signature: keep the backend's direct launcher for later plain eager
        calls (``Backend.eager_launcher``) in the plan, ``False`` where it binds none."""
        if plan.eager is not None:
            return
        be = plan.backend
        launcher = be.eager_launcher(op, *args) if op in be.eager_ops else None
        ops._remember(key, plan._replace(eager=launcher or False), self._plans, _PLAN_LIMIT)

    def _plan(self, o, positions) -> _Plan:
        """Validate a call signature and plan it: the backend and its tensors on ``o``'s device."""
        ops.require_torch(o=o, positions=positions)
        s, h, dh, _ = checks.check_rope_inputs(o, positions, self.cos_cache, self.sin_cache)
        if h * dh != self.num_groups * self.k:
            raise ValueError(
                f"o [S, H, Dh] = {tuple(o.shape)} gives G * K = {h * dh}, but the weight expects "
                f"num_groups * K = {self.num_groups} * {self.k} = {self.num_groups * self.k}"
            )
        ops.check_contiguous(o, "o")
        device = ops.one_device(o=o, positions=positions)
        name, _ = self._decision((o.device, o.dtype, dh))
        if s == 0:
            return _Plan("empty", None)
        be = _dispatch.get_backend(name)
        if "wo_a_bf16" in be.ops:
            # On CPU the BF16 chain multiplies in fp32 (exact upcast): hand it the fp32 copy
            # once instead of upcasting the whole weight on every call.
            w_dtype = torch.float32 if device.type == "cpu" else None
            return _Plan("bf16", be, self._on("cos", device), self._on("sin", device),
                         self._on("w_bf16", device, w_dtype))
        rope_dtype = o.dtype if be.rope_in_activation_dtype else None
        kind = "fused" if "wo_a_fp8" in be.ops else "chain"
        return _Plan(kind, be, self._on("cos", device, rope_dtype),
                     self._on("sin", device, rope_dtype), self._on("w", device),
                     self._on("ws", device))

    def __repr__(self) -> str:
        kind = checks.dtype_name(self._weight2d)
        return (f"WoAProjection(G={self.num_groups}, N={self.n}, K={self.k}, weight={kind}, "
                f"block={self.block})")


def _wo_a_block(weight: torch.Tensor, scale: torch.Tensor | None, num_groups: int,
               config) -> int | None:
    """``wo_a``'s shape rules for ``_weights.take_weight``: an fp8 weight's scale tiles it
    (``woa_jax.check_wo_a_weight``; returns B), and ``num_groups`` groups of ``config`` tile it
    (``_shapes.check_wo_a``)."""
    block = None if scale is None else woa_jax.check_wo_a_weight(weight, scale, num_groups)[2]
    _shapes.check_wo_a(*weight.shape, block, num_groups, config, what="weight")
    return block


@interop.jax_io()
def wo_a_bf16(o, positions, cos_cache, sin_cache, weight, weight_scale, num_groups: int, *,
              overwrite_o: bool = False):
    """The BF16 chain as a function (``woa_jax.wo_a_bf16``'s arguments) -> ``[S, G, N]`` bf16.

    Args:
      o, positions, cos_cache, sin_cache: as ``WoAProjection.__call__`` and its tables (the rope
        width is taken from the tables).
      weight, weight_scale, num_groups: the checkpoint's ``[G * N, K]`` weight and its scales
        (or an unquantized weight and ``None``), as ``WoAProjection``.
      overwrite_o: allow the rotation to run in place on ``o`` (``WoAProjection.__call__``).

    Raises:
      TypeError, ValueError: as ``WoAProjection`` and its call.
    """
    proj = _prepared(weight, weight_scale, num_groups, cos_cache, sin_cache, backend="bf16")
    # The inputs are torch tensors here: the layer call without its JAX wrapper.
    return proj.__call__.__wrapped__(proj, o, positions, overwrite_o=overwrite_o)


#: Prepared layers of the functional forms, newest last.
_PREPARED: collections.OrderedDict[tuple, WoAProjection] = collections.OrderedDict()
_PREPARED_LAYERS = 4
_PREPARED_LOCK = threading.Lock()


def _forget_all_plans() -> None:
    for proj in list(_LAYERS):
        proj._forget_plans()


#: Every live layer, so that ``_dispatch.reset_caches`` reaches their plans too.
_LAYERS: weakref.WeakSet[WoAProjection] = weakref.WeakSet()
_dispatch._on_reset.append(_forget_all_plans)


def _prepared(weight, weight_scale, num_groups: int, cos_cache, sin_cache, **options):
    """The ``WoAProjection`` of the functional forms, reused while its tensors are unchanged.

    Building one checks every weight byte and converts the weight, which is far more host and
    device work than the call itself; a later call with the same tensor objects, unmodified
    (same data pointer and version counter), reuses it. The last ``_PREPARED_LAYERS`` distinct
    weights are kept, with their prepared copies, until newer ones push them out (each holds its
    tensors, so a pointer cannot be reused for other data while cached); a model with many
    layers should hold one ``WoAProjection`` per layer.
    """
    if not all(map(_is_tensor, (weight, cos_cache, sin_cache))) or not (
            weight_scale is None or _is_tensor(weight_scale)):
        return WoAProjection(weight, weight_scale, num_groups, cos_cache, sin_cache,
                             rope_dim=None, **options)
    # Typed like the ops' signatures: 2.0 == 2 and True == 1 would otherwise reuse a layer
    # whose checks accepted another value. Spelled out: this runs on every call.
    key = (type(num_groups), num_groups, tuple(options.items()),
           tuple(map(type, options.values())), _state(weight),
           None if weight_scale is None else _state(weight_scale), _state(cos_cache),
           _state(sin_cache))
    try:
        hit = _PREPARED.get(key)
    except TypeError:  # an unhashable option: the layer's checks name it
        hit = None
    if hit is not None:
        try:
            _PREPARED.move_to_end(key)
        except KeyError:  # another thread pushed it out meanwhile: it is still valid
            pass
        return hit
    if _capturing():
        raise RuntimeError(
            "wo_a_fp8 / wo_a_bf16 got a weight they have not prepared while a CUDA graph is "
            f"being captured: the functions keep the last {_PREPARED_LAYERS} weights, and "
            "preparing one checks and copies it with host work a capture cannot hold. Hold a "
            "WoAProjection per layer (a model with many layers should), or call the function "
            "on each weight before capturing")
    proj = WoAProjection(weight, weight_scale, num_groups, cos_cache, sin_cache, rope_dim=None,
                         **options)
    with _PREPARED_LOCK:
        _PREPARED[key] = proj
        evicted = len(_PREPARED) > _PREPARED_LAYERS
        while len(_PREPARED) > _PREPARED_LAYERS:
            _PREPARED.popitem(last=False)
    if evicted:
        _warn_evicted()
    return proj


@functools.cache
def _warn_evicted() -> None:
    """Once per process: a model that calls the functions with more weights than they keep
    prepares a layer on every call, at many times the call's own cost, without another sign."""
    log.warning("wo_a_fp8 / wo_a_bf16 met more than %d distinct weights: each call with a "
                "weight they no longer keep checks and converts it again. Hold a WoAProjection "
                "per layer instead.", _PREPARED_LAYERS)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _is_tensor(t) -> bool:
    return isinstance(t, torch.Tensor)


def _state(t: torch.Tensor) -> tuple:
    """What ``_prepared`` reuses a layer by: the data's address and version, and the
    signature."""
    return t.data_ptr(), t._version, t.shape, t.stride(), t.dtype, t.device


@interop.jax_io()
def wo_a_fp8(o, positions, cos_cache, sin_cache, weight, weight_scale, num_groups: int, *,
             backend: BackendName = "auto", amax_floor: float = AITER_AMAX_FLOOR,
             dtype: torch.dtype = torch.bfloat16):
    """The FP8 chain as a function (``woa_jax.wo_a_fp8``'s arguments) -> ``[S, G, N]`` bf16.

    Unlike ``WoAProjection`` this never falls back to BF16: each op takes the first backend of
    aiter, triton, torch that accepts it (or the named one). Where one backend takes both ops
    and runs the chain itself (triton: one fused kernel at decode sizes), the chain runs there,
    as ``WoAProjection`` runs it; else the two dispatched ops run one after the other. A repeat
    of a call signature with the same, unmodified weight and tables launches directly.

    Args:
      o, positions, cos_cache, sin_cache: as ``inverse_rope_group_quant``.
      weight: ``[G * N, K]`` fp8 checkpoint weight; weight_scale: its ``[G * N / B, K / B]``
        E8M0 bytes or float powers of two.
      num_groups: G.
      backend, amax_floor: as ``inverse_rope_group_quant``.
      dtype: ``torch.bfloat16`` (default) or ``torch.float32`` output.

    Raises:
      TypeError, ValueError: as ``WoAProjection``; also a ``ValueError`` when the scales cannot
        run the FP8 chain (not powers of two) or the weight is unquantized, and a
        ``TypeError`` for another ``dtype``.
      BackendUnavailableError: the requested backend cannot run an op.
    """
    proj = _prepared(weight, weight_scale, num_groups, cos_cache, sin_cache,
                     amax_floor=amax_floor)
    # The tables and the weight are fixed by the prepared layer's key: o and positions and the
    # backend request make the rest of the signature.
    key = ("wo_a_fp8", ops.tensor_signature(o), ops.tensor_signature(positions),
           ops.backend_signature(backend), dtype)
    try:
        plan = proj._plans.get(key)
    except TypeError:  # an unhashable backend: the ops' checks name it
        plan = None
    if plan is not None and plan.eager:
        out = plan.eager(o, positions)
        if out is not None:
            return out
    if proj.fp8_unavailable:
        raise ValueError(f"the FP8 chain cannot run: {proj.fp8_unavailable}")
    if dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"dtype must be torch.bfloat16 or torch.float32, got {dtype}")
    w, ws = proj.weight_fp8, proj.weight_scale_e8m0
    plan = plan or _chain_plan(proj, key, o, positions, cos_cache, sin_cache, backend)
    chain = plan.backend
    if chain is None:
        x, xs = ops.inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups,
                                             proj.block, backend=backend, fp8_dtype=w.dtype,
                                             amax_floor=amax_floor)
        return ops.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype, backend=backend)
    out = chain.wo_a_fp8(o, positions, cos_cache, sin_cache, w, ws, num_groups,
                         amax_floor=amax_floor, dtype=dtype)
    # The direct launcher makes bf16 outputs (the layer's); fp32 calls never bind one.
    if dtype == torch.bfloat16:
        proj._bind_eager(key, plan, "wo_a_fp8", o, positions, cos_cache, sin_cache, w, ws,
                         num_groups, amax_floor)
    return out


def _chain_plan(proj: WoAProjection, key: tuple, o, positions, cos_cache, sin_cache,
                backend) -> _Plan:
    """``wo_a_fp8``'s plan for one call signature (validated on first sight, then kept in the
    layer's plans): ``"fused"`` on the backend that takes both ops and runs the chain itself,
    else ``"chain"`` with no backend (the ops run one by one; also for S = 0)."""
    fp8 = proj.weight_fp8.dtype
    quant = ops._plan_quant(o, positions, cos_cache, sin_cache, proj.num_groups, proj.block,
                            "row", backend, None, None, fp8, proj.amax_floor)
    ops.one_device(o=o, weight=proj.weight_fp8)
    s, g, d = quant.shape
    if d != proj.k:
        raise ValueError(f"o gives group width {d}, the weight K={proj.k}")
    chain = None
    if quant.backend is not None and "wo_a_fp8" in quant.backend.ops:
        x = torch.empty((s, g, d), dtype=fp8, device="meta")
        case = _dispatch.gemm_case(x, proj.weight_fp8, proj.block, torch.bfloat16,
                                   device_type=o.device.type, x_k_contiguous=True)
        if _dispatch.select("batched_gemm_a8w8_mxscale", case, backend) is quant.backend:
            chain = quant.backend
    plan = _Plan("fused" if chain is not None else "chain", chain)
    ops._remember(key, plan, proj._plans, _PLAN_LIMIT)
    return plan


if _capability.env_flag("WOA_CHECK_FINITE", False):  # bound once: nothing per call when off
    wo_a_bf16 = ops.finite_checked(wo_a_bf16, ("o",))
    wo_a_fp8 = ops.finite_checked(wo_a_fp8, ("o",))
