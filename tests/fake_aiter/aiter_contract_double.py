"""Contract test double for AITER (not AITER): the shared body of three fake ``aiter`` packages.

Each flavour directory holds an ``aiter`` package and ``amd_aiter-<version>.dist-info`` metadata:
``released/`` 0.1.20 (quant op keyword ``scale_shuffle: bool``), ``main/`` 0.1.21.dev3+gfeed
(``scale_layout: str``), ``old/`` 0.1.19.post1 (quant op only; the GEMM arrived in 0.1.20). They
implement the documented signatures of AITER's two ``wo_a`` ops on top of the pure-torch
reference, so ``torch_bridge/backends/aiter.py`` is tested on a CPU box: argument mapping, version
and arch gating, both spellings and fallback. The real kernels' numerics are tested only on
gfx950. The test fixture puts this directory and one flavour on ``sys.path``.

Mirrors the host-side checks the real ops make, so that a wrong argument mapping in the adapter
fails here the way it would on gfx950; like the real GEMM, it does NOT validate scale dtypes or
shapes. Every call is appended to ``CALLS`` as ``(op, kwargs)``.
"""

from __future__ import annotations

import torch

from torch_bridge import layouts
from torch_bridge.backends.torch_ref import BACKEND as REF

CALLS: list[tuple[str, dict]] = []


def _host_checks(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, x_fp8):
    if o.dim() != 3 or o.dtype not in (torch.bfloat16, torch.float16) or not o.is_contiguous():
        raise RuntimeError("o must be a contiguous 3-D bf16/fp16 tensor")
    if o.shape[2] != 512 or cos_cache.shape[1] * 2 != 64:
        raise RuntimeError("template path supports HEAD_DIM=512, RD=64")
    if positions.dtype != torch.int64:
        raise RuntimeError("positions must be int64")
    if positions.shape[0] < o.shape[0]:
        raise RuntimeError("positions too short")
    for t in (cos_cache, sin_cache):
        if t.dim() != 2 or t.dtype != o.dtype or not t.is_contiguous():
            raise RuntimeError("cos/sin dtype must match o")
    if quant_group_size not in (32, 64, 128):
        raise RuntimeError("quant_group_size must be 32, 64 or 128")
    if x_fp8 is not None and x_fp8.dtype != torch.float8_e4m3fn:
        raise AssertionError("Unsupported dtype")


def quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, layout, x_fp8,
          x_scale, record):
    CALLS.append(("inverse_rope_group_quant", record))
    _host_checks(o, positions, cos_cache, sin_cache, num_groups, quant_group_size, x_fp8)
    s, h, dh = o.shape
    d = h * dh // num_groups
    q, byte = REF.inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups,
                                           quant_group_size,
                                           x_fp8=x_fp8 if x_fp8 is not None else torch.empty(
                                               (s, num_groups, d), dtype=torch.float8_e4m3fn))
    if layout == "row":
        if x_scale is None:
            return q, byte.view(torch.float8_e8m0fnu)
        x_scale.view(torch.uint8).copy_(byte)
        return q, x_scale
    buf = layouts.to_scale_layout(byte, layout, quant_group_size=quant_group_size,
                                  out=None if x_scale is None else x_scale.view(torch.uint8))
    return q, (x_scale if x_scale is not None else buf)


def scale_shuffle_quant(o, positions, cos_cache, sin_cache, num_groups: int,
                        quant_group_size: int = 128, scale_shuffle: bool = False,
                        x_fp8=None, x_scale=None):
    """The quant op of AITER 0.1.19.post1 and 0.1.20 (``scale_shuffle: bool`` spelling).

    The adapter reads this signature's parameter names, so ``old/`` and ``released/`` export
    this function itself as ``aiter.inverse_rope_group_quant``.
    """
    return quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                 "scale_shuffle" if scale_shuffle else "row", x_fp8, x_scale,
                 {"scale_shuffle": scale_shuffle, "positions_dtype": positions.dtype,
                  "cos_dtype": cos_cache.dtype, "sin_dtype": sin_cache.dtype})


def gemm(x, wo_a, x_scale, w_scale, dtype):
    CALLS.append(("batched_gemm_a8w8_mxscale", {"x_scale_dtype": x_scale.dtype,
                                                "w_scale_dtype": w_scale.dtype, "dtype": dtype}))
    if x.dim() != 3 or wo_a.dim() != 3 or x.stride(2) != 1:
        raise RuntimeError("x and wo_a must be 3-D and K-contiguous")
    if x.dtype != torch.float8_e4m3fn or wo_a.dtype != torch.float8_e4m3fn:
        raise RuntimeError("fp8 inputs required")
    if dtype not in (torch.bfloat16, torch.float32):
        raise RuntimeError("Y must be fp32 or bf16")
    # Read the operands the way the kernel does: wo_a as a packed
    # row-major buffer and the scales' last dim as unit stride, whatever their strides say, so a
    # strided operand the adapter forgets to pack gives wrong output here too.
    w_read = wo_a.as_strided(wo_a.shape, torch.empty(wo_a.shape, device="meta").stride())
    xs_read, ws_read = (t.view(torch.uint8).as_strided(t.shape, (*t.stride()[:2], 1))
                        for t in (x_scale, w_scale))
    return REF.batched_gemm_a8w8_mxscale(x, w_read, xs_read, ws_read, dtype=dtype)
