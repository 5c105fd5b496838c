"""Native JAX launches of the Triton kernels: XLA custom calls to ``xla_ffi``'s handler.

Each launch is compiled at trace time and lowered to the ``woa_triton_launch`` custom call
(``xla_ffi``), which XLA runs on its own stream with no Python at run time.
``torch_bridge.jax_ops`` uses this route for the Triton backend on CUDA; everything else goes
through ``buffer_callback``.

The kernels, launch rules and specialization are the torch launchers' (``kernels``,
``wgmma_kernels``, ``configs.quant_config``, ``configs.gemm_config``, ``configs.wo_a_fp8_config``,
read at trace time), except that nothing splits K (split-K needs counters that stay zeroed
between launches): the GEMM runs the Hopper wgmma kernel where the torch launcher does, else
the pointer kernel with SPLIT_K = 1, and the fused chain runs only where the torch launcher
would not split K. Nothing here touches a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import woa_jax

from ..._capability import interpreter_on
from . import configs, plans, xla_ffi
from .xla_ffi import Ref


def unavailable_reason() -> str | None:
    """``None`` when the custom call's handler builds and registers; else why not."""
    return xla_ffi.unavailable_reason()


@functools.cache
def capability() -> int:
    """The compute capability the kernels are compiled for: JAX's first device's (``90``)."""
    major, minor = jax.devices()[0].compute_capability.split(".")
    return 10 * int(major) + int(minor)


@functools.cache
def sm_count() -> int:
    """Streaming multiprocessors of JAX's first device (the persistent kernels' grids)."""
    return jax.devices()[0].core_count


@functools.cache
def wgmma_ok() -> bool:
    """Whether the GEMM may take the wgmma kernel here: Hopper, and a Triton with Gluon's
    Hopper dialect (as ``gemm.wgmma_available`` decides for torch)."""
    if capability() // 10 != 9:
        return False
    try:
        from . import wgmma_kernels  # noqa: F401
    except ImportError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One launch: the kernel, one entry per runtime parameter (a ``Ref`` to an input or an
    output, inputs first, or an ``int``), its outputs, grid and compile options;
    ``constexprs`` go to the kernel as keyword metaparams."""

    kernel: Any  # a triton.JITFunction
    args: tuple[Ref | int, ...]
    out_shape: tuple[jax.ShapeDtypeStruct, ...]
    grid: tuple[int, ...]
    num_warps: int
    num_stages: int | None
    constexprs: tuple[tuple[str, Any], ...]

    @property
    def scalars(self) -> tuple[int, ...]:
        return tuple(a for a in self.args if not isinstance(a, Ref))


def run(call: KernelCall, *arrays) -> tuple[jax.Array, ...]:
    """Launch ``call`` on ``arrays`` (dense row-major JAX arrays)."""
    return tuple(xla_ffi.lower(call.kernel, call.args, arrays, call.out_shape, call.grid,
                               num_warps=call.num_warps, num_stages=call.num_stages,
                               constexprs=dict(call.constexprs), capability=capability()))


# ---------------------------------------------------------------------------------------------
# Inverse RoPE + 1 x GS E8M0 quantization
# ---------------------------------------------------------------------------------------------

def _target() -> str:
    """This route's only targets: CUDA, or the interpreter in CPU tests."""
    return "interpreter" if interpreter_on() else "cuda"


def _call(plan: plans.Plan, args: tuple, out_shape: tuple) -> KernelCall:
    return KernelCall(plan.kernel, args, out_shape, plan.grid, plan.num_warps, plan.num_stages,
                      tuple(plan.constexprs.items()))


