"""Direct launches of the two chains for plain eager calls that repeat a signature.

FP8 (``eager_wo_a_fp8``): where the chain fuses, the fused kernel is launched directly.
Elsewhere the quant's and the GEMM's launches run one after the other, as ``chain.wo_a_fp8``
launches them; at decode sizes (``SCRATCH_BYTES``) the quant writes into activations kept for
the stream, which spares each host-bound call two allocations. BF16 (``eager_wo_a_bf16``): the
route ``chain.wo_a_bf16`` takes, its kernels launched directly. Where the native launcher is
available (``native``), a call is one native call that launches every kernel of it; elsewhere
each kernel's own direct launcher runs.
"""

from __future__ import annotations

import dataclasses

import torch

from ...interop import e8m0_bytes
from . import bf16_configs, configs, native, plans
from ._common import (
    SCRATCH_BYTES,
    StreamBuffers,
    current_stream,
    last_dims_contiguous,
    stream_buffers,
    target,
)
from .chain import (
    _inverse_rope_launch,
    _rotating_launch,
    _tails_launches,
    _tma_loads,
    _wo_a_fp8_launch,
)
from .gemm import (
    batched_gemm_a8w8_mxscale,
    chain_dependent,
    default_launch,
    eager_gemm,
    wgmma_on,
)
from .quant import _quant_launch, eager_quant

#: Where ``_wo_a_fp8_launch``'s runtime arguments hold the call's tensors.
_WO_A_FP8_TENSORS = (0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12)

