"""What each FP8 kernel is launched with: its grid and constexprs, for both launchers.

The torch launchers (``quant``, ``gemm``, ``chain``) and the JAX launcher (``jax_launch``) build
their launches here, from integers, strides and dtype names, so a kernel's constexprs are
written once. The launch shapes come from ``configs`` (the BF16 chain's from ``bf16_configs``).
Importing this module imports Triton (the kernel bodies) but no torch and no JAX, and touches no
GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from . import bf16_configs, configs, kernels, quant_kernels
from .configs import GemmConfig, QuantConfig


@dataclasses.dataclass(frozen=True)
class Plan:
    """One kernel launch signature: the kernel, its grid and compile options, its constexprs,
    and the scalars its launcher passes at run time (``n_work``: the quant's work items)."""

    kernel: Any  # a triton.JITFunction
    grid: tuple[int, ...]
    constexprs: dict
    num_warps: int
    num_stages: int | None = None
    n_work: int = 0
    split_k: int = 1

    def compile_options(self) -> dict:
        """The constexprs with the compile options, as ``kernel[grid](...)`` takes them."""
        extra = {"num_warps": self.num_warps}
        if self.num_stages is not None:
            extra["num_stages"] = self.num_stages
        if self.constexprs.get("PDL"):
            extra["launch_pdl"] = True
        return {**self.constexprs, **extra}


def _fp8_constants(fp8: str, amax_floor: float, o_dtype: str, rope_dtype: str,
                   target: str) -> dict:
    """The quantizing kernels' fp8 and rotation constexprs on ``target``."""
    return dict(configs.quant_constants(fp8, amax_floor, configs.hw_fp8_cast(fp8, target)),
                ROUND_PRODUCTS=configs.round_products(o_dtype, rope_dtype, target))


def quant(s: int, h: int, dh: int, rd: int, quant_group_size: int, cfg: QuantConfig, *,
          fp8: str, amax_floor: float, o_dtype: str, rope_dtype: str, target: str,
          pdl: bool = False, scale_mn_align: int = 0) -> Plan:
    """``inverse_rope_group_quant`` of ``o [S, H, Dh]`` with a rope tail of ``rd`` lanes;
    ``pdl``: a programmatic dependent launch (``pdl_launches``); ``scale_mn_align > 0``: fp32
    scales, token-major with S padded to that multiple (the per-head kernel's
    ``_store_scales``)."""
    launch = configs.quant_launch(s, h, dh, quant_group_size, cfg)
    kernel = (quant_kernels.inverse_rope_group_quant_head_kernel if launch.per_head
              else quant_kernels.inverse_rope_group_quant_kernel)
    shape = dict(launch.shape)
    if launch.per_head:
        shape["SCALE_MN_ALIGN"] = scale_mn_align
    elif scale_mn_align:
        raise ValueError(f"token-major fp32 scales need the per-head quant kernel: GS "
                         f"{quant_group_size} must divide Dh {dh} and the config must set "
                         f"block_h (got {cfg.label()})")
    return Plan(kernel, launch.grid, dict(
        GS=quant_group_size, DH=dh, RD=rd, **shape,
        **_fp8_constants(fp8, amax_floor, o_dtype, rope_dtype, target), PDL=pdl), cfg.num_warps,
        n_work=launch.n_work)


def pdl_launches(target: str, capability: int) -> bool:
    """Whether the quant and the pointer GEMM launch as programmatic dependent launches: on
    CUDA from Hopper (``capability`` 90) on, so that each one's launch and prologue overlap the
    kernel before it on the stream (the kernels wait for its writes before reading)."""
    return target == "cuda" and capability >= 90


def dense(*shape: int) -> tuple[int, ...]:
    """The row-major strides of ``shape``: the JAX launcher's operands, and the torch direct
    launchers' outputs (``torch.empty_strided(shape, dense(*shape), ...)`` parses its arguments
    faster than ``torch.empty``)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def gemm_pointer(m: int, g: int, n: int, k: int, block: int, cfg: GemmConfig, split_k: int, *,
                 x: tuple, x_scale: tuple, w: tuple, w_scale: tuple, y: tuple,
                 out_bf16: bool, pdl: bool = False) -> Plan:
    """The pointer-load GEMM (``batched_gemm_a8w8_mxscale_kernel``) over operands of these
    strides, K split ``split_k`` ways: grid ``(tiles, G, split_k)``; ``pdl`` as for ``quant``."""
    tiles = configs.cdiv(m, cfg.block_m) * configs.cdiv(n, cfg.block_n)
    return Plan(kernels.batched_gemm_a8w8_mxscale_kernel, (tiles, g, split_k), dict(
        SXM=x[0], SXG=x[1], SXSM=x_scale[0], SXSG=x_scale[1], SWG=w[0], SWN=w[1],
        SWSG=w_scale[0], SWSN=w_scale[1], SYM=y[0], SYG=y[1], N=n, K=k, SB=block,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT_K=split_k, SWAP_AB=cfg.swap_ab,
        OUT_BF16=out_bf16, PDL=pdl), cfg.num_warps, cfg.num_stages, split_k=split_k)


def gemm_tma(m: int, g: int, n: int, k: int, block: int, cfg: GemmConfig, sms: int, *,
             x_scale: tuple, w_scale: tuple, out_bf16: bool) -> Plan:
    """The tensor-descriptor GEMM (``batched_gemm_a8w8_mxscale_tma_kernel``), persistent on
    ``sms`` SMs."""
    programs = configs.tile_programs(m, g, n, cfg.block_m, cfg.block_n, cfg.programs_per_sm, sms)
    return Plan(kernels.batched_gemm_a8w8_mxscale_tma_kernel, (programs,), dict(
        SXSM=x_scale[0], SXSG=x_scale[1], SWSG=w_scale[0], SWSN=w_scale[1], G=g, N=n, K=k,
        SB=block, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SWAP_AB=cfg.swap_ab,
        OUT_BF16=out_bf16), cfg.num_warps, cfg.num_stages)


def gemm_wgmma(m: int, g: int, n: int, k: int, block: int, cfg: GemmConfig, sms: int, *,
               x_row: int, y_row: int, x_scale: tuple, w_scale: tuple,
               out_bytes: int) -> tuple[Plan, tuple]:
    """The Hopper wgmma GEMM: its plan, and the ``(shape, strides, tile)`` views of the x, w and
    y descriptors (``configs.wgmma_launch``); K split ``cfg.split_k`` ways. The warp-specialized
    kernel where ``configs.warp_specialized`` says (same parameters, same bits)."""
    from . import wgmma_kernels, wgmma_ws_kernels

    launch = configs.wgmma_launch(m, g, n, k, block, cfg, out_bytes=out_bytes, sms=sms,
                                  x_row=x_row, y_row=y_row,
                                  scale_strides=(*x_scale[:2], *w_scale[:2]))
    kernel = (wgmma_ws_kernels.batched_gemm_a8w8_mxscale_wgmma_ws_kernel
              if configs.warp_specialized(cfg)
              else wgmma_kernels.batched_gemm_a8w8_mxscale_wgmma_kernel)
    # num_warps stays among the constexprs too: the Gluon kernels take it as one.
    return (Plan(kernel, (launch.programs,),
                 launch.constexprs, launch.constexprs["num_warps"], split_k=cfg.split_k),
            launch.views)


def wo_a_fp8(s: int, dh: int, rd: int, g: int, n: int, k: int, block: int, cfg: GemmConfig,
             split_k: int, *, o_row: int, cos_row: int, sin_row: int, w: tuple, w_scale: tuple,
             y: tuple, fp8: str, amax_floor: float, o_dtype: str, rope_dtype: str,
             out_bf16: bool, target: str) -> Plan:
    """The FP8 chain in one launch (``wo_a_fp8_kernel``): grid ``(tiles, G, split_k)``."""
    tiles = configs.cdiv(s, cfg.block_m) * configs.cdiv(n, cfg.block_n)
    return Plan(kernels.wo_a_fp8_kernel, (tiles, g, split_k), dict(
        SOM=o_row, SCP=cos_row, SSP=sin_row, SWG=w[0], SWN=w[1], SWSG=w_scale[0],
        SWSN=w_scale[1], SYM=y[0], SYG=y[1], G=g, N=n, K=k, SB=block, DH=dh, RD=rd,
        **_fp8_constants(fp8, amax_floor, o_dtype, rope_dtype, target), BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, SPLIT_K=split_k, OUT_BF16=out_bf16,
        QUANT_ROWS=configs.WO_A_FP8_QUANT_LANES // block), cfg.num_warps, cfg.num_stages,
        split_k=split_k)


def wo_a_fp8_wgmma(s: int, dh: int, rd: int, g: int, n: int, k: int, block: int,
                   cfg: GemmConfig, *, o_row: int, cos_row: int, sin_row: int,
                   w_scale: tuple, y_row: int, out_bytes: int, fp8: str, amax_floor: float,
                   o_dtype: str, rope_dtype: str, target: str) -> tuple[Plan, tuple]:
    """The FP8 chain in one launch on the wgmma GEMM's swapped tile
    (``wgmma_kernels.wo_a_fp8_wgmma_kernel``, K split ``cfg.split_k`` ways, one program per
    work unit): its plan, and the x (the dense scratch ``[S, G, K]``), w and y descriptor
    views (``configs.wgmma_launch``)."""
    from . import wgmma_kernels

    # One program per unit (``programs_per_sm`` 0): the SM count does not enter the grid.
    launch = configs.wgmma_launch(s, g, n, k, block, cfg, out_bytes=out_bytes, sms=0,
                                  x_row=g * k, y_row=y_row,
                                  scale_strides=(g * (k // block), k // block, *w_scale[:2]),
                                  resident_x=True)
    cx = launch.constexprs
    return (Plan(wgmma_kernels.wo_a_fp8_wgmma_kernel, (launch.programs,), dict(
        SOM=o_row, SCP=cos_row, SSP=sin_row, SWSG=w_scale[0], SWSN=w_scale[1], G=g, N=n, K=k,
        DH=dh, RD=rd, **_fp8_constants(fp8, amax_floor, o_dtype, rope_dtype, target),
        TOKEN_ROWS=min(cfg.block_m, 1 << (s - 1).bit_length()),
        QUANT_ROWS=configs.WO_A_FP8_QUANT_LANES // block, STAGES=cx["STAGES"],
        num_warps=cfg.num_warps, SPLIT_K=cfg.split_k, PDL=cfg.pdl), cfg.num_warps,
        split_k=cfg.split_k), launch.views)


# ---------------------------------------------------------------------------------------------
# The BF16 chain
# ---------------------------------------------------------------------------------------------

#: (token, head) rows per program of ``inverse_rope_kernel``.
ROPE_BLOCK_R = 32


def inverse_rope(s: int, h: int, dh: int, rd: int, mode: str, *, o_dtype: str, rope_dtype: str,
                 target: str) -> Plan:
    """``inverse_rope_kernel`` over ``o [S, H, Dh]``; ``mode``: ``"in place"``, ``"copy"``
    (NoPE lanes copied too) or ``"tails"`` (a ``[S, H, rd]`` buffer of the rope tails)."""
    return Plan(kernels.inverse_rope_kernel, (configs.cdiv(s * h, ROPE_BLOCK_R),), dict(
        H=h, DH=dh, RD=rd, BLOCK_R=ROPE_BLOCK_R, COPY_NOPE=mode == "copy",
        TAIL_ONLY=mode == "tails",
        ROUND_PRODUCTS=configs.round_products(o_dtype, rope_dtype, target)), 4)


def wo_a_bf16_rotating(s: int, dh: int, rd: int, g: int, n: int, k: int,
                       cfg: bf16_configs.Bf16GemmConfig, *, o: tuple, cos_row: int, sin_row: int,
                       w: tuple, y: tuple, o_dtype: str, rope_dtype: str, target: str) -> Plan:
    """The BF16 chain in one launch (``wo_a_bf16_rotating_kernel``): A read from ``o``, its rope
    tiles rotated in the kernel, K split ``cfg.split_k`` ways by heads."""
    from . import bf16_kernels

    return Plan(bf16_kernels.wo_a_bf16_rotating_kernel,
                (configs.cdiv(s, cfg.block_m) * configs.cdiv(n, cfg.block_n), g, cfg.split_k),
                dict(SOM=o[0], SOH=o[1], SCP=cos_row, SSP=sin_row, SWG=w[0], SWN=w[1],
                     SYM=y[0], SYG=y[1], HPG=k // dh, DH=dh, RD=rd, N=n, BLOCK_M=cfg.block_m,
                     BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                     ROUND_PRODUCTS=configs.round_products(o_dtype, rope_dtype, target),
                     DOT_IN_FP32=target == "interpreter", SETTLE_MMA=target == "cuda",
                     SPLIT_K=cfg.split_k),
                cfg.num_warps, cfg.num_stages, split_k=cfg.split_k)


def wo_a_bf16(s: int, h: int, dh: int, rd: int, g: int, n: int, k: int,
              cfg: bf16_configs.Bf16GemmConfig, tma: bool, *, o: tuple, w: tuple, y: tuple,
              target: str) -> Plan:
    """The BF16 GEMM that reads A's NoPE tiles from ``o`` and its rope tiles from the rotated
    tails: ``wo_a_bf16_tma_kernel`` where ``tma``, else ``wo_a_bf16_kernel``."""
    from . import bf16_kernels

    grid = (configs.cdiv(s, cfg.block_m) * configs.cdiv(n, cfg.block_n), g)
    common = dict(SYM=y[0], SYG=y[1], DH=dh, RD=rd, N=n, BLOCK_M=cfg.block_m,
                  BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DOT_IN_FP32=target == "interpreter")
    if tma:
        return Plan(bf16_kernels.wo_a_bf16_tma_kernel, grid, dict(HPG=k // dh, **common),
                    cfg.num_warps, cfg.num_stages)
    return Plan(bf16_kernels.wo_a_bf16_kernel, grid, dict(
        SOM=o[0], SOH=o[1], SWG=w[0], SWN=w[1], H=h, K=k, **common), cfg.num_warps,
        cfg.num_stages)