def quant_call(s: int, h: int, dh: int, rd: int, n_pos: int, num_groups: int,
               quant_group_size: int, *, fp8_dtype, amax_floor: float, o_dtype,
               rope_dtype) -> KernelCall:
    """The quant launch for ``o [S, H, Dh]``, cos/sin ``[n_pos, rd / 2]``, positions ``[S]``
    (``plans.quant`` of ``configs.quant_config(S)``, as for the torch launcher). Outputs:
    ``x_fp8 [S, G, D]`` in ``fp8_dtype`` and ``x_scale [S, G, D / GS]`` uint8.
    """
    gs = quant_group_size
    d = h * dh // num_groups
    out_shape = (jax.ShapeDtypeStruct((s, num_groups, d), fp8_dtype),
                 jax.ShapeDtypeStruct((s, num_groups, d // gs), jnp.uint8))
    plan = plans.quant(s, h, dh, rd, gs, configs.quant_config(s), fp8=np.dtype(fp8_dtype).name,
                       amax_floor=amax_floor, o_dtype=np.dtype(o_dtype).name,
                       rope_dtype=np.dtype(rope_dtype).name, target=_target())
    o, pos, cos, sin, q, scale = map(Ref, range(6))
    return _call(plan, (o, pos, cos, sin, plan.n_work, n_pos, h * dh, rd // 2, rd // 2, q, scale),
                 out_shape)


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

def gemm_call(m: int, g: int, n: int, k: int, block: int, n_blocks: int, *, dtype,
              wgmma: bool = False, sms: int = 0) -> KernelCall:
    """The GEMM launch for dense ``x [M, G, K]``, ``w [G, N, K]``, ``x_scale [M, G, K / B]``,
    ``w_scale [G, n_blocks, K / B]`` -> ``y [M, G, N]`` in ``dtype``.

    The tile is ``configs.gemm_config(..., wgmma=wgmma)``'s: the wgmma kernel where it picks
    it (``sms``: the GPU's SM count, for its persistent grid), else the pointer kernel
    without its TMA field; neither splits K (module docstring).
    """
    cfg = dataclasses.replace(configs.gemm_config(m, g, n, k, block, wgmma=wgmma), split_k=1)
    kb = k // block
    strides = dict(x_scale=plans.dense(m, g, kb), w_scale=plans.dense(g, n_blocks, kb))
    out_shape = (jax.ShapeDtypeStruct((m, g, n), dtype),)
    if cfg.wgmma:
        from . import wgmma_kernels

        plan, views = plans.gemm_wgmma(m, g, n, k, block, cfg, sms, x_row=g * k, y_row=g * n,
                                       out_bytes=np.dtype(dtype).itemsize, **strides)
        names = ("float8_e4m3fn", "float8_e4m3fn", np.dtype(dtype).name)
        x, w, y = (xla_ffi.Desc(index, shape, view_strides[0], tile,
                                wgmma_kernels.smem_layout(tile, name))
                   for index, (shape, view_strides, tile), name in zip((0, 1, 4), views, names,
                                                                       strict=True))
        # Unsplit, the parts and counters are never touched: y stands in for them.
        return _call(plan, (x, w, y, Ref(2), Ref(3), m, plan.grid[0], Ref(4), Ref(4)),
                     out_shape)
    plan = plans.gemm_pointer(m, g, n, k, block, cfg, cfg.split_k, x=plans.dense(m, g, k),
                              w=plans.dense(g, n, k), y=plans.dense(m, g, n),
                              out_bf16=np.dtype(dtype) == np.dtype(jnp.bfloat16), **strides)
    x, w, xs, ws, y = map(Ref, range(5))
    return _call(plan, (x, w, xs, ws, m, y, y, y), out_shape)


# ---------------------------------------------------------------------------------------------
# The fused decode chain
# ---------------------------------------------------------------------------------------------

def wo_a_fp8_fits(s: int, g: int, n: int, k: int, block: int, dh: int, rd: int) -> bool:
    """Whether the chain runs natively as one fused launch: where the torch launcher fuses
    (``configs.wo_a_fp8_chosen``) without splitting K (this route keeps no split-K counters):
    DeepSeek V4 at M = 1 and G >= 16."""
    return (configs.wo_a_fp8_blocker(dh, rd, block) is None
            and configs.wo_a_fp8_chosen(s, g, n, k, block)
            and configs.wo_a_fp8_config(s, g, n, k, block).split_k == 1)


def wo_a_fp8_call(s: int, h: int, dh: int, rd: int, n_pos: int, g: int, n: int, k: int,
                  block: int, n_blocks: int, *, fp8_dtype, amax_floor: float, dtype, o_dtype,
                  rope_dtype) -> KernelCall:
    """The one-launch chain for dense ``o [S, H, Dh]``, positions ``[S]``, cos/sin
    ``[n_pos, rd / 2]``, ``w [G, N, K]``, ``w_scale [G, n_blocks, K / B]`` (uint8). Outputs:
    the quantized activations ``x_fp8 [S, G, K]``, ``x_scale [S, G, K / B]`` uint8 (scratch)
    and ``y [S, G, N]`` in ``dtype``. The tile is ``configs.wo_a_fp8_config``'s."""
    cfg = configs.wo_a_fp8_config(s, g, n, k, block)
    if cfg.split_k != 1:
        raise ValueError(f"the native wo_a_fp8 kernel does not split K; wo_a_fp8_config({s}, "
                         f"{g}, ...) asks for split_k={cfg.split_k} (see wo_a_fp8_fits)")
    kb = k // block
    out_shape = (jax.ShapeDtypeStruct((s, g, k), fp8_dtype),
                 jax.ShapeDtypeStruct((s, g, kb), jnp.uint8),
                 jax.ShapeDtypeStruct((s, g, n), dtype))
    plan = plans.wo_a_fp8(
        s, dh, rd, g, n, k, block, cfg, 1, o_row=h * dh, cos_row=rd // 2, sin_row=rd // 2,
        w=plans.dense(g, n, k), w_scale=plans.dense(g, n_blocks, kb), y=plans.dense(s, g, n),
        fp8=np.dtype(fp8_dtype).name, amax_floor=amax_floor, o_dtype=np.dtype(o_dtype).name,
        rope_dtype=np.dtype(rope_dtype).name, out_bf16=np.dtype(dtype) == np.dtype(jnp.bfloat16),
        target=_target())
    o, pos, cos, sin, w, ws, x, xs, y = map(Ref, range(9))
    return _call(plan, (o, pos, cos, sin, w, ws, s, n_pos, x, xs, y, y, y), out_shape)


def wo_a_fp8(o, positions, cos_cache, sin_cache, w, w_scale, num_groups: int, *,
             amax_floor: float, dtype):
    """``y [S, G, N]`` of the fused chain (``wo_a_fp8_fits`` must hold); inputs already checked,
    ``positions`` ``[S]`` (the caller slices it)."""
    s, h, dh = o.shape
    g, n, k = w.shape
    call = wo_a_fp8_call(s, h, dh, 2 * cos_cache.shape[1], cos_cache.shape[0], num_groups, n, k,
                      k // w_scale.shape[2], w_scale.shape[1], fp8_dtype=w.dtype,
                      amax_floor=amax_floor, dtype=dtype, o_dtype=o.dtype,
                      rope_dtype=cos_cache.dtype)
    _, _, y = run(call, o, positions, cos_cache, sin_cache, w, woa_jax.e8m0_bytes(w_scale))
    return y


def batched_gemm_a8w8_mxscale(x, w, x_scale, w_scale, *, dtype):
    """``y [M, G, N]`` in ``dtype`` (bf16 or fp32); inputs already checked by the caller."""
    m, g, k = x.shape
    n = w.shape[1]
    wgmma = wgmma_ok()
    call = gemm_call(m, g, n, k, k // x_scale.shape[2], w_scale.shape[1], dtype=dtype,
                     wgmma=wgmma, sms=sm_count() if wgmma else 0)
    if m == 0:
        return jnp.zeros((0, g, n), dtype)
    (y,) = run(call, x, w, woa_jax.e8m0_bytes(x_scale), woa_jax.e8m0_bytes(w_scale))
    return y
