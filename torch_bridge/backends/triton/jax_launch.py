"""Native JAX launches of the Triton kernels through ``jax_triton.triton_call``.

``triton_call`` lowers a kernel launch to XLA's ``triton_kernel_call`` custom call: the kernel is
compiled once at lowering time and XLA launches it on its own stream with no Python at run time,
inside ``jax.jit`` and command buffers. ``torch_bridge.jax_ops`` uses this route for the Triton
backend on CUDA; everything else goes through ``buffer_callback``.

The launch rules are the torch launchers' (``configs.quant_config``, ``configs.gemm_config``,
``configs.fused_config``, read at trace time), except that the GEMM always runs the pointer kernel
with SPLIT_K = 1 (and the fused chain runs only where the torch launcher would not split K):
jax-triton 0.3.1 has no host-side TMA descriptors, and split-K needs counters that stay zeroed
between launches (the torch launcher keeps them per device). jax-triton gives runtime ``int``
arguments no divisibility hint (torch's launcher marks multiples of 16), which turns the quant
kernels' 16-byte loads of ``o`` into 2-byte loads, so the quant kernels run through thin
wrappers that pass the (fixed) row strides as constexprs.

``jax_triton`` is imported on first use only (``load_jax_triton``); nothing here touches a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from . import configs, interpreter_on, kernels


@functools.cache
def load_jax_triton():
    """``import jax_triton`` once, undoing its ``TRITON_CACHE_DIR=""`` (0.3.1 sets it at import).

    With the variable empty, every later Triton compile in the process (the torch launchers')
    fails with "Could not create or locate cache dir"; a value the user had set is restored.
    Raises ``ImportError`` (jax-triton missing, or a JAX without GPU support).
    """
    before = os.environ.get("TRITON_CACHE_DIR")
    try:
        import jax_triton
    finally:  # 0.3.1 sets the variable before a CPU-only jaxlib makes the import fail
        if os.environ.get("TRITON_CACHE_DIR") == "":
            if before:
                os.environ["TRITON_CACHE_DIR"] = before
            else:
                os.environ.pop("TRITON_CACHE_DIR", None)
    return jax_triton


def import_error() -> str | None:
    """``None`` when ``jax_triton`` imports; else the error, in one line."""
    try:
        load_jax_triton()
    except ImportError as e:  # ImportError's message can span lines (jax-triton's does)
        return f"{type(e).__name__}: {' '.join(str(e).split())}"
    return None


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One ``triton_call``: the kernel, its runtime scalars (after the array inputs), its
    outputs, grid and compile options; ``constexprs`` go to the kernel as keyword metaparams."""

    kernel: Any  # a triton.JITFunction
    scalars: tuple[int, ...]
    out_shape: tuple[jax.ShapeDtypeStruct, ...]
    grid: tuple[int, ...]
    num_warps: int
    num_stages: int | None
    constexprs: tuple[tuple[str, Any], ...]


def run(call: KernelCall, *arrays) -> tuple[jax.Array, ...]:
    """Launch ``call`` on ``arrays`` (dense row-major, 16-byte aligned: any JAX array)."""
    outs = load_jax_triton().triton_call(
        *arrays, *call.scalars, kernel=call.kernel, out_shape=call.out_shape, grid=call.grid,
        num_warps=call.num_warps, num_stages=call.num_stages, **dict(call.constexprs))
    return tuple(outs)


# ---------------------------------------------------------------------------------------------
# Inverse RoPE + 1 x GS E8M0 quantization
# ---------------------------------------------------------------------------------------------

@triton.jit
def _inverse_rope_group_quant_kernel(
    o_ptr, pos_ptr, cos_ptr, sin_ptr, n_rows, n_pos_rows, q_ptr, s_ptr, STRIDE_OS: tl.constexpr,
    STRIDE_CP: tl.constexpr, STRIDE_SP: tl.constexpr, NQ: tl.constexpr, GS: tl.constexpr,
    DH: tl.constexpr, RD: tl.constexpr, INV_FP8_MAX: tl.constexpr, FP8_MAX: tl.constexpr,
    FP8_MIN_NORMAL_EXP: tl.constexpr, AMAX_FLOOR: tl.constexpr, HW_CAST: tl.constexpr,
    ROUND_PRODUCTS: tl.constexpr, BLOCK_R: tl.constexpr
):
    """``kernels.inverse_rope_group_quant_kernel`` with constexpr strides (inlined: same
    code)."""
    kernels.inverse_rope_group_quant_kernel(
        o_ptr=o_ptr, pos_ptr=pos_ptr, cos_ptr=cos_ptr, sin_ptr=sin_ptr, n_rows=n_rows,
        n_pos_rows=n_pos_rows, stride_os=STRIDE_OS, stride_cp=STRIDE_CP, stride_sp=STRIDE_SP,
        q_ptr=q_ptr, s_ptr=s_ptr, NQ=NQ, GS=GS, DH=DH, RD=RD, INV_FP8_MAX=INV_FP8_MAX,
        FP8_MAX=FP8_MAX, FP8_MIN_NORMAL_EXP=FP8_MIN_NORMAL_EXP, AMAX_FLOOR=AMAX_FLOOR,
        HW_CAST=HW_CAST, ROUND_PRODUCTS=ROUND_PRODUCTS, BLOCK_R=BLOCK_R)


@triton.jit
def _inverse_rope_group_quant_head_kernel(
    o_ptr, pos_ptr, cos_ptr, sin_ptr, n_tokens, n_pos_rows, q_ptr, s_ptr, STRIDE_OS: tl.constexpr,
    STRIDE_CP: tl.constexpr, STRIDE_SP: tl.constexpr, H: tl.constexpr, DH: tl.constexpr,
    RD: tl.constexpr, GS: tl.constexpr, INV_FP8_MAX: tl.constexpr, FP8_MAX: tl.constexpr,
    FP8_MIN_NORMAL_EXP: tl.constexpr, AMAX_FLOOR: tl.constexpr, HW_CAST: tl.constexpr,
    ROUND_PRODUCTS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr
):
    """``kernels.inverse_rope_group_quant_head_kernel`` with constexpr strides (inlined)."""
    kernels.inverse_rope_group_quant_head_kernel(
        o_ptr=o_ptr, pos_ptr=pos_ptr, cos_ptr=cos_ptr, sin_ptr=sin_ptr, n_tokens=n_tokens,
        n_pos_rows=n_pos_rows, stride_os=STRIDE_OS, stride_cp=STRIDE_CP, stride_sp=STRIDE_SP,
        q_ptr=q_ptr, s_ptr=s_ptr, H=H, DH=DH, RD=RD, GS=GS, INV_FP8_MAX=INV_FP8_MAX,
        FP8_MAX=FP8_MAX, FP8_MIN_NORMAL_EXP=FP8_MIN_NORMAL_EXP, AMAX_FLOOR=AMAX_FLOOR,
        HW_CAST=HW_CAST, ROUND_PRODUCTS=ROUND_PRODUCTS, BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H)


def _quant_constants(fp8_dtype, amax_floor: float, o_dtype, rope_dtype) -> dict[str, Any]:
    """The quantizing kernels' constexprs (``configs.quant_constants``, ``ROUND_PRODUCTS``) on
    this route's only target, CUDA, where the e4m3fn cast is already round-to-nearest-even."""
    name = np.dtype(fp8_dtype).name
    target = "interpreter" if interpreter_on() else "cuda"
    return dict(configs.quant_constants(name, amax_floor, configs.hw_fp8_cast(name, target)),
                ROUND_PRODUCTS=configs.round_products(np.dtype(o_dtype).name,
                                                      np.dtype(rope_dtype).name, target))


def quant_call(s: int, h: int, dh: int, rd: int, n_pos: int, num_groups: int,
               quant_group_size: int, *, fp8_dtype, amax_floor: float, o_dtype,
               rope_dtype) -> KernelCall:
    """The quant launch for ``o [S, H, Dh]``, cos/sin ``[n_pos, rd / 2]``, positions ``[S]``.

    The kernel and grid are ``configs.quant_launch`` of ``configs.quant_config(S)``, as for
    the torch launcher. Outputs:
    ``x_fp8 [S, G, D]`` in ``fp8_dtype`` and ``x_scale [S, G, D / GS]`` uint8.
    """
    cfg = configs.quant_config(s)
    gs = quant_group_size
    d = h * dh // num_groups
    out_shape = (jax.ShapeDtypeStruct((s, num_groups, d), fp8_dtype),
                 jax.ShapeDtypeStruct((s, num_groups, d // gs), jnp.uint8))
    plan = configs.quant_launch(s, h, dh, gs, cfg)
    constexprs = dict(STRIDE_OS=h * dh, STRIDE_CP=rd // 2, STRIDE_SP=rd // 2, DH=dh, RD=rd, GS=gs,
                      **_quant_constants(fp8_dtype, amax_floor, o_dtype, rope_dtype),
                      **plan.shape)
    kernel = (_inverse_rope_group_quant_head_kernel if plan.per_head
              else _inverse_rope_group_quant_kernel)
    return KernelCall(kernel, (plan.n_work, n_pos), out_shape, plan.grid, cfg.num_warps, None,
                      tuple(constexprs.items()))


def inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups: int,
                             quant_group_size: int, *, fp8_dtype, amax_floor: float):
    """``(x_fp8 [S, G, D] fp8_dtype, x_scale [S, G, D / GS] uint8)``; inputs already checked.

    ``positions`` is ``[S]`` (the caller slices it), ``o`` dense ``[S, H, Dh]``.
    """
    s, h, dh = o.shape
    call = quant_call(s, h, dh, 2 * cos_cache.shape[1], cos_cache.shape[0], num_groups,
                      quant_group_size, fp8_dtype=fp8_dtype, amax_floor=amax_floor,
                      o_dtype=o.dtype, rope_dtype=cos_cache.dtype)
    if s == 0:  # a zero-size grid is not a valid launch
        return tuple(jnp.zeros(t.shape, t.dtype) for t in call.out_shape)
    return run(call, o, positions, cos_cache, sin_cache)


# ---------------------------------------------------------------------------------------------
# Block-scaled FP8 batched GEMM
# ---------------------------------------------------------------------------------------------

def gemm_call(m: int, g: int, n: int, k: int, block: int, n_blocks: int, *,
              dtype) -> KernelCall:
    """The ``batched_gemm_a8w8_mxscale_kernel`` launch (through its wrapper here) for dense
    ``x [M, G, K]``, ``w [G, N, K]``, ``x_scale [M, G, K / B]``, ``w_scale [G, n_blocks, K / B]``
    -> ``y [M, G, N]`` in ``dtype``.

    The tile is ``configs.gemm_config``'s; its TMA and split-K fields are not used (module
    docstring). Strides follow from the shapes.
    """
    cfg = configs.gemm_config(m, g, n, k, block)
    kb = k // block
    constexprs = dict(
        SXM=g * k, SXG=k, SXSM=g * kb, SXSG=kb, SWG=n * k, SWN=k, SWSG=n_blocks * kb, SWSN=kb,
        SYM=g * n, SYG=n, N=n, K=k, SB=block, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        SWAP_AB=cfg.swap_ab,
        OUT_BF16=np.dtype(dtype) == np.dtype(jnp.bfloat16))
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), g, 1)
    return KernelCall(_batched_gemm_a8w8_mxscale_kernel, (m,),
                      (jax.ShapeDtypeStruct((m, g, n), dtype),), grid, cfg.num_warps,
                      cfg.num_stages, tuple(constexprs.items()))


@triton.jit
def _batched_gemm_a8w8_mxscale_kernel(
    x_ptr, w_ptr, xs_ptr, ws_ptr, M, y_ptr, SXM: tl.constexpr, SXG: tl.constexpr,
    SXSM: tl.constexpr, SXSG: tl.constexpr, SWG: tl.constexpr, SWN: tl.constexpr,
    SWSG: tl.constexpr, SWSN: tl.constexpr, SYM: tl.constexpr, SYG: tl.constexpr, N: tl.constexpr,
    K: tl.constexpr, SB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SWAP_AB: tl.constexpr, OUT_BF16: tl.constexpr
):
    """``kernels.batched_gemm_a8w8_mxscale_kernel`` without split-K, so without its scratch
    (inlined)."""
    kernels.batched_gemm_a8w8_mxscale_kernel(
        x_ptr=x_ptr, w_ptr=w_ptr, xs_ptr=xs_ptr, ws_ptr=ws_ptr, M=M, y_ptr=y_ptr, part_ptr=y_ptr,
        count_ptr=y_ptr, SXM=SXM, SXG=SXG, SXSM=SXSM, SXSG=SXSG, SWG=SWG, SWN=SWN, SWSG=SWSG,
        SWSN=SWSN, SYM=SYM, SYG=SYG, N=N, K=K, SB=SB, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        SPLIT_K=1, SWAP_AB=SWAP_AB, OUT_BF16=OUT_BF16)


# ---------------------------------------------------------------------------------------------
# The fused decode chain
# ---------------------------------------------------------------------------------------------

@triton.jit
def _wo_a_fp8_kernel(
    o_ptr, pos_ptr, cos_ptr, sin_ptr, w_ptr, ws_ptr, M, n_pos_rows, x_ptr, xs_ptr, y_ptr,
    SOM: tl.constexpr, SCP: tl.constexpr, SSP: tl.constexpr, SWG: tl.constexpr, SWN: tl.constexpr,
    SWSG: tl.constexpr, SWSN: tl.constexpr, SYM: tl.constexpr, SYG: tl.constexpr, G: tl.constexpr,
    N: tl.constexpr, K: tl.constexpr, SB: tl.constexpr, DH: tl.constexpr, RD: tl.constexpr,
    INV_FP8_MAX: tl.constexpr, FP8_MAX: tl.constexpr, FP8_MIN_NORMAL_EXP: tl.constexpr,
    AMAX_FLOOR: tl.constexpr, HW_CAST: tl.constexpr, ROUND_PRODUCTS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, OUT_BF16: tl.constexpr, QUANT_ROWS: tl.constexpr
):
    """``kernels.wo_a_fp8_kernel`` without split-K, so without its scratch (inlined)."""
    kernels.wo_a_fp8_kernel(
        o_ptr=o_ptr, pos_ptr=pos_ptr, cos_ptr=cos_ptr, sin_ptr=sin_ptr, w_ptr=w_ptr,
        ws_ptr=ws_ptr, M=M, n_pos_rows=n_pos_rows, x_ptr=x_ptr, xs_ptr=xs_ptr, y_ptr=y_ptr,
        part_ptr=y_ptr, count_ptr=y_ptr, SOM=SOM, SCP=SCP, SSP=SSP, SWG=SWG, SWN=SWN,
        SWSG=SWSG, SWSN=SWSN, SYM=SYM, SYG=SYG, G=G, N=N, K=K, SB=SB, DH=DH, RD=RD,
        INV_FP8_MAX=INV_FP8_MAX, FP8_MAX=FP8_MAX, FP8_MIN_NORMAL_EXP=FP8_MIN_NORMAL_EXP,
        AMAX_FLOOR=AMAX_FLOOR, HW_CAST=HW_CAST, ROUND_PRODUCTS=ROUND_PRODUCTS, BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, SPLIT_K=1, OUT_BF16=OUT_BF16, QUANT_ROWS=QUANT_ROWS)


def fused_fits(s: int, g: int, n: int, k: int, block: int, dh: int, rd: int) -> bool:
    """Whether the chain runs natively as one fused launch: where the torch launcher fuses
    (``configs.fused_chosen``) without splitting K (this route keeps no split-K counters):
    DeepSeek V4 at M = 1 and G >= 16."""
    return (configs.fused_blocker(dh, rd, block) is None
            and configs.fused_chosen(s, g, n, k, block)
            and configs.fused_config(s, g, n, k, block).split_k == 1)


def fused_call(s: int, h: int, dh: int, rd: int, n_pos: int, g: int, n: int, k: int,
               block: int, n_blocks: int, *, fp8_dtype, amax_floor: float, dtype, o_dtype,
               rope_dtype) -> KernelCall:
    """The fused chain's launch for dense ``o [S, H, Dh]``, positions ``[S]``, cos/sin
    ``[n_pos, rd / 2]``, ``w [G, N, K]``, ``w_scale [G, n_blocks, K / B]`` (uint8). Outputs:
    the quantized activations ``x_fp8 [S, G, K]``, ``x_scale [S, G, K / B]`` uint8 (scratch)
    and ``y [S, G, N]`` in ``dtype``. The tile is ``configs.fused_config``'s."""
    cfg = configs.fused_config(s, g, n, k, block)
    if cfg.split_k != 1:
        raise ValueError(f"the native fused chain does not split K; fused_config({s}, {g}, ...) "
                         f"asks for split_k={cfg.split_k} (see fused_fits)")
    kb = k // block
    out_shape = (jax.ShapeDtypeStruct((s, g, k), fp8_dtype),
                 jax.ShapeDtypeStruct((s, g, kb), jnp.uint8),
                 jax.ShapeDtypeStruct((s, g, n), dtype))
    constexprs = dict(
        SOM=h * dh, SCP=rd // 2, SSP=rd // 2, SWG=n * k, SWN=k, SWSG=n_blocks * kb, SWSN=kb,
        SYM=g * n, SYG=n, G=g, N=n, K=k, SB=block, DH=dh, RD=rd,
        **_quant_constants(fp8_dtype, amax_floor, o_dtype, rope_dtype), BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, OUT_BF16=np.dtype(dtype) == np.dtype(jnp.bfloat16),
        QUANT_ROWS=configs.FUSED_QUANT_LANES // block)
    grid = (triton.cdiv(s, cfg.block_m) * triton.cdiv(n, cfg.block_n), g, 1)
    return KernelCall(_wo_a_fp8_kernel, (s, n_pos), out_shape, grid, cfg.num_warps, cfg.num_stages,
                      tuple(constexprs.items()))


def wo_a_fp8(o, positions, cos_cache, sin_cache, w, w_scale, num_groups: int, *,
             amax_floor: float, dtype):
    """``y [S, G, N]`` of the fused chain (``fused_fits`` must hold); inputs already checked,
    ``positions`` ``[S]`` (the caller slices it)."""
    s, h, dh = o.shape
    g, n, k = w.shape
    call = fused_call(s, h, dh, 2 * cos_cache.shape[1], cos_cache.shape[0], num_groups, n, k,
                      k // w_scale.shape[2], w_scale.shape[1], fp8_dtype=w.dtype,
                      amax_floor=amax_floor, dtype=dtype, o_dtype=o.dtype,
                      rope_dtype=cos_cache.dtype)
    _, _, y = run(call, o, positions, cos_cache, sin_cache, w, _scale_bytes(w_scale))
    return y


def _scale_bytes(x):
    """E8M0 scales as uint8 (jax-triton has no Triton type for float8_e8m0fnu)."""
    return x if x.dtype == jnp.uint8 else jax.lax.bitcast_convert_type(x, jnp.uint8)


def batched_gemm_a8w8_mxscale(x, w, x_scale, w_scale, *, dtype):
    """``y [M, G, N]`` in ``dtype`` (bf16 or fp32); inputs already checked by the caller."""
    m, g, k = x.shape
    n = w.shape[1]
    call = gemm_call(m, g, n, k, k // x_scale.shape[2], w_scale.shape[1], dtype=dtype)
    if m == 0:
        return jnp.zeros((0, g, n), dtype)
    (y,) = run(call, x, w, _scale_bytes(x_scale), _scale_bytes(w_scale))
    return y
