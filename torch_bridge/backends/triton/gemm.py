"""torch launcher of the block-scaled FP8 batched GEMM (``woa_triton::batched_gemm_a8w8_mxscale``).

Three kernels: pointer loads with optional split-K, tensor-descriptor (TMA) tiles, and on Hopper
the wgmma kernel (``wgmma_kernels``, written in Triton's Gluon dialect; its persistent tiles
run the warp-specialized ``wgmma_ws_kernels``, ``configs.warp_specialized``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch.autograd.graph import increment_version

from ...interop import e8m0_bytes
from . import configs, plans
from ._common import (
    Launch,
    chain_pdl,
    current_stream,
    descriptor_launcher,
    direct_launches,
    eager_stream,
    launch_for,
    launch_hooks,
    launcher_op,
    on_device_of,
    output,
    pdl,
    pdl_capable,
    raw_launch,
    rows_contiguous,
    run_direct,
    run_mutating,
    signature,
    triton_launch,
)
from .configs import GemmConfig
from .split_k import split_scratch


@functools.cache
def sm_count(device_index: int | None) -> int:
    """The device's SM count; 4 under the interpreter, so persistent grids loop in CPU tests."""
    from ..._capability import interpreter_on

    if interpreter_on():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


#: ``wgmma_available`` per device index. A plain dict, not ``functools.cache``: the GEMM wrapper
#: asks at trace time under ``torch.compile``, and Dynamo warns on every cache-wrapped call.
_WGMMA_AVAILABLE: dict[int | None, tuple[bool, str]] = {}


def wgmma_available(device_index: int | None) -> tuple[bool, str]:
    """Whether the wgmma GEMM can run on this CUDA device: ``(ok, reason)`` (cached)."""
    found = _WGMMA_AVAILABLE.get(device_index)
    if found is None:
        found = _WGMMA_AVAILABLE[device_index] = _probe_wgmma(device_index)
    return found


def _probe_wgmma(device_index: int | None) -> tuple[bool, str]:
    from ..._capability import interpreter_on

    if interpreter_on():
        return False, "TRITON_INTERPRET=1 runs no wgmma (Gluon) kernels"
    if torch.version.hip is not None:
        return False, "the wgmma GEMM is written for NVIDIA Hopper, not ROCm"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    major, minor = torch.cuda.get_device_capability(device_index)
    if major != 9:
        return False, f"wgmma needs compute capability 9.x (Hopper), this GPU is {major}.{minor}"
    try:
        from . import wgmma_kernels  # noqa: F401
    except ImportError as e:
        return False, f"this Triton has no Gluon Hopper dialect ({e})"
    return True, "ok"


def wgmma_on(device: torch.device) -> bool:
    """Whether the wgmma kernels can run on ``device`` (``wgmma_available``)."""
    return device.type == "cuda" and wgmma_available(device.index)[0]


def chain_dependent(m: int, g: int, n: int, k: int, block: int, device: torch.device) -> bool:
    """Whether the unfused FP8 chain launches its GEMM as the quant's programmatic dependent on
    ``device``: ``configs.chain_dependent``, where ``chain_pdl`` allows."""
    return (device.type == "cuda" and chain_pdl(device.index)
            and configs.chain_dependent(m, g, n, k, block, wgmma=wgmma_on(device)))


def wgmma_chosen(m: int, g: int, n: int, k: int, block: int) -> bool:
    """Whether ``batched_gemm_a8w8_mxscale`` runs this problem on the wgmma kernel by default
    (on the current CUDA device)."""
    return wgmma_available(None)[0] and configs.gemm_config(m, g, n, k, block, wgmma=True).wgmma


def tma_ok(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, block_n: int) -> bool:
    """Whether x, w, out can be viewed as the TMA kernel's 2D ``[M, G*K]``, ``[G*N, K]`` and
    ``[M, G*N]`` (packed inner dims, 16-byte aligned bases and row strides, N % BLOCK_N == 0)."""
    m, g, k = x.shape
    n = w.shape[1]
    return (n % block_n == 0 and x.stride(2) == 1 and x.stride(1) == k and w.is_contiguous()
            and out.stride(2) == 1 and out.stride(1) == n
            and x.stride(0) % 16 == 0 and (out.stride(0) * out.element_size()) % 16 == 0
            and all(t.data_ptr() % 16 == 0 for t in (x, w, out)))


