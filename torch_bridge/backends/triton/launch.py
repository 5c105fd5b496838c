"""torch launchers of the Triton kernels, registered as ``torch.library`` custom ops.

The ops mutate preallocated outputs and return nothing, so ``torch.compile`` sees opaque calls
(no stride baking, vllm issue #41106) and CUDA-graph capture sees fixed buffers: the launchers
allocate nothing when outputs are given, never synchronise, and read int32 or int64 positions
directly (no ``.to(int64)`` copy).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import triton

from woa_jax import AITER_AMAX_FLOOR

from . import kernels

_LIB = "woa_triton"


# ---------------------------------------------------------------------------------------------
# Inverse RoPE + 1 x GS E8M0 quantization
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """Launch shape of the quant kernel: quant groups per program and warps."""

    block_r: int = 32
    num_warps: int = 4

    def label(self) -> str:
        return f"r{self.block_r}w{self.num_warps}"


#: The quant launch shape (tuned on an H200; see benchmarks/RESULTS.md).
QUANT_CONFIG = QuantConfig()


def _last_dims_contiguous(o: torch.Tensor) -> torch.Tensor:
    """``o [S, H, Dh]`` with (H, Dh) packed; the token stride may be anything."""
    if o.stride(2) == 1 and o.stride(1) == o.shape[2]:
        return o
    return o.contiguous()


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _min_normal_exp(fp8_dtype: torch.dtype) -> int:
    """log2 of the smallest normal fp8 value: -6 (e4m3fn), -7 (e4m3fnuz)."""
    return int(math.log2(torch.finfo(fp8_dtype).smallest_normal))


def _as_bytes(scale: torch.Tensor) -> torch.Tensor:
    return scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale


@torch.library.custom_op(f"{_LIB}::inverse_rope_group_quant_", mutates_args=("x_fp8", "x_scale"))
def _inverse_rope_group_quant_op(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                                 sin_cache: torch.Tensor, x_fp8: torch.Tensor,
                                 x_scale: torch.Tensor, quant_group_size: int,
                                 amax_floor: float, block_r: int, num_warps: int) -> None:
    s, h, dh = o.shape
    n_rows = s * (h * dh // quant_group_size)
    if n_rows == 0:
        return
    fmax = float(torch.finfo(x_fp8.dtype).max)
    grid = (triton.cdiv(n_rows, block_r),)
    kernels.inv_rope_group_quant_kernel[grid](
        o, positions, cos_cache, sin_cache, x_fp8, x_scale,
        n_rows, cos_cache.shape[0], o.stride(0), cos_cache.stride(0), sin_cache.stride(0),
        NQ=h * dh // quant_group_size, GS=quant_group_size, DH=dh, RD=2 * cos_cache.shape[1],
        INV_FP8_MAX=float(np.float32(1.0) / np.float32(fmax)), FP8_MAX=fmax,
        FP8_MIN_NORMAL_EXP=_min_normal_exp(x_fp8.dtype),
        AMAX_FLOOR=float(np.float32(amax_floor)), BLOCK_R=block_r, num_warps=num_warps,
    )


@_inverse_rope_group_quant_op.register_fake
def _(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size, amax_floor, block_r,
      num_warps) -> None:
    return None


def inverse_rope_group_quant(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                             sin_cache: torch.Tensor, num_groups: int, quant_group_size: int = 128,
                             *, amax_floor: float = AITER_AMAX_FLOOR,
                             x_fp8: torch.Tensor | None = None,
                             x_scale: torch.Tensor | None = None,
                             config: QuantConfig | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused inverse RoPE + 1 x GS E8M0 FP8 quantization (AITER semantics), one read of ``o``.

    Args:
      o: ``[S, H, Dh]`` bf16/fp16/fp32; the token stride may be padded.
      positions: ``[>= S]`` int32 or int64; clamped to ``[0, P - 1]`` in the kernel.
      cos_cache, sin_cache: ``[P, rd / 2]`` bf16 or fp32.
      num_groups: G; D = H * Dh / G.
      quant_group_size: GS in {32, 64, 128}.
      amax_floor: 1e-8 (AITER) or 1e-10 (vLLM CUDA).
      x_fp8: optional contiguous ``[S, G, D]`` fp8 output (its dtype picks e4m3fn / e4m3fnuz).
      x_scale: optional contiguous ``[S, G, D / GS]`` uint8 or float8_e8m0fnu output.
      config: launch shape; ``None`` uses ``QUANT_CONFIG``.

    Returns:
      ``(x_fp8 [S, G, D], x_scale [S, G, D / GS])``; the given buffers when passed.
    """
    s, h, dh = o.shape
    d = h * dh // num_groups
    shape_q, shape_s = (s, num_groups, d), (s, num_groups, d // quant_group_size)
    if x_fp8 is None:
        x_fp8 = torch.empty(shape_q, dtype=torch.float8_e4m3fn, device=o.device)
    if x_scale is None:
        x_scale = torch.empty(shape_s, dtype=torch.uint8, device=o.device)
    for name, t, shape in (("x_fp8", x_fp8, shape_q), ("x_scale", x_scale, shape_s)):
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous {list(shape)} tensor, got shape "
                             f"{list(t.shape)} with strides {list(t.stride())}")
    cfg = config or QUANT_CONFIG
    _inverse_rope_group_quant_op(
        _last_dims_contiguous(o), positions, _rows_contiguous(cos_cache),
        _rows_contiguous(sin_cache), x_fp8, _as_bytes(x_scale), quant_group_size,
        float(amax_floor), cfg.block_r, cfg.num_warps)
    return x_fp8, x_scale