def stream_activations(device: torch.device, stream: int, fp8: torch.dtype, g: int, k: int,
                       block: int) -> StreamBuffers:
    """The quant's outputs kept for ``stream`` and (G, K, B, fp8 dtype) (``stream_buffers``):
    ``x [SCRATCH_BYTES / (G K), G, K]`` and its scales ``[.., G, K / B]`` uint8, so a call's own
    operands are its ``o``, positions and output (``native.OPEN``)."""
    def make():
        rows = max(1, SCRATCH_BYTES // (g * k))
        return (torch.empty((rows, g, k), dtype=fp8, device=device),
                torch.empty((rows, g, k // block), dtype=torch.uint8, device=device))
    return stream_buffers(("fp8 activations", device, stream, fp8, g, k, block), make)


def eager_wo_a_fp8(o, positions, cos_cache, sin_cache, w, w_scale, num_groups: int,
                   amax_floor: float):
    """For plain eager calls of ``wo_a_fp8`` (bf16 out, default launch shape) that repeat this
    signature with new outputs: ``run(o, positions) -> out | None`` with this call's tables and
    weight (``None``: this call needs the op's path), or ``None`` before the chain's first
    launch of this signature or for operands the launcher would first repack.

    The fused kernel's prologue activations and split-K's scratch are kept for the launches on
    the current stream (``_common.Bound``): each launch writes and reads them back itself, and
    launches on one stream never overlap. Unfused: ``_eager_unfused``."""
    s, h, dh = o.shape
    g, n, k = w.shape
    block = k // w_scale.shape[2]
    if (not o.is_cuda or s == 0 or last_dims_contiguous(o) is not o
            or any(t.stride(-1) != 1 for t in (positions, cos_cache, sin_cache))
            or not w.is_contiguous() or not w_scale.is_contiguous()):
        return None
    wgmma = wgmma_on(o.device)
    if (configs.wo_a_fp8_blocker(dh, 2 * cos_cache.shape[1], block, None)
            or not configs.wo_a_fp8_chosen(
                s, g, n, k, block, dependent=chain_dependent(s, g, n, k, block, o.device),
                wgmma=wgmma)):
        return _eager_unfused(o, positions, cos_cache, sin_cache, w, w_scale, amax_floor)
    cfg = configs.wo_a_fp8_config(s, g, n, k, block, wgmma=wgmma)
    ws = e8m0_bytes(w_scale)
    device = o.device
    x_fp8 = torch.empty((s, g, k), dtype=w.dtype, device=device)
    x_scale = torch.empty((s, g, k // block), dtype=torch.uint8, device=device)
    out = torch.empty((s, g, n), dtype=torch.bfloat16, device=device)
    run, args = _wo_a_fp8_launch(o, positions, cos_cache, sin_cache, w, ws, x_fp8, x_scale,
                                 out, float(amax_floor), cfg.block_m, cfg.block_n, cfg.split_k,
                                 cfg.num_warps, cfg.num_stages, cfg.wgmma, cfg.pdl)
    stream = current_stream()
    bound = native.bind([(run, args)], (o, positions, out))
    if bound is not None:
        return _native_run(bound, o, positions, tuple(out.shape), stream)
    bound = None if cfg.wgmma else run.bind(args, _WO_A_FP8_TENSORS, stream, checked=2)
    if bound is None:  # the wgmma kernel's descriptors: the native launcher only
        return None
    scratch = args[11:] if run.plan.split_k > 1 else None
    shape = tuple(out.shape)
    strides = plans.dense(*shape)

    def run(o, positions):
        out = torch.empty_strided(shape, strides, dtype=torch.bfloat16, device=device)
        if bound((o, positions, cos_cache, sin_cache, w, ws, x_fp8, x_scale, out,
                  *(scratch or (out, out)))):
            return out
        return None
    return run


def _eager_unfused(o, positions, cos_cache, sin_cache, w, w_scale, amax_floor: float):
    """``eager_wo_a_fp8`` where the chain does not fuse: the quant's direct launcher, then the
    GEMM's (``None`` where either has none), as ``wo_a_fp8`` launches them. Up to
    ``SCRATCH_BYTES`` of activations the quant writes the current stream's kept activations
    (``stream_activations``); another stream or a capture then takes the op's path."""
    s, h, _ = o.shape
    g, n, k = w.shape
    block = k // w_scale.shape[2]
    device = o.device
    dependent = chain_dependent(s, g, n, k, block, device)
    quant_config = configs.quant_config(s, heads=h, dependent=dependent)
    kept = None
    if s * g * k <= SCRATCH_BYTES:
        stream = current_stream(device.index)
        kept = stream_activations(device, stream, w.dtype, g, k, block)
        x, x_scale = (t[:s] for t in kept.tensors)
        bound = _native_unfused(o, positions, cos_cache, sin_cache, w, w_scale, amax_floor,
                                x, x_scale, block, quant_config, dependent)
        if bound is not None:
            return _native_run(bound, o, positions, (s, g, n), stream, kept.lock)
        quant = eager_quant(o, positions, cos_cache, sin_cache, g, block, amax_floor, w.dtype,
                            x_fp8=x, x_scale=x_scale, config=quant_config, stream=stream)
    else:
        x = torch.empty((s, g, k), dtype=w.dtype, device=device)
        x_scale = torch.empty((s, g, k // block), dtype=torch.float8_e8m0fnu, device=device)
        quant = eager_quant(o, positions, cos_cache, sin_cache, g, block, amax_floor, w.dtype,
                            config=quant_config)
    gemm = quant and eager_gemm(x, w, x_scale, w_scale, torch.bfloat16, dependent=dependent)
    if not gemm:
        return None

    def launch(o, positions):
        got = quant(o, positions, cos_cache, sin_cache, *((x, x_scale) if kept else ()))
        if got is None:
            return None
        y = gemm(*got[:1], w, got[1], w_scale)
        # The quant launched: the GEMM's own path finishes a call its launcher refuses.
        return y if y is not None else batched_gemm_a8w8_mxscale(got[0], w, got[1], w_scale,
                                                                  dependent=dependent)
    if kept is None:
        return launch

    def run(o, positions):
        with kept.lock:
            return launch(o, positions)
    return run


def _native_unfused(o, positions, cos_cache, sin_cache, w, w_scale, amax_floor: float, x,
                    x_scale, block: int, quant_config, dependent: bool) -> native.Native | None:
    """The quant into the kept activations ``x``, ``x_scale``, then the GEMM, bound as one
    native call with ``o``, ``positions`` and the output open (``None``: not bound)."""
    s, g, n = o.shape[0], w.shape[0], w.shape[1]
    out = torch.empty((s, g, n), dtype=torch.bfloat16, device=o.device)
    quant = _quant_launch(o, positions, cos_cache, sin_cache, x, x_scale, block,
                          float(amax_floor), quant_config)
    gemm = default_launch(x, w, x_scale, w_scale, out, dependent=dependent)
    return native.bind([quant, gemm], (o, positions, out))


def _native_run(bound: native.Native, o, positions, shape: tuple[int, ...], stream: int,
                lock=None):
    """``native.runner`` of a chain bound with its output open (a new ``shape`` bf16 per
    call)."""
    device, strides, bf16 = o.device, plans.dense(*shape), torch.bfloat16
    return native.runner(
        bound, o, positions, stream,
        lambda: (torch.empty_strided(shape, strides, dtype=bf16, device=device),), lock)


# ---------------------------------------------------------------------------------------------
# The BF16 chain
# ---------------------------------------------------------------------------------------------

#: Where ``_inverse_rope_launch``'s runtime arguments hold the call's tensors.
_ROPE_TENSORS = (0, 1, 2, 3, 10)


#: Where ``_rotating_launch``'s runtime arguments hold the call's tensors (then the scratch).
_ROTATING_TENSORS = (0, 1, 2, 3, 4, 7, 8, 9)


def eager_wo_a_bf16(o, positions, cos_cache, sin_cache, w_bf16, num_groups: int):
    """For plain eager calls of ``wo_a_bf16`` (not in place, default path) that repeat this
    signature: ``run(o, positions) -> [S, G, N] | None`` with this call's tables and weight
    (``None``: this call needs the op's path), launching the compiled kernels directly, in one
    native call where the native launcher binds them (``native``). Per route of the default
    path: the one-launch chain (decode sizes), its kernel; the rotated copy and cuBLAS, the
    rotation's kernel and then the same cuBLAS call; the buffer of rotated tails (prefill
    sizes), the rotation and the BF16 GEMM, natively bound only, into tails kept for the
    stream up to ``SCRATCH_BYTES`` (``_eager_tails``). The rotated copy is made per call: the
    native call returns before cuBLAS is queued to read it. ``None`` before the kernels' first
    launch of this signature, or for operands the op's path would repack."""
    s, h, dh = o.shape
    g, n, k = w_bf16.shape
    if (not o.is_cuda or s == 0 or o.dtype != torch.bfloat16 or w_bf16.dtype != torch.bfloat16
            or o.stride(2) != 1 or g != num_groups or h * dh != g * k
            or any(t.stride(-1) != 1 for t in (positions, cos_cache, sin_cache))
            or not w_bf16.is_contiguous()):
        return None
    device, bf16 = o.device, torch.bfloat16
    shape = (s, g, n)
    strides = plans.dense(*shape)
    tma = _tma_loads(o)
    if bf16_configs.bf16_gemm_chosen(s, g, n, k, tma=tma, dh=dh):
        rd = 2 * cos_cache.shape[1]
        if bf16_configs.bf16_gemm_blocker(dh, rd, k):
            return None
        cfg = bf16_configs.bf16_gemm_config(
            s, g, n, k, bf16_configs.bf16_block_k_limit(dh, rd, k), target(), tma, dh=dh)
        if not cfg.rotate or k % dh:  # as wo_a_bf16 picks: groups inside heads take the tails
            cfg = dataclasses.replace(cfg, rotate=False)
            return _eager_tails(o, positions, cos_cache, sin_cache, w_bf16, cfg)
        out = torch.empty_strided(shape, strides, dtype=bf16, device=device)
        run, args = _rotating_launch(o, positions, cos_cache, sin_cache, w_bf16, out,
                                     dataclasses.astuple(cfg))
        # Split-K's scratch is the current stream's: the launches stay on it.
        scratch = args[8:] if run.plan.split_k > 1 else None
        stream = current_stream(device.index) if scratch else None
        bound = native.bind([(run, args)], (o, positions, out))
        if bound is not None:
            return native.runner(bound, o, positions, stream, lambda: (
                torch.empty_strided(shape, strides, dtype=bf16, device=device),))
        bound = run.bind(args, _ROTATING_TENSORS, stream, checked=2)
        if bound is None:
            return None

        def run_one(o, positions):
            out = torch.empty_strided(shape, strides, dtype=bf16, device=device)
            return out if bound((o, positions, cos_cache, sin_cache, w_bf16, out,
                                 *(scratch or (out, out)))) else None
        return run_one
    # The rotated copy [S, H, Dh] as the [G, S, K] view that the op's path multiplies (the
    # same sizes and strides: the same cuBLAS call).
    view = (g, s, k), (k, g * k, 1)
    copy = torch.empty(o.shape, dtype=o.dtype, device=device)
    run, args = _inverse_rope_launch(o, positions, cos_cache, sin_cache, copy)
    w_t = w_bf16.transpose(1, 2)  # [G, K, N]
    bound = native.bind([(run, args)], (o, positions, copy))
    if bound is not None:
        rotate = native.runner(bound, o, positions, None, lambda: (
            torch.empty_strided(*view, dtype=bf16, device=device),))

        def run_copy(o, positions):
            y = rotate(o, positions)
            return None if y is None else torch.bmm(y, w_t).transpose(0, 1)
        run_copy.native = True
        return run_copy
    bound = run.bind(args, _ROPE_TENSORS, checked=2)
    if bound is None:
        return None

    def run(o, positions):
        y = torch.empty_strided(*view, dtype=bf16, device=device)
        if not bound((o, positions, cos_cache, sin_cache, y)):
            return None
        return torch.bmm(y, w_t).transpose(0, 1)
    return run


def _eager_tails(o, positions, cos_cache, sin_cache, w_bf16, cfg):
    """``eager_wo_a_bf16`` on the route of rotated tails: the rotation and the GEMM in one
    native call with ``o``, positions and the output open (``None`` where the native launcher
    does not bind them). Up to ``SCRATCH_BYTES`` the tails are the current stream's kept
    buffer (``stream_buffers``; another stream or a capture then takes the op's path), else
    each call makes its own."""
    s, h, _ = o.shape
    g, n, _ = w_bf16.shape
    rd, device, bf16 = 2 * cos_cache.shape[1], o.device, torch.bfloat16
    out = torch.empty((s, g, n), dtype=bf16, device=device)
    if s * h * rd * 2 > SCRATCH_BYTES:
        tails = torch.empty((s, h, rd), dtype=bf16, device=device)
        bound = native.bind(_tails_launches(o, positions, cos_cache, sin_cache, w_bf16, tails,
                                            out, cfg), (o, positions, tails, out))
        if bound is None:
            return None
        return native.runner(bound, o, positions, None, lambda: (
            torch.empty((s, h, rd), dtype=bf16, device=device),
            torch.empty((s, g, n), dtype=bf16, device=device)))
    stream = current_stream(device.index)
    kept = stream_buffers(("bf16 tails", device, stream, h, rd), lambda: (torch.empty(
        (max(1, SCRATCH_BYTES // (h * rd * 2)), h, rd), dtype=bf16, device=device),))
    bound = native.bind(_tails_launches(o, positions, cos_cache, sin_cache, w_bf16,
                                        kept.tensors[0][:s], out, cfg), (o, positions, out))
    if bound is None:
        return None
    return native.runner(bound, o, positions, stream, lambda: (
        torch.empty((s, g, n), dtype=bf16, device=device),), kept.lock)