@launcher_op("batched_gemm_a8w8_mxscale", mutates_args=("out",))
def _batched_gemm_a8w8_mxscale_op(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                                  w_scale: torch.Tensor, out: torch.Tensor, block_m: int,
                                  block_n: int, split_k: int, swap_ab: bool, num_warps: int,
                                  num_stages: int, tma: bool, programs_per_sm: int,
                                  wgmma: bool, pdl: bool) -> None:
    _run_gemm(x, w, x_scale, w_scale, out, (block_m, block_n, split_k, swap_ab, num_warps,
                                            num_stages, tma, programs_per_sm, wgmma, pdl))


def _run_gemm(x, w, x_scale, w_scale, out, shape: tuple, scratch: tuple | None = None) -> None:
    """Launch one GEMM call (the op's body; ``scratch``: the caller's split-K memory)."""
    if x.shape[0] == 0:
        return
    run, args = _gemm_launch(x, w, x_scale, w_scale, out, shape, scratch)
    with on_device_of(x):
        run(args)


def _gemm_launch(x, w, x_scale, w_scale, out, shape: tuple, scratch: tuple | None = None):
    """``(launch, runtime arguments)`` of one GEMM call (split-K's scratch taken for it, or
    ``scratch``'s: ``split_scratch``); ``shape`` holds ``GemmConfig``'s fields in order."""
    m = x.shape[0]
    aligned = tuple(t.data_ptr() % 16 == 0 for t in (x, w, out))
    key = ("gemm", *signature(x), *signature(w), *signature(x_scale), *signature(w_scale),
           *signature(out), aligned, *shape)
    run = launch_for(key, lambda: _gemm_plan(x, w, x_scale, w_scale, out, GemmConfig(*shape)))
    path = run.extra[0]
    if path == "tma":
        from triton.tools.tensor_descriptor import TensorDescriptor

        g, k = x.shape[1:]
        n = w.shape[1]
        bm, bn, sb = (run.plan.constexprs[c] for c in ("BLOCK_M", "BLOCK_N", "SB"))
        return run, (TensorDescriptor(x, [m, g * k], [x.stride(0), 1], [bm, sb]),
                     TensorDescriptor(w, [g * n, k], [k, 1], [bn, sb]),
                     TensorDescriptor(out, [m, g * n], [out.stride(0), 1], [bm, bn]),
                     x_scale, w_scale, m, run.grid[0])
    # The pointer and wgmma launches keep their config last in ``extra``: a counter per tile.
    tiles = configs.programs(run.extra[-1], m, x.shape[1], w.shape[1])
    split, parts, counters = split_scratch(out, run.plan.split_k, tiles, scratch)
    if split != run.plan.split_k:  # no counters to be had: the same tile, unsplit
        cfg = dataclasses.replace(run.extra[-1], split_k=split)
        run = launch_for((key, split), lambda: _gemm_plan(x, w, x_scale, w_scale, out, cfg))
    if path == "pointer":
        return run, (x, w, x_scale, w_scale, m, out, parts, counters)
    return run, (*(_descriptor(t, view) for t, view in zip((x, w, out), run.extra[1],
                                                          strict=True)),
                 x_scale, w_scale, m, run.grid[0], parts, counters)


#: Where the pointer kernel's runtime arguments hold the call's tensors (then the scratch).
_POINTER_TENSORS = (0, 1, 2, 3, 5, 6, 7)


def eager_gemm(x, w, x_scale, w_scale, dtype: torch.dtype, out: torch.Tensor | None = None, *,
               dependent: bool = False):
    """For plain eager calls that repeat this call's signature (the ops layer checks that):
    ``go(x, w, x_scale, w_scale, out=None) -> out | None``, the compiled kernel launched
    directly (``None``: this call needs the op's path). ``out``: bind for calls that pass an
    output buffer like it (its 16-byte alignment is checked on each call, its version bumped
    as the op's path does); else each call gets a new output. Split-K's scratch is the current
    stream's, kept for the launches on that stream. ``None`` when there is nothing to bind: no
    launch of this signature yet, the TMA kernel (prefill sizes, not host-bound), or operands
    that the launcher would first repack. ``dependent``: as for ``batched_gemm_a8w8_mxscale``."""
    m, g, k = x.shape
    n = w.shape[1]
    if (not x.is_cuda or m == 0 or any(t.stride(-1) != 1 for t in (x, w, x_scale, w_scale))
            or (out is not None and out.stride(-1) != 1)):
        return None
    device = x.device
    shape = (m, g, n)
    given = out is not None
    y = out if given else torch.empty(shape, dtype=dtype, device=device)
    run, args = default_launch(x, w, x_scale, w_scale, y, dependent=dependent)
    path = run.extra[0]
    if path == "wgmma":
        return WgmmaBound.of(run, args, y)
    if path != "pointer":
        return None
    scratch = args[6:] if run.plan.split_k > 1 else ()
    bound = run.bind(args, _POINTER_TENSORS, current_stream() if scratch else None,
                     5 if given else 4)
    if bound is None:
        return None

    strides = plans.dense(*shape)

    def go(x, w, x_scale, w_scale, out=None):
        y = out if out is not None else torch.empty_strided(shape, strides, dtype=dtype,
                                                            device=device)
        if not bound((x, w, x_scale, w_scale, y, *(scratch or (y, y)))):
            return None
        if out is not None:
            increment_version(out)
        return y
    return go