# ---------------------------------------------------------------------------------------------
# BF16 chain: in-place inverse RoPE of the rope tail
# ---------------------------------------------------------------------------------------------

INPLACE_BLOCK_R = 32


@torch.library.custom_op(f"{_LIB}::inverse_rope_", mutates_args=("o",))
def _inverse_rope_op(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                     sin_cache: torch.Tensor) -> None:
    s, h, dh = o.shape
    if s == 0:
        return
    grid = (triton.cdiv(s * h, INPLACE_BLOCK_R),)
    kernels.inv_rope_inplace_kernel[grid](
        o, positions, cos_cache, sin_cache, s * h, cos_cache.shape[0], o.stride(0),
        cos_cache.stride(0), sin_cache.stride(0), H=h, DH=dh, RD=2 * cos_cache.shape[1],
        BLOCK_R=INPLACE_BLOCK_R, num_warps=4)


@_inverse_rope_op.register_fake
def _(o, positions, cos_cache, sin_cache) -> None:
    return None


def inverse_rope_(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                  sin_cache: torch.Tensor) -> torch.Tensor:
    """Rotate the rope tail of ``o [S, H, Dh]`` by -theta in place (fp32 math, ``o``'s dtype out).

    ``o`` must have packed (H, Dh) dims; ``rd = 2 * cos_cache.shape[1]`` must be a power of two.
    Returns ``o``.
    """
    if o.dtype != torch.bfloat16:
        raise TypeError(f"in-place inverse RoPE is the BF16 chain's: o must be bfloat16, got "
                        f"{o.dtype}")
    if o.stride(2) != 1 or o.stride(1) != o.shape[2]:
        raise ValueError(f"in-place inverse RoPE needs o with packed [H, Dh] dims, got strides "
                         f"{list(o.stride())}")
    _inverse_rope_op(o, positions, _rows_contiguous(cos_cache), _rows_contiguous(sin_cache))
    return o


def wo_a_bf16(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
              sin_cache: torch.Tensor, w_bf16: torch.Tensor, num_groups: int, *,
              inplace: bool = False) -> torch.Tensor:
    """The BF16 chain: Triton inverse RoPE of the rope tail, then a cuBLAS bf16 batched GEMM.

    Args:
      o: ``[S, H, Dh]`` bf16 (rotated in place when ``inplace``, else copied first).
      w_bf16: ``[G, N, K]`` exact bf16 dequantized weight.

    Returns:
      ``[S, G, N]`` bf16.
    """
    x = o if inplace else o.clone()
    inverse_rope_(x, positions, cos_cache, sin_cache)
    s = x.shape[0]
    return torch.einsum("sgk,gnk->sgn", x.view(s, num_groups, -1), w_bf16)


