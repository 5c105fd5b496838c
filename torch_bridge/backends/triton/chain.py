"""torch launchers of the two ``wo_a`` chains.

* ``wo_a_fp8``: one fused kernel at decode sizes (``woa_triton::wo_a_fp8``: the pointer
  kernel, or on Hopper for a wgmma tile the wgmma one), else ``inverse_rope_group_quant`` then
  ``batched_gemm_a8w8_mxscale``.
* ``wo_a_bf16``: at decode sizes one kernel that reads ``o`` and rotates its rope tiles itself
  (``woa_triton::wo_a_bf16_rotating``); at prefill sizes the rotated rope tails alone, then
  the BF16 GEMM reading A from ``o`` and those tails (``woa_triton::wo_a_bf16``); ``o`` is
  never written by either. Else the rope tail rotated by ``inverse_rope`` into a copy
  (``woa_triton::inverse_rope``) or in place (``woa_triton::inverse_rope_``), then a cuBLAS
  bf16 batched GEMM.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from woa_jax import AITER_AMAX_FLOOR

from ...interop import e8m0_bytes
from . import bf16_configs, configs, plans
from ._common import (
    Launch,
    dtype_name,
    last_dims_contiguous,
    launch_for,
    launcher_op,
    on_device_of,
    output,
    rows_contiguous,
    run_direct,
    run_mutating,
    signature,
    target,
)
from .configs import GemmConfig
from .gemm import (
    _descriptor,
    batched_gemm_a8w8_mxscale,
    chain_dependent,
    default_config,
    tma_ok,
    wgmma_available,
    wgmma_on,
)
from .quant import inverse_rope_group_quant
from .split_k import split_scratch

# ---------------------------------------------------------------------------------------------
# The FP8 chain
# ---------------------------------------------------------------------------------------------


@launcher_op("wo_a_fp8", mutates_args=("x_fp8", "x_scale", "out"))
def _wo_a_fp8_op(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                 sin_cache: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                 x_fp8: torch.Tensor, x_scale: torch.Tensor, out: torch.Tensor, amax_floor: float,
                 block_m: int, block_n: int, split_k: int, num_warps: int, num_stages: int,
                 wgmma: bool, pdl: bool) -> None:
    _run_wo_a_fp8(o, positions, cos_cache, sin_cache, w, w_scale, x_fp8, x_scale, out,
                  amax_floor, block_m, block_n, split_k, num_warps, num_stages, wgmma, pdl)


def _run_wo_a_fp8(o, positions, cos_cache, sin_cache, w, w_scale, x_fp8, x_scale, out,
                  amax_floor, block_m, block_n, split_k, num_warps, num_stages, wgmma, pdl,
                  scratch: tuple | None = None) -> None:
    """Launch one fused chain call (the op's body; ``scratch``: the caller's split-K memory)."""
    if o.shape[0] == 0:
        return
    with on_device_of(o):
        run, args = _wo_a_fp8_launch(o, positions, cos_cache, sin_cache, w, w_scale, x_fp8,
                                     x_scale, out, amax_floor, block_m, block_n, split_k,
                                     num_warps, num_stages, wgmma, pdl, scratch)
        run(args)


def _wo_a_fp8_launch(o, positions, cos_cache, sin_cache, w, w_scale, x_fp8, x_scale, out,
                     amax_floor, block_m, block_n, split_k, num_warps, num_stages, wgmma, pdl,
                     scratch: tuple | None = None):
    """``(launch, runtime arguments)`` of one fused chain call, ``wo_a_fp8_kernel`` or with
    ``wgmma`` ``wo_a_fp8_wgmma_kernel`` (split-K's scratch taken for it, or ``scratch``'s:
    ``split_scratch``)."""
    key = ("wo_a_fp8", *signature(o), *signature(cos_cache), sin_cache.stride(), *signature(w),
           *signature(w_scale), *signature(out), amax_floor, block_m, block_n, split_k,
           num_warps, num_stages, wgmma, pdl)

    def make(split: int) -> Launch:
        s, _, dh = o.shape
        g, n, k = w.shape
        block = k // w_scale.shape[2]
        cfg = GemmConfig(block_m, block_n, split_k, True, num_warps, num_stages, wgmma=wgmma,
                         pdl=pdl)
        kinds = dict(fp8=dtype_name(w.dtype), amax_floor=amax_floor,
                     o_dtype=dtype_name(o.dtype), rope_dtype=dtype_name(cos_cache.dtype),
                     target=target())
        rows = dict(o_row=o.stride(0), cos_row=cos_cache.stride(0), sin_row=sin_cache.stride(0))
        if wgmma:
            plan, views = plans.wo_a_fp8_wgmma(
                s, dh, 2 * cos_cache.shape[1], g, n, k, block,
                dataclasses.replace(cfg, split_k=split), w_scale=w_scale.stride(),
                y_row=out.stride(0), out_bytes=out.element_size(), **rows, **kinds)
            return Launch(plan, views)
        return Launch(plans.wo_a_fp8(
            s, dh, 2 * cos_cache.shape[1], g, n, k, block, cfg, split, w=w.stride(),
            w_scale=w_scale.stride(), y=out.stride(), out_bf16=out.dtype == torch.bfloat16,
            **rows, **kinds))

    if wgmma and not tma_ok(x_fp8, w, out, block_n):
        raise ValueError(f"wo_a_fp8: the fused wgmma kernel reads x_fp8 {list(x_fp8.shape)}, "
                         f"w {list(w.shape)} and writes out {list(out.shape)} through TMA: "
                         f"each needs packed inner dims, a 16-byte aligned base and row stride, "
                         f"and N a multiple of block_n {block_n}")
    run = launch_for(key, lambda: make(split_k))
    # Output tiles, one counter each: the grid over its K parts, for either kernel.
    split, parts, counters = split_scratch(out, split_k, math.prod(run.grid) // split_k,
                                           scratch)
    if split != split_k:  # no counters to be had: the same tile, unsplit
        run = launch_for((key, split), lambda: make(split))
    if wgmma:
        x_desc, w_desc, y_desc = (_descriptor(t, view) for t, view in zip(
            (x_fp8, w, out), run.extra, strict=True))
        return run, (x_desc, w_desc, y_desc, o, positions, cos_cache, sin_cache, w_scale,
                     o.shape[0], cos_cache.shape[0], run.grid[0], x_fp8, x_scale, parts,
                     counters)
    return run, (o, positions, cos_cache, sin_cache, w, w_scale, o.shape[0], cos_cache.shape[0],
                 x_fp8, x_scale, out, parts, counters)


def wo_a_fp8(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
             sin_cache: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, num_groups: int,
             *, amax_floor: float = AITER_AMAX_FLOOR, dtype: torch.dtype = torch.bfloat16,
             out: torch.Tensor | None = None, single_kernel: bool | None = None,
             config: GemmConfig | None = None, scratch: tuple[torch.Tensor, ...] | None = None
             ) -> torch.Tensor:
    """The FP8 chain ``y = dq(quant(inv_rope(o))) @ dq(w)^T``: one fused kernel at decode sizes.

    The fused kernel (``wo_a_fp8_kernel``) quantizes, in each program, the activations its tile
    reads and then multiplies them: one launch instead of two, and no gap between them. Its
    products are those of ``inverse_rope_group_quant`` followed by
    ``batched_gemm_a8w8_mxscale`` with the same tiles. The quant group is the weight's scale
    block B.

    Args:
      o: ``[S, H, Dh]`` bf16/fp16/fp32 (token stride may be padded); ``H * Dh = G * K``.
      positions: ``[>= S]`` int32 or int64, clamped to ``[0, P - 1]``.
      cos_cache, sin_cache: ``[P, rd / 2]`` bf16, fp16 or fp32.
      w: ``[G, N, K]`` fp8 (its dtype is the activations' fp8 dtype).
      w_scale: ``[G, ceil(N / B), K / B]`` uint8 or float8_e8m0fnu.
      num_groups: G.
      amax_floor: the quant's amax floor (AITER's 1e-8 or vLLM CUDA's 1e-10).
      dtype: bf16 or fp32 output.
      out: optional ``[S, G, N]`` output with N contiguous (written in place).
      single_kernel: ``None`` runs ``wo_a_fp8_kernel`` where ``configs.wo_a_fp8_chosen`` says
        so; ``True`` requires it, ``False`` runs quant + GEMM.
      config: the fused kernel's launch shape when it runs (a swapped ``GemmConfig``, one
        program per tile: the pointer kernel's, or with ``wgmma=True`` on Hopper the wgmma
        GEMM's swapped tile, ``wo_a_fp8_wgmma_kernel``, whose bits are the quant's and that
        GEMM's with the same tile), else the GEMM's; ``None`` picks by S and G.
      scratch: the caller's memory in place of the launcher's: the quantized activations
        ``x_fp8 [S, G, K]`` (w's dtype) and ``x_scale [S, G, K / B]`` uint8, contiguous (the
        fused kernel's prologue writes them, or the quant), then split-K's
        ``(parts, counters)`` where the GEMM or the fused kernel splits K
        (``split_k.split_scratch``). A caller that owns the memory passes it, as XLA does on
        ``jax_ops``' callback route: a recorded launch must write only memory XLA owns.

    Returns:
      ``out`` (or a new tensor) ``[S, G, N]`` in ``dtype``.

    Raises:
      ValueError: ``o`` and ``w`` do not make ``num_groups`` groups of K,
        ``single_kernel=True`` on a chain the kernel cannot run, a bad ``out`` / ``config``
        (a wgmma one off Hopper),
        or ``scratch`` that does not fit the launch or is given under ``torch.compile``.
    """
    s, h, dh = o.shape
    g, n, k = w.shape
    block = k // w_scale.shape[2]
    if g != num_groups or h * dh != g * k:
        raise ValueError(f"o [S, H, Dh] = {list(o.shape)} and w [G, N, K] = {list(w.shape)} "
                         f"do not make num_groups = {num_groups} groups of K (need H * Dh = G * K)")
    blocker = configs.wo_a_fp8_blocker(dh, 2 * cos_cache.shape[1], block,
                                       config if single_kernel is not False else None, k=k)
    if single_kernel and blocker:
        raise ValueError(f"wo_a_fp8(single_kernel=True) cannot run this chain in one kernel: "
                         f"{blocker}")
    dependent = chain_dependent(s, g, n, k, block, o.device)
    wgmma = wgmma_on(o.device)
    if single_kernel is None:
        single_kernel = blocker is None and configs.wo_a_fp8_chosen(s, g, n, k, block,
                                                                    wgmma=wgmma,
                                                                    dependent=dependent)
    if not single_kernel:
        # An explicit GEMM shape is launched as given, never as a dependent.
        dependent = dependent and config is None
        quant = configs.quant_config(s, heads=h, dependent=dependent)
        x_fp8 = x_scale = split = None
        if scratch is not None:
            gemm = config or default_config(s, g, n, k, block, o.device, dependent)
            x_fp8, x_scale, split = _prologue_scratch(scratch, (s, g, k), block, w.dtype,
                                                      o.device, gemm.split_k)
        x_fp8, x_scale = inverse_rope_group_quant(
            o, positions, cos_cache, sin_cache, g, block, amax_floor=amax_floor,
            x_fp8=torch.empty((s, g, k), dtype=w.dtype, device=o.device) if x_fp8 is None
            else x_fp8, x_scale=x_scale, config=quant)
        return batched_gemm_a8w8_mxscale(x_fp8, w, x_scale, w_scale, dtype=dtype, out=out,
                                         config=config, dependent=dependent, scratch=split)
    cfg = config or configs.wo_a_fp8_config(s, g, n, k, block, wgmma=wgmma)
    configs.check_split(cfg, k // block)
    if cfg.wgmma:
        ok, why = (wgmma_available(o.device.index) if o.is_cuda else
                   (False, f"it needs a CUDA Hopper GPU, o is on {o.device}"))
        if not ok:
            raise ValueError(f"wo_a_fp8: the fused wgmma kernel cannot run here: {why}")
    out = output(out, (s, g, n), dtype, o.device)
    args = (last_dims_contiguous(o), rows_contiguous(positions), rows_contiguous(cos_cache),
            rows_contiguous(sin_cache), rows_contiguous(w), rows_contiguous(e8m0_bytes(w_scale)))
    shape = (float(amax_floor), cfg.block_m, cfg.block_n, cfg.split_k, cfg.num_warps,
             cfg.num_stages, cfg.wgmma, cfg.pdl)
    if scratch is None:
        # The prologue's quantized activations, never returned: the pointer kernel reads them
        # back in the same program; the wgmma kernel keeps them in shared memory and its x
        # descriptor only names their tile.
        x_fp8 = torch.empty((s, g, k), dtype=w.dtype, device=o.device)
        x_scale = torch.empty((s, g, k // block), dtype=torch.uint8, device=o.device)
        run_mutating(_wo_a_fp8_op, (x_fp8, x_scale, out), *args, x_fp8, x_scale, out, *shape)
        return out
    x_fp8, x_scale, split = _prologue_scratch(scratch, (s, g, k), block, w.dtype, o.device,
                                              cfg.split_k)
    # No op declares a caller's scratch: launched directly, plain eager only.
    run_direct(_run_wo_a_fp8, (x_fp8, x_scale, out, *(split or ())), *args, x_fp8, x_scale,
               out, *shape, split)
    return out


def _prologue_scratch(scratch: tuple, shape: tuple, block: int, fp8: torch.dtype,
                      device: torch.device, split_k: int) -> tuple:
    """``(x_fp8, x_scale, (parts, counters) or None)`` of a caller's chain scratch for a launch
    that splits K ``split_k`` ways, checked (the split part by ``split_scratch``);
    ``ValueError`` when it does not fit."""
    s, g, k = shape
    want = 4 if split_k > 1 else 2
    if len(scratch) != want:
        names = "x_fp8, x_scale, parts, counters" if want == 4 else "x_fp8, x_scale"
        raise ValueError(f"wo_a_fp8 scratch: this launch splits K {split_k} ways, so it takes "
                         f"{want} tensors ({names}), got {len(scratch)}")
    x_fp8, x_scale = scratch[:2]
    for t, name, dtype, dims in ((x_fp8, "x_fp8", fp8, shape),
                                 (x_scale, "x_scale", torch.uint8, (s, g, k // block))):
        if (t.dtype != dtype or tuple(t.shape) != dims or not t.is_contiguous()
                or t.device != device):
            raise ValueError(f"wo_a_fp8 scratch: {name} must be contiguous {dtype} "
                             f"{list(dims)} on {device}, got {t.dtype} {list(t.shape)} on "
                             f"{t.device}")
    return x_fp8, x_scale, tuple(scratch[2:]) or None


# ---------------------------------------------------------------------------------------------
# The BF16 chain
# ---------------------------------------------------------------------------------------------

def _launch_inverse_rope(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                         sin_cache: torch.Tensor, y: torch.Tensor) -> None:
    """Rotate ``o``'s rope tails into ``y``: ``o`` itself (in place), a ``[S, H, Dh]`` copy, or
    a ``[S, H, rd]`` buffer of the tails alone."""
    if o.shape[0] == 0:
        return
    run, args = _inverse_rope_launch(o, positions, cos_cache, sin_cache, y)
    with on_device_of(o):
        run(args)


def _inverse_rope_launch(o, positions, cos_cache, sin_cache, y):
    """``(launch, runtime arguments)`` of one rotation call."""
    mode = "in place" if y is o else ("tails" if y.shape[2] != o.shape[2] else "copy")
    key = ("inverse_rope", *signature(o), *signature(cos_cache), mode)
    run = launch_for(key, lambda: Launch(plans.inverse_rope(
        *o.shape, 2 * cos_cache.shape[1], mode, o_dtype=dtype_name(o.dtype),
        rope_dtype=dtype_name(cos_cache.dtype), target=target())))
    return run, (o, positions, cos_cache, sin_cache, o.shape[0] * o.shape[1],
                 cos_cache.shape[0], o.stride(0), o.stride(1), cos_cache.stride(0),
                 sin_cache.stride(0), y, y.stride(0), y.stride(1))


@launcher_op("inverse_rope", mutates_args=("y",))
def _inverse_rope_op(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                     sin_cache: torch.Tensor, y: torch.Tensor) -> None:
    _launch_inverse_rope(o, positions, cos_cache, sin_cache, y)


@launcher_op("inverse_rope_", mutates_args=("o",))
def _inverse_rope_inplace_op(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                             sin_cache: torch.Tensor) -> None:
    _launch_inverse_rope(o, positions, cos_cache, sin_cache, o)


def _check_rotation(o: torch.Tensor, cos_cache: torch.Tensor, overwrite_o: bool) -> None:
    """``inverse_rope``'s requirements on ``o`` and the tables (see there)."""
    rd = 2 * cos_cache.shape[1]
    if rd & (rd - 1) or rd > o.shape[2]:
        raise ValueError(f"inverse_rope: rd = 2 * cos_cache.shape[1] = {rd} must be a power of "
                         f"two (a Triton tile) no larger than head_dim {o.shape[2]}")
    if o.dtype != torch.bfloat16:
        raise TypeError(f"inverse_rope is the BF16 chain's: o must be bfloat16, got {o.dtype}")
    if o.stride(2) != 1 or (overwrite_o and o.stride(1) != o.shape[2]):
        raise ValueError(f"inverse_rope needs o with a contiguous Dh dim (and packed [H, Dh] "
                         f"dims in place), got strides {list(o.stride())}")


def inverse_rope(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                 sin_cache: torch.Tensor, *, overwrite_o: bool = False) -> torch.Tensor:
    """Inverse GPT-J RoPE of the rope tail of each head (fp32 math, bf16 out), the BF16 chain's.

    ``overwrite_o=False`` reads ``o`` once and writes a rotated copy once (NoPE lanes copied);
    ``overwrite_o=True`` rotates only the tail of ``o`` itself. Both give the same bits.

    Args:
      o: ``[S, H, Dh]`` bf16 with Dh contiguous (``overwrite_o``: packed (H, Dh) dims).
      positions: ``[>= S]`` int32 or int64, clamped to ``[0, P - 1]``.
      cos_cache, sin_cache: ``[P, rd / 2]`` bf16, fp16 or fp32; ``rd`` a power of two (a
        Triton tile) no larger than Dh.
      overwrite_o: rotate ``o`` in place (for callers whose ``o`` is a temporary).

    Returns:
      ``o`` when ``overwrite_o``, else a new contiguous ``[S, H, Dh]`` bf16 tensor.

    Raises:
      ValueError: a bad ``rd`` or strides of ``o``.
      TypeError: ``o`` is not bf16.
    """
    _check_rotation(o, cos_cache, overwrite_o)
    tables = rows_contiguous(positions), rows_contiguous(cos_cache), rows_contiguous(sin_cache)
    if overwrite_o:
        run_mutating(_inverse_rope_inplace_op, (o,), o, *tables)
        return o
    y = torch.empty(o.shape, dtype=o.dtype, device=o.device)
    run_mutating(_inverse_rope_op, (y,), o, *tables, y)
    return y


@functools.cache
def _tma_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def _tma_loads(o: torch.Tensor) -> bool:
    """Whether ``o``'s device has tensor-memory loads (an NVIDIA GPU from Hopper on)."""
    return o.is_cuda and target() == "cuda" and _tma_capable(o.device.index)


def bf16_tma_ok(o: torch.Tensor, w: torch.Tensor, block_n: int) -> bool:
    """Whether the TMA kernel can view ``o`` as ``[S, H * Dh]`` and ``w`` as ``[G * N, K]``:
    packed (H, Dh) dims, contiguous ``w``, 16-byte aligned bases and rows, groups of whole
    heads and N a multiple of ``block_n``."""
    s, h, dh = o.shape
    g, n, k = w.shape
    return (k % dh == 0 and n % block_n == 0 and o.stride(2) == 1 and o.stride(1) == dh
            and o.stride(0) % 8 == 0 and w.is_contiguous() and k % 8 == 0
            and o.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0)


@launcher_op("wo_a_bf16", mutates_args=("tails", "out"))
def _wo_a_bf16_op(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                  sin_cache: torch.Tensor, w: torch.Tensor, tails: torch.Tensor, out: torch.Tensor,
                  block_m: int, block_n: int, block_k: int, num_warps: int, num_stages: int,
                  tma: bool) -> None:
    if o.shape[0] == 0:
        return
    cfg = bf16_configs.Bf16GemmConfig(block_m, block_n, block_k, num_warps, num_stages, tma)
    with on_device_of(o):
        for run, args in _tails_launches(o, positions, cos_cache, sin_cache, w, tails, out, cfg):
            run(args)


def _tails_launches(o, positions, cos_cache, sin_cache, w, tails, out,
                    cfg: bf16_configs.Bf16GemmConfig) -> list[tuple]:
    """``(launch, runtime arguments)`` of the chain with a buffer of rotated tails: the
    rotation into ``tails``, then the BF16 GEMM (its TMA kernel where ``cfg.tma`` and the
    operands allow, ``bf16_tma_ok``)."""
    tma = cfg.tma and bf16_tma_ok(o, w, cfg.block_n)
    key = ("wo_a_bf16", *signature(o), *signature(tails), *signature(w), *signature(out), cfg,
           tma)
    s, h, dh = o.shape
    g, n, k = w.shape
    gemm = launch_for(key, lambda: Launch(plans.wo_a_bf16(
        s, h, dh, tails.shape[2], g, n, k, cfg, tma, o=o.stride(), w=w.stride(), y=out.stride(),
        target=target())))
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        args = (TensorDescriptor(o, [s, h * dh], [o.stride(0), 1], [bm, bk]),
                TensorDescriptor(tails, [s, h * tails.shape[2]], [tails.stride(0), 1], [bm, bk]),
                TensorDescriptor(w, [g * n, k], [k, 1], [bn, bk]), s, out)
    else:
        args = (o, tails, w, s, out)
    return [_inverse_rope_launch(o, positions, cos_cache, sin_cache, tails), (gemm, args)]


@launcher_op("wo_a_bf16_rotating", mutates_args=("out",))
def _wo_a_bf16_rotating_op(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                           sin_cache: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
                           block_m: int, block_n: int, block_k: int, num_warps: int,
                           num_stages: int, split_k: int) -> None:
    if o.shape[0] == 0:
        return
    shape = (block_m, block_n, block_k, num_warps, num_stages, False, True, split_k)
    run, args = _rotating_launch(o, positions, cos_cache, sin_cache, w, out, shape)
    with on_device_of(o):
        run(args)


def _rotating_launch(o, positions, cos_cache, sin_cache, w, out, shape: tuple):
    """``(launch, runtime arguments)`` of one call of the one-launch chain (split-K's scratch
    taken for it: ``split_scratch``); ``shape`` is ``Bf16GemmConfig``'s fields in order."""
    key = ("wo_a_bf16_rotating", *signature(o), *signature(cos_cache), sin_cache.stride(),
           *signature(w), *signature(out), shape)
    s, _, dh = o.shape
    g, n, k = w.shape
    cfg = bf16_configs.Bf16GemmConfig(*shape)

    def make(split: int) -> Launch:
        return Launch(plans.wo_a_bf16_rotating(
            s, dh, 2 * cos_cache.shape[1], g, n, k, dataclasses.replace(cfg, split_k=split),
            o=o.stride(), cos_row=cos_cache.stride(0), sin_row=sin_cache.stride(0),
            w=w.stride(), y=out.stride(), o_dtype=dtype_name(o.dtype),
            rope_dtype=dtype_name(cos_cache.dtype), target=target()))

    run = launch_for(key, lambda: make(cfg.split_k))
    split, parts, counters = split_scratch(out, cfg.split_k, run.grid[0] * run.grid[1])
    if split != cfg.split_k:  # no counters to be had: the same tile, unsplit
        run = launch_for((key, split), lambda: make(split))
    return run, (o, positions, cos_cache, sin_cache, w, o.shape[0], cos_cache.shape[0], out,
                 parts, counters)


def wo_a_bf16(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
              sin_cache: torch.Tensor, w_bf16: torch.Tensor, num_groups: int, *,
              overwrite_o: bool = False, from_o: bool | None = None,
              config: bf16_configs.Bf16GemmConfig | None = None) -> torch.Tensor:
    """The BF16 chain ``y = inv_rope(o) @ w^T`` per group, fp32 accumulation, bf16 out.

    Not in place, ``o`` is never written. Where ``bf16_configs.bf16_gemm_chosen`` says so, the
    BF16 GEMM (``bf16_kernels``) reads A's NoPE tiles straight from ``o``; its rope tiles it
    rotates itself at decode sizes (one launch: ``Bf16GemmConfig.rotate``), else reads them from
    a ``[S, H, rd]`` buffer of the rotated tails. Elsewhere ``inverse_rope`` writes a rotated copy
    of ``o`` and cuBLAS multiplies it. In place, ``inverse_rope`` rotates ``o``'s tails and
    cuBLAS multiplies ``o``. Every route rotates with the same bits.

    Args:
      o: ``[S, H, Dh]`` bf16 with Dh contiguous; left unchanged unless ``overwrite_o``.
      positions, cos_cache, sin_cache: as for ``inverse_rope``.
      w_bf16: ``[G, N, K]`` exact bf16 dequantized weight, ``H * Dh = G * K``.
      num_groups: G.
      overwrite_o: rotate ``o`` in place, then cuBLAS (``o`` needs packed (H, Dh) dims).
      from_o: ``None`` runs the BF16 GEMM from ``o`` where ``bf16_configs.bf16_gemm_chosen``
        says so; ``True`` requires it, ``False`` runs the rotated copy and cuBLAS.
      config: the BF16 GEMM's launch shape (implies ``from_o``); ``None`` picks
        ``bf16_configs.bf16_gemm_config`` by S and G (its tiles up to 64 tokens rotate in the
        GEMM where groups are whole heads).

    Returns:
      ``[S, G, N]`` bf16.

    Raises:
      ValueError: ``o`` and ``w_bf16`` do not make ``num_groups`` groups of K, a bad ``rd``
        or strides of ``o``, ``from_o``/``config`` with ``overwrite_o``, or ``from_o=True`` (or a
        ``config``) on a chain the BF16 GEMM cannot run.
      TypeError: ``o`` or ``w_bf16`` is not bf16.
    """
    s, h, dh = o.shape
    g, n, k = w_bf16.shape
    if g != num_groups or h * dh != g * k:
        raise ValueError(f"o [S, H, Dh] = {list(o.shape)} and w_bf16 [G, N, K] = "
                         f"{list(w_bf16.shape)} do not make num_groups = {num_groups} groups "
                         f"of K (need H * Dh = G * K)")
    if overwrite_o and (from_o or config is not None):
        raise ValueError("wo_a_bf16(overwrite_o=True) rotates o and runs cuBLAS; from_o=True and "
                         "config are for the BF16 GEMM that leaves o unchanged")
    _check_rotation(o, cos_cache, overwrite_o)
    if w_bf16.dtype != torch.bfloat16:
        raise TypeError(f"wo_a_bf16: w_bf16 must be bfloat16, got {w_bf16.dtype}")
    rd = 2 * cos_cache.shape[1]
    tma = _tma_loads(o)
    if from_o is None:
        from_o = config is not None or (
            not overwrite_o and bf16_configs.bf16_gemm_chosen(s, g, n, k, tma=tma, dh=dh)
            and bf16_configs.bf16_gemm_blocker(dh, rd, k) is None)
    elif not from_o and config is not None:
        raise ValueError("wo_a_bf16: config is the BF16 GEMM's; it needs from_o=True or None")
    if not from_o:
        x = inverse_rope(o, positions, cos_cache, sin_cache, overwrite_o=overwrite_o)
        # bmm rather than einsum: the same cuBLAS call without einsum's host-side parsing.
        x = x.view(s, g, k).transpose(0, 1)  # [G, S, K]
        return torch.bmm(x, w_bf16.transpose(1, 2)).transpose(0, 1)
    blocker = bf16_configs.bf16_gemm_blocker(dh, rd, k, config)
    if blocker:
        raise ValueError(f"wo_a_bf16 cannot run the BF16 GEMM from o here: {blocker}")
    cfg = config or bf16_configs.bf16_gemm_config(
        s, g, n, k, bf16_configs.bf16_block_k_limit(dh, rd, k), target(), tma, dh=dh)
    if cfg.rotate and k % dh:  # a default decode tile, groups inside heads: the tails buffer
        cfg = dataclasses.replace(cfg, rotate=False)
    out = torch.empty((s, g, n), dtype=torch.bfloat16, device=o.device)
    if cfg.rotate:
        run_mutating(_wo_a_bf16_rotating_op, (out,), o, rows_contiguous(positions),
                     rows_contiguous(cos_cache), rows_contiguous(sin_cache),
                     rows_contiguous(w_bf16), out, cfg.block_m, cfg.block_n, cfg.block_k,
                     cfg.num_warps, cfg.num_stages, cfg.split_k)
        return out
    tails = torch.empty((s, h, rd), dtype=torch.bfloat16, device=o.device)
    run_mutating(_wo_a_bf16_op, (tails, out), o, rows_contiguous(positions),
                 rows_contiguous(cos_cache), rows_contiguous(sin_cache),
                 rows_contiguous(w_bf16), tails, out, cfg.block_m, cfg.block_n, cfg.block_k,
                 cfg.num_warps, cfg.num_stages, cfg.tma)
    return out