def default_launch(x, w, x_scale, w_scale, out, *, dependent: bool = False):
    """``(launch, runtime arguments)`` of the launch ``batched_gemm_a8w8_mxscale`` makes on
    these operands without a config (split-K's scratch the current stream's)."""
    m, g, k = x.shape
    cfg = default_config(m, g, w.shape[1], k, k // x_scale.shape[2], x.device, dependent)
    return _gemm_launch(x, w, e8m0_bytes(x_scale), e8m0_bytes(w_scale), out, _fields(cfg))


def default_config(m: int, g: int, n: int, k: int, block: int, device: torch.device,
                    dependent: bool) -> GemmConfig:
    """``configs.gemm_config`` for this device; a programmatic dependent of the chain's quant
    where ``dependent`` (``batched_gemm_a8w8_mxscale``), the device takes one and the GEMM is
    the wgmma kernel. Only the launch differs, never the shape: the bits are the GEMM's alone."""
    cfg = configs.gemm_config(m, g, n, k, block, wgmma=wgmma_on(device))
    if dependent and cfg.wgmma and pdl_capable(device.index):
        return dataclasses.replace(cfg, pdl=True)
    return cfg


def _fields(cfg: GemmConfig) -> tuple:
    """The launcher op's launch-shape arguments, in ``GemmConfig``'s field order."""
    return (cfg.block_m, cfg.block_n, cfg.split_k, cfg.swap_ab, cfg.num_warps, cfg.num_stages,
            cfg.tma, cfg.programs_per_sm, cfg.wgmma, cfg.pdl)


def _gemm_plan(x, w, x_scale, w_scale, out, cfg: GemmConfig) -> Launch:
    """The launch of one GEMM signature; its ``extra`` names the kernel path (``"wgmma"``
    with its descriptor views, ``"tma"`` or ``"pointer"``)."""
    m, g, k = x.shape
    n = w.shape[1]
    block = k // x_scale.shape[2]
    sms = sm_count(x.device.index)
    scales = dict(x_scale=x_scale.stride(), w_scale=w_scale.stride())
    if cfg.wgmma:
        if block % cfg.block_n == 0 and tma_ok(x, w, out, cfg.block_n):
            plan, views = plans.gemm_wgmma(m, g, n, k, block, cfg, sms, x_row=x.stride(0),
                                           y_row=out.stride(0), out_bytes=out.element_size(),
                                           **scales)
            return Launch(plan, ("wgmma", views, cfg))
        # A default shape whose operands the wgmma kernel cannot view (x transposed from
        # [G, M, K], a misaligned base; explicit ones were refused before): the Triton
        # kernels' own shape, as the swapped decode tile is too narrow for tl.dot.
        cfg = configs.gemm_config(m, g, n, k, block)
    out_bf16 = out.dtype == torch.bfloat16
    if cfg.tma and cfg.split_k == 1 and tma_ok(x, w, out, cfg.block_n):
        return Launch(plans.gemm_tma(m, g, n, k, block, cfg, sms, out_bf16=out_bf16, **scales),
                      ("tma",))
    return _pointer_plan(x, w, x_scale, w_scale, out, cfg)


def _pointer_plan(x, w, x_scale, w_scale, out, cfg: GemmConfig) -> Launch:
    """The pointer kernel's launch; its ``extra`` keeps ``cfg`` for an unsplit relaunch."""
    m, g, k = x.shape
    return Launch(plans.gemm_pointer(
        m, g, w.shape[1], k, k // x_scale.shape[2], cfg, cfg.split_k, x=x.stride(),
        w=w.stride(), y=out.stride(), x_scale=x_scale.stride(), w_scale=w_scale.stride(),
        out_bf16=out.dtype == torch.bfloat16, pdl=pdl(x.device.index, cfg.pdl)),
        ("pointer", cfg))


def _descriptor(t: torch.Tensor, view: tuple):
    """Triton's own Gluon descriptor of ``t`` (its launcher reads fields that vary between
    versions)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .wgmma_kernels import smem_layout

    shape, strides, tile = view
    return TensorDescriptor(t, list(shape), list(strides), list(tile),
                            smem_layout(tile, str(t.dtype).removeprefix("torch.")))


#: The wgmma kernel's leading parameters: its three descriptors, then the scale pointers.
_WGMMA_TENSORS = ("x_desc", "w_desc", "y_desc", "xs_ptr", "ws_ptr")


class WgmmaBound:
    """A compiled wgmma GEMM bound like ``_common.Bound``, with x, w, the scales and the output
    open: ``__call__(x, w, x_scale, w_scale, out=None) -> out | None`` (a new output unless one
    of the bound signature is given).

    It launches past Triton's descriptor step (``descriptor_launcher``): each descriptor's
    expansion is kept per base address (the rest of it is fixed by the signature), so a repeat
    builds no descriptor and no CUtensorMap. A split-K launch keeps the scratch of the stream
    it was bound on, and launches on that stream only. ``None`` where the op's path is needed:
    ``eager_stream`` refuses (a given output counts as an input; another stream or a capture,
    when split), x, w or a given output is not 16-byte aligned (the op then runs another
    kernel), a scale's alignment differs (another specialization), or a launch hook wants
    Triton's launch metadata (built from the unexpanded arguments).
    """

    #: Expansions kept per descriptor: more base addresses than a model's layers.
    _KEEP = 256

    def __init__(self, compiled, run, expand, programs: int, views: tuple, tail: tuple,
                 out: torch.Tensor, scales_aligned: tuple[bool, bool],
                 scratch: tuple | None, stream: int | None):
        self._go = raw_launch(compiled, run) or triton_launch(compiled, run)
        self._expand = expand
        self._programs, self._views, self._tail = programs, views, tail
        self._scratch = scratch  # unsplit: the output stands in (never touched)
        self._shape, self._dtype, self._device = tuple(out.shape), out.dtype, out.device
        self._strides = plans.dense(*self._shape)
        self._aligned = scales_aligned
        self._stream = stream
        self._kept: tuple[dict, dict, dict] = ({}, {}, {})

    @classmethod
    def of(cls, run: Launch, args: tuple, out: torch.Tensor) -> WgmmaBound | None:
        """The wgmma launch ``run`` of ``args`` (as ``_gemm_launch`` made them), bound; ``None``
        before its first launch or where Triton's launcher is not the one
        ``descriptor_launcher`` knows (or without ``direct_launches``)."""
        if not direct_launches()[0]:
            return None
        compiled = run.compiled(args)
        found = compiled is not None and descriptor_launcher(compiled)
        if not found or tuple(run.kernel.arg_names[:5]) != _WGMMA_TENSORS:
            return None
        x_scale, w_scale = args[3], args[4]
        tail = tuple(run.options[n] for n in run.kernel.arg_names[len(args):])
        split = run.plan.split_k > 1
        return cls(compiled, *found, run.grid[0], run.extra[1], tail, out,
                   (x_scale.data_ptr() % 16 == 0, w_scale.data_ptr() % 16 == 0),
                   args[7:9] if split else None, current_stream() if split else None)

    def _expanded(self, i: int, t: torch.Tensor) -> list:
        kept = self._kept[i]
        found = kept.get(t.data_ptr())
        if found is None:
            if len(kept) >= self._KEEP:
                kept.clear()
            found = kept[t.data_ptr()] = self._expand(i, _descriptor(t, self._views[i]))
        return found

    def _scratch_addresses(self, y: torch.Tensor) -> tuple[int, int]:
        """Split-K's parts and counters, or (unsplit) the output standing in for both."""
        scratch = self._scratch or (y, y)
        return scratch[0].data_ptr(), scratch[1].data_ptr()

    def __call__(self, x, w, x_scale, w_scale, out=None) -> torch.Tensor | None:
        stream = eager_stream((x, w, x_scale, w_scale) if out is None
                              else (x, w, x_scale, w_scale, out), self._device.index,
                              self._stream)
        enter, leave, wanted = launch_hooks()
        if (stream is None or wanted or x.data_ptr() % 16 or w.data_ptr() % 16
                or (out is not None and out.data_ptr() % 16)
                or (x_scale.data_ptr() % 16 == 0, w_scale.data_ptr() % 16 == 0) != self._aligned):
            return None
        y = out if out is not None else torch.empty_strided(self._shape, self._strides,
                                                            dtype=self._dtype,
                                                            device=self._device)
        # Addresses for the pointer arguments, as ``_common.Bound`` passes them.
        self._go(self._programs, 1, 1, stream,
                 (*self._expanded(0, x), *self._expanded(1, w), *self._expanded(2, y),
                  x_scale.data_ptr(), w_scale.data_ptr(), self._shape[0], self._programs,
                  *self._scratch_addresses(y), *self._tail), enter, leave, False)
        if out is not None:
            increment_version(out)
        return y


def _check_explicit_wgmma(config: GemmConfig, x, w, out, block: int) -> None:
    """An explicit wgmma config must run the wgmma kernel: the default shape falls back to the
    Triton kernels, but an explicit one must not measure another kernel silently."""
    if block % config.block_n or not tma_ok(x, w, out, config.block_n):
        raise ValueError(f"GemmConfig(wgmma=True) needs block_n dividing the scale block "
                         f"({block}) and TMA-viewable operands (x [M, G, K] with packed "
                         f"(G, K), contiguous w, out with packed (G, N), 16-byte aligned); got "
                         f"block_n={config.block_n}, x strides {list(x.stride())}, out strides "
                         f"{list(out.stride())}")
    ok, why = wgmma_available(x.device.index if x.is_cuda else None)
    if ok and not x.is_cuda:
        ok, why = False, f"x is on {x.device}, not on a CUDA device"
    if not ok:
        raise RuntimeError(f"GemmConfig(wgmma=True) cannot run here: {why}")


def batched_gemm_a8w8_mxscale(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                              w_scale: torch.Tensor, *, dtype: torch.dtype = torch.bfloat16,
                              out: torch.Tensor | None = None,
                              config: GemmConfig | None = None,
                              scratch: tuple[torch.Tensor, torch.Tensor] | None = None,
                              dependent: bool = False) -> torch.Tensor:
    """Block-scaled FP8 batched GEMM ``y [M, G, N] = dq(x) @ dq(w)^T`` per group, fp32 accumulation.

    Args:
      x: ``[M, G, K]`` fp8 (K contiguous; a transposed view of ``[G, M, K]`` is fine).
      w: ``[G, N, K]`` fp8, same dtype.
      x_scale: ``[M, G, K / B]`` uint8 or float8_e8m0fnu (1 x B groups, B = 128 or 32).
      w_scale: ``[G, ceil(N / B), K / B]`` uint8 or float8_e8m0fnu (B x B blocks).
      dtype: bf16 or fp32 output.
      out: optional ``[M, G, N]`` output with N contiguous (written in place).
      config: launch shape; ``None`` picks ``configs.gemm_config`` by M and G.
      scratch: ``(parts, counters)`` for a launch that splits K, in place of the device's
        counter pool (``split_k.split_scratch`` says what they must be); a caller that owns
        the memory, as XLA does on ``jax_ops``' callback route, passes its own. Ignored unsplit.
      dependent: the kernel before this call on the stream is the FP8 chain's quant, which
        does not write ``w``: the default shape launches as its programmatic dependent
        (``GemmConfig.pdl``), streaming weight while the quant runs (``chain_dependent``).

    Returns:
      ``out`` (or a new tensor) ``[M, G, N]`` in ``dtype``.

    Raises:
      ValueError: ``out`` has the wrong shape or strides, ``config.split_k`` does not divide
        the K blocks, an explicit wgmma ``config`` does not fit the operands, or ``scratch``
        is given under ``torch.compile`` or fake tensors.
      RuntimeError: an explicit wgmma ``config`` on a device without the wgmma kernel.
    """
    m, g, k = x.shape
    n = w.shape[1]
    block = k // x_scale.shape[2]
    cfg = config or default_config(m, g, n, k, block, x.device, dependent)
    out = output(out, (m, g, n), dtype, x.device)
    x = rows_contiguous(x)
    w = rows_contiguous(w)
    xs, ws = rows_contiguous(e8m0_bytes(x_scale)), rows_contiguous(e8m0_bytes(w_scale))
    if config is not None and config.wgmma:
        _check_explicit_wgmma(config, x, w, out, block)
    configs.check_split(cfg, k // block)
    if scratch is None:
        run_mutating(_batched_gemm_a8w8_mxscale_op, (out,), x, w, xs, ws, out, *_fields(cfg))
    else:  # no op declares a caller's scratch: launched directly, plain eager only
        run_direct(_run_gemm, (out, *scratch), x, w, xs, ws, out, _fields(cfg), tuple(scratch))
    return out