# ---------------------------------------------------------------------------------------------
# Block-scaled FP8 batched GEMM
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One launch shape of ``bmm_fp8_block_kernel``."""

    block_m: int
    block_n: int
    split_k: int = 1
    swap_ab: bool = False
    num_warps: int = 4
    num_stages: int = 4

    def label(self) -> str:
        return (f"m{self.block_m}n{self.block_n}k{self.split_k}{'s' if self.swap_ab else ''}"
                f"w{self.num_warps}st{self.num_stages}")


def gemm_config(m: int, g: int, n: int, k: int, block: int) -> GemmConfig:
    """The launch shape for one problem, chosen by M (tuned on an H200; see benchmarks/RESULTS.md).

    Small M is weight-bandwidth-bound: at M = 1 the tokens become the MMA's N side (``swap_ab``;
    wgmma needs 64 rows on its M side) with a 5-stage pipeline streaming 128-row weight tiles; up
    to 16 tokens a 16 x 64 tile (more CTAs) won, up to 64 the swapped 64 x 128 tile. From 128
    tokens on, 64 x 128 tiles with 4 warps and 4 stages were fastest (128 x 128 with 8 warps
    tied at M = 1024; larger tiles and split-K lost everywhere). Winners of the H200 sweep at
    G = 16, K = 4096, N = 1024 (benchmarks/RESULTS.md).
    """
    if m <= 8:
        return GemmConfig(16, 128, swap_ab=True, num_warps=4, num_stages=5)
    if m <= 16:
        return GemmConfig(16, 64, num_warps=4, num_stages=4)
    if m <= 64:
        return GemmConfig(64, 128, swap_ab=True, num_warps=4, num_stages=5)
    return GemmConfig(64, 128, num_warps=4, num_stages=4)


@torch.library.custom_op(f"{_LIB}::bmm_fp8_block_", mutates_args=("out",))
def _bmm_op(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
            out: torch.Tensor, block_m: int, block_n: int, split_k: int, swap_ab: bool,
            num_warps: int, num_stages: int) -> None:
    m, g, k = x.shape
    n = w.shape[1]
    if m == 0:
        return
    block = k // x_scale.shape[2]
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), g, split_k)
    kernels.bmm_fp8_block_kernel[grid](
        x, w, x_scale, w_scale, out, m,
        SXM=x.stride(0), SXG=x.stride(1), SXSM=x_scale.stride(0), SXSG=x_scale.stride(1),
        SWG=w.stride(0), SWN=w.stride(1), SWSG=w_scale.stride(0), SWSN=w_scale.stride(1),
        SYM=out.stride(0), SYG=out.stride(1), N=n, K=k, SB=block,
        BLOCK_M=block_m, BLOCK_N=block_n, SPLIT_K=split_k, SWAP_AB=swap_ab,
        OUT_BF16=out.dtype == torch.bfloat16,
        num_warps=num_warps, num_stages=num_stages,
    )


@_bmm_op.register_fake
def _(x, w, x_scale, w_scale, out, block_m, block_n, split_k, swap_ab, num_warps,
      num_stages) -> None:
    return None


def batched_gemm_a8w8_mxscale(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor,
                              w_scale: torch.Tensor, *, dtype: torch.dtype = torch.bfloat16,
                              out: torch.Tensor | None = None,
                              config: GemmConfig | None = None) -> torch.Tensor:
    """Block-scaled FP8 batched GEMM ``y [M, G, N] = dq(x) @ dq(w)^T`` per group, fp32 accumulation.

    Args:
      x: ``[M, G, K]`` fp8 (K contiguous; a transposed view of ``[G, M, K]`` is fine).
      w: ``[G, N, K]`` fp8, same dtype.
      x_scale: ``[M, G, K / B]`` uint8 or float8_e8m0fnu (1 x B groups, B = 128 or 32).
      w_scale: ``[G, ceil(N / B), K / B]`` uint8 or float8_e8m0fnu (B x B blocks).
      dtype: bf16 or fp32 output.
      out: optional ``[M, G, N]`` output with N contiguous (written in place).
      config: launch shape; ``None`` picks ``gemm_config`` by M.

    Returns:
      ``out`` (or a new tensor) ``[M, G, N]`` in ``dtype``.
    """
    m, g, k = x.shape
    n = w.shape[1]
    block = k // x_scale.shape[2]
    cfg = config or gemm_config(m, g, n, k, block)
    if out is None:
        out = torch.empty((m, g, n), dtype=dtype, device=x.device)
    elif tuple(out.shape) != (m, g, n) or out.stride(2) != 1:
        raise ValueError(f"out must be [M, G, N] = {[m, g, n]} with N contiguous, got shape "
                         f"{list(out.shape)} strides {list(out.stride())}")
    x = _rows_contiguous(x)
    w = _rows_contiguous(w)
    xs, ws = _rows_contiguous(_as_bytes(x_scale)), _rows_contiguous(_as_bytes(w_scale))
    if (k // block) % cfg.split_k != 0:
        raise ValueError(f"split_k={cfg.split_k} does not divide K / B = {k // block}")
    args = (cfg.block_m, cfg.block_n, cfg.split_k, cfg.swap_ab, cfg.num_warps, cfg.num_stages)
    if cfg.split_k == 1:
        _bmm_op(x, w, xs, ws, out, *args)
        return out
    # Split-K adds fp32 partials atomically: accumulate in a zeroed fp32 buffer, then round once.
    acc = out if out.dtype == torch.float32 else torch.empty((m, g, n), dtype=torch.float32,
                                                               device=x.device)
    acc.zero_()
    _bmm_op(x, w, xs, ws, acc, *args)
    if acc is not out:
        out.copy_(acc)
    return out

