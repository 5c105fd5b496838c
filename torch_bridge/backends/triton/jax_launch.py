"""Native JAX launches of the Triton kernels: XLA custom calls to ``xla_ffi``'s handler.

Each launch is compiled at trace time and lowered to the ``woa_triton_launch`` custom call
(``xla_ffi``), which XLA runs on its own stream with no Python at run time.
``torch_bridge.jax_ops`` uses this route for the Triton backend on CUDA; everything else goes
through ``buffer_callback``.

The kernels, launch rules and specialization are the torch launchers' (``kernels``,
``wgmma_kernels``, ``wgmma_ws_kernels``, ``configs.quant_config``, ``configs.gemm_config``,
``configs.wo_a_fp8_config``, read at trace time), split-K included: the GEMM runs the Hopper
wgmma kernel where the torch launcher does, else the pointer kernel, and the fused chain where
the torch launcher fuses it. Elsewhere the chain is one custom call of two launches, the quant
and the GEMM, the GEMM its programmatic dependent where torch's launcher makes it one
(``configs.chain_dependent``): its weight stream overlaps the quant, in a command buffer too.

What a call writes besides its result is XLA's too, so command buffers replay it safely: one
scratch output (``Scratch``) holds the chain's quantized activations and, where K is split,
the fp32 parts; split-K's tile counters are an operand of zeros made inside the jit and
aliased to the last output (``run``; XLA zeroes every layer's counters of a step in one
kernel). One scratch buffer, not a few small ones: XLA may place a small dead buffer inside a
step's output allocation, whose address changes every step, and a command buffer then
records again every call that touches it. Nothing here touches a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import woa_jax

from ..._capability import env_flag, interpreter_on, jax_gpu_platform
from . import configs, plans, xla_ffi
from .xla_ffi import Ref


def unavailable_reason() -> str | None:
    """``None`` when the custom call's handler builds and registers; else why not."""
    return xla_ffi.unavailable_reason()


@functools.cache
def capability() -> int:
    """The compute capability the kernels are compiled for: JAX's first device's (``90``); 0
    off CUDA (a CPU backend, a ROCm GPU), where nothing here is Hopper's."""
    if jax_gpu_platform() != "cuda":
        return 0
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


def pdl_ok() -> bool:
    """Whether launch shapes that ask for a programmatic dependent launch get one here: on
    CUDA from Hopper on (``plans.pdl_launches``), unless ``WOA_PDL=0`` (``_common.chain_pdl``'s
    rule for torch)."""
    return env_flag("WOA_PDL", True) and plans.pdl_launches(_target(), capability())


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """One launch: the kernel, one entry per runtime parameter (a ``Ref`` to an input or an
    output, inputs first, or an ``int``), its outputs, grid and compile options;
    ``constexprs`` go to the kernel as keyword metaparams. ``results``: the leading outputs
    ``run`` returns (``None``: all); the others are the call's scratch (``_layout``).
    ``counters`` (split-K only, else 0): the tile counters ``run`` passes as one more input,
    zeros, aliased to the last output."""

    kernel: Any  # a triton.JITFunction
    args: tuple[Ref | int, ...]
    out_shape: tuple[jax.ShapeDtypeStruct, ...]
    grid: tuple[int, ...]
    num_warps: int
    num_stages: int | None
    constexprs: tuple[tuple[str, Any], ...]
    counters: int = 0
    results: int | None = None

    @property
    def scalars(self) -> tuple[int, ...]:
        return tuple(a for a in self.args if not isinstance(a, Ref))

    @property
    def launches(self) -> tuple[KernelCall, ...]:
        return (self,)

    def renumbered(self, operands: tuple[Ref, ...]) -> KernelCall:
        """This launch inside a larger call: its operand ``i`` is that call's ``operands[i]``
        (a ``Ref``, a view into the larger call's scratch where it has an offset)."""
        return dataclasses.replace(self, args=tuple(_moved(a, operands) for a in self.args))


def _moved(a, operands: tuple[Ref, ...]):
    """``a`` (a ``Ref``, ``Desc`` or scalar) with its operand replaced by ``operands``'."""
    if isinstance(a, Ref):
        to = operands[a.index]
        return Ref(to.index, to.offset + a.offset, a.dtype or to.dtype)
    if isinstance(a, xla_ffi.Desc):
        to = operands[a.index]
        if to.offset:
            raise ValueError("a TMA descriptor's operand must start its buffer")
        return dataclasses.replace(a, index=to.index, dtype=a.dtype or to.dtype)
    return a


@dataclasses.dataclass(frozen=True)
class ChainCall:
    """Launches made by one custom call, in order (``xla_ffi.lower``); their ``Ref`` s count
    this call's operands. ``out_shape``, ``counters`` and ``results`` as ``KernelCall``'s."""

    launches: tuple[KernelCall, ...]
    out_shape: tuple[jax.ShapeDtypeStruct, ...]
    counters: int = 0
    results: int | None = None


def run(call: KernelCall | ChainCall, *arrays) -> tuple[jax.Array, ...]:
    """Launch ``call`` on ``arrays`` (dense row-major JAX arrays); its results. A split launch
    gets its counters as zeros made here, inside the jit: the kernel leaves them at zero, but
    only a fresh operand lets XLA own them (and see them written, through the alias). XLA
    makes the zeros of every layer of a step in one kernel."""
    aliases = None
    if call.counters:
        aliases = {len(arrays): len(call.out_shape) - 1}
        arrays = (*arrays, jnp.zeros(call.counters, jnp.int32))
    outs = xla_ffi.lower(call.launches, arrays, call.out_shape, capability=capability(),
                         aliases=aliases)
    return tuple(outs[:call.results])


#: Byte alignment of each piece of a call's scratch.
SCRATCH_ALIGN = 128


@dataclasses.dataclass(frozen=True)
class Scratch:
    """A call's scratch: one ``uint8`` output holding named pieces, each at a multiple of
    ``SCRATCH_ALIGN`` bytes, the first at 0 (where a TMA descriptor may start); ``refs`` point
    at them, in that output, as their own dtypes."""

    nbytes: int
    refs: dict[str, Ref]

    @classmethod
    def of(cls, index: int, **pieces: tuple[tuple[int, ...], Any]) -> Scratch:
        """Lay out ``pieces`` (``name=(shape, dtype)``) in order as operand ``index``."""
        refs, at = {}, 0
        for name, (shape, dtype) in pieces.items():
            refs[name] = Ref(index, at, np.dtype(dtype).name)
            at += -(-math.prod(shape) * np.dtype(dtype).itemsize // SCRATCH_ALIGN) * SCRATCH_ALIGN
        return cls(at, refs)

    @property
    def shape(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((self.nbytes,), jnp.uint8)


def _layout(n_in: int, results: tuple, cfg: configs.GemmConfig, m: int, g: int, n: int,
            **pieces) -> tuple[tuple, dict, int]:
    """``(out_shape, refs, counters)`` of a launch with ``n_in`` inputs whose outputs start
    with ``results``. Then, where it has ``pieces`` (``name=(shape, dtype)``) or splits K, one
    scratch output (``Scratch``): the pieces, then split-K's fp32 ``parts [split_k, M, G, N]``.
    Split, the counters (one per output tile, ``KernelCall.counters``) come in as one more
    input, which shifts the outputs by one, and go out last, aliased. ``refs``: ``results``
    (their ``Ref`` s), each piece, ``parts`` and ``counters`` (unsplit: the first result
    stands in for both, never touched)."""
    counters = configs.programs(cfg, m, g, n) if cfg.split_k > 1 else 0
    first = n_in + bool(counters)
    refs = {"results": tuple(Ref(first + i) for i in range(len(results)))}
    out_shape = tuple(results)
    if counters:
        pieces = {**pieces, "parts": ((cfg.split_k, m, g, n), jnp.float32)}
    if pieces:
        scratch = Scratch.of(first + len(results), **pieces)
        refs.update(scratch.refs)
        out_shape += (scratch.shape,)
    if counters:
        refs["counters"] = Ref(n_in)
        out_shape += (jax.ShapeDtypeStruct((counters,), jnp.int32),)
    else:
        refs["parts"] = refs["counters"] = refs["results"][0]
    return out_shape, refs, counters


# ---------------------------------------------------------------------------------------------
# Inverse RoPE + 1 x GS E8M0 quantization
# ---------------------------------------------------------------------------------------------

def _target() -> str:
    """This route's only targets: CUDA, or the interpreter in CPU tests."""
    return "interpreter" if interpreter_on() else "cuda"


def _call(plan: plans.Plan, args: tuple, out_shape: tuple, counters: int = 0,
          results: int | None = None) -> KernelCall:
    return KernelCall(plan.kernel, args, out_shape, plan.grid, plan.num_warps, plan.num_stages,
                      tuple(plan.constexprs.items()), counters, results)


def quant_call(s: int, h: int, dh: int, rd: int, n_pos: int, num_groups: int,
               quant_group_size: int, *, fp8_dtype, amax_floor: float, o_dtype,
               rope_dtype, dependent: bool = False) -> KernelCall:
    """The quant launch for ``o [S, H, Dh]``, cos/sin ``[n_pos, rd / 2]``, positions ``[S]``
    (``plans.quant`` of ``configs.quant_config(S, heads=H, dependent=dependent)``, as for the
    torch launcher; a programmatic dependent launch where that asks and ``pdl_ok``). Outputs:
    ``x_fp8 [S, G, D]`` in ``fp8_dtype`` and ``x_scale [S, G, D / GS]`` uint8.
    """
    gs = quant_group_size
    d = h * dh // num_groups
    out_shape = (jax.ShapeDtypeStruct((s, num_groups, d), fp8_dtype),
                 jax.ShapeDtypeStruct((s, num_groups, d // gs), jnp.uint8))
    cfg = configs.quant_config(s, heads=h, dependent=dependent)
    plan = plans.quant(s, h, dh, rd, gs, cfg, fp8=np.dtype(fp8_dtype).name,
                       amax_floor=amax_floor, o_dtype=np.dtype(o_dtype).name,
                       rope_dtype=np.dtype(rope_dtype).name, target=_target(),
                       pdl=cfg.pdl and pdl_ok())
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
              wgmma: bool = False, sms: int = 0, dependent: bool = False) -> KernelCall:
    """The GEMM launch for dense ``x [M, G, K]``, ``w [G, N, K]``, ``x_scale [M, G, K / B]``,
    ``w_scale [G, n_blocks, K / B]`` -> ``y [M, G, N]`` in ``dtype``.

    The launch shape is ``configs.gemm_config(..., wgmma=wgmma)``'s, K split included: the
    wgmma kernel where it picks it (``sms``: the GPU's SM count, for its persistent grid), else
    the pointer kernel without its TMA field (the TMA kernel does not split; the tile is the
    same). Split, the parts are the call's scratch and the counters its last operand
    (``_layout``). ``dependent``: the wgmma kernel launches as the quant's programmatic
    dependent (``wo_a_fp8_chain_call``).
    """
    cfg = configs.gemm_config(m, g, n, k, block, wgmma=wgmma)
    if dependent and cfg.wgmma:
        cfg = dataclasses.replace(cfg, pdl=True)
    kb = k // block
    strides = dict(x_scale=plans.dense(m, g, kb), w_scale=plans.dense(g, n_blocks, kb))
    out_shape, refs, tiles = _layout(4, (jax.ShapeDtypeStruct((m, g, n), dtype),), cfg, m, g,
                                     n)
    (y,), parts, counters = refs["results"], refs["parts"], refs["counters"]
    if cfg.wgmma:
        from . import wgmma_kernels

        plan, views = plans.gemm_wgmma(m, g, n, k, block, cfg, sms, x_row=g * k, y_row=g * n,
                                       out_bytes=np.dtype(dtype).itemsize, **strides)
        names = ("float8_e4m3fn", "float8_e4m3fn", np.dtype(dtype).name)
        x, w, y_desc = (xla_ffi.Desc(index, shape, view_strides[0], tile,
                                     wgmma_kernels.smem_layout(tile, name))
                        for index, (shape, view_strides, tile), name in zip(
                            (0, 1, y.index), views, names, strict=True))
        return _call(plan, (x, w, y_desc, Ref(2), Ref(3), m, plan.grid[0], parts, counters),
                     out_shape, tiles, 1)
    plan = plans.gemm_pointer(m, g, n, k, block, cfg, cfg.split_k, x=plans.dense(m, g, k),
                              w=plans.dense(g, n, k), y=plans.dense(m, g, n),
                              out_bf16=np.dtype(dtype) == np.dtype(jnp.bfloat16), **strides)
    x, w, xs, ws = map(Ref, range(4))
    return _call(plan, (x, w, xs, ws, m, y, parts, counters), out_shape, tiles, 1)


# ---------------------------------------------------------------------------------------------
# The chain: one fused launch, or the quant and the GEMM in one call
# ---------------------------------------------------------------------------------------------

def wo_a_fp8_fits(s: int, g: int, n: int, k: int, block: int, dh: int, rd: int) -> bool:
    """Whether the chain runs natively as one fused launch: exactly where the torch launcher
    fuses it (``configs.wo_a_fp8_chosen``, with ``wo_a_fp8_chain_call``'s dependent GEMM),
    split K included, so both run the same kernels."""
    return (configs.wo_a_fp8_blocker(dh, rd, block) is None
            and configs.wo_a_fp8_chosen(s, g, n, k, block,
                                        dependent=chain_dependent(s, g, n, k, block,
                                                                  wgmma=wgmma_ok()),
                                        wgmma=wgmma_ok()))


def chain_dependent(s: int, g: int, n: int, k: int, block: int, *, wgmma: bool) -> bool:
    """Whether ``wo_a_fp8_chain_call`` launches its GEMM as the quant's programmatic dependent
    (``configs.chain_dependent`` where ``pdl_ok``; ``wgmma``: the GEMM may take the wgmma
    kernel), as ``gemm.chain_dependent`` decides for torch."""
    return pdl_ok() and configs.chain_dependent(s, g, n, k, block, wgmma=wgmma)


def wo_a_fp8_call(s: int, h: int, dh: int, rd: int, n_pos: int, g: int, n: int, k: int,
                  block: int, n_blocks: int, *, fp8_dtype, amax_floor: float, dtype, o_dtype,
                  rope_dtype) -> KernelCall:
    """The one-launch chain for dense ``o [S, H, Dh]``, positions ``[S]``, cos/sin
    ``[n_pos, rd / 2]``, ``w [G, N, K]``, ``w_scale [G, n_blocks, K / B]`` (uint8). Outputs:
    ``y [S, G, N]`` in ``dtype``, then the scratch (``_layout``): the quantized activations
    ``x_fp8 [S, G, K]`` and ``x_scale [S, G, K / B]`` (uint8), and split-K's parts where
    ``configs.wo_a_fp8_config`` (the tile) splits, then its counters. The kernel is the one
    that tile names: ``wo_a_fp8_kernel``, or for a wgmma tile ``wo_a_fp8_wgmma_kernel``."""
    cfg = configs.wo_a_fp8_config(s, g, n, k, block, wgmma=wgmma_ok())
    kb = k // block
    out_shape, refs, tiles = _layout(
        6, (jax.ShapeDtypeStruct((s, g, n), dtype),), cfg, s, g, n,
        x_fp8=((s, g, k), fp8_dtype), x_scale=((s, g, kb), jnp.uint8))
    kinds = dict(fp8=np.dtype(fp8_dtype).name, amax_floor=amax_floor,
                 o_dtype=np.dtype(o_dtype).name, rope_dtype=np.dtype(rope_dtype).name,
                 target=_target())
    rows = dict(o_row=h * dh, cos_row=rd // 2, sin_row=rd // 2)
    o, pos, cos, sin, w, ws = map(Ref, range(6))
    scratch = (refs["x_fp8"], refs["x_scale"])
    if cfg.wgmma:
        from . import wgmma_kernels

        plan, views = plans.wo_a_fp8_wgmma(
            s, dh, rd, g, n, k, block, cfg, w_scale=plans.dense(g, n_blocks, kb), y_row=g * n,
            out_bytes=np.dtype(dtype).itemsize, **rows, **kinds)
        # x_fp8 starts the scratch (``Scratch``), where its descriptor may start.
        names = (np.dtype(fp8_dtype).name,) * 2 + (np.dtype(dtype).name,)
        x_desc, w_desc, y_desc = (
            xla_ffi.Desc(ref.index, shape, view_strides[0], tile,
                         wgmma_kernels.smem_layout(tile, name), ref.dtype)
            for ref, (shape, view_strides, tile), name in zip(
                (refs["x_fp8"], w, refs["results"][0]), views, names, strict=True))
        return _call(plan, (x_desc, w_desc, y_desc, o, pos, cos, sin, ws, s, n_pos,
                            plan.grid[0], *scratch, refs["parts"], refs["counters"]),
                     out_shape, tiles, 1)
    plan = plans.wo_a_fp8(
        s, dh, rd, g, n, k, block, cfg, cfg.split_k, w=plans.dense(g, n, k),
        w_scale=plans.dense(g, n_blocks, kb), y=plans.dense(s, g, n),
        out_bf16=np.dtype(dtype) == np.dtype(jnp.bfloat16), **rows, **kinds)
    return _call(plan, (o, pos, cos, sin, w, ws, s, n_pos, *scratch, *refs["results"],
                        refs["parts"], refs["counters"]), out_shape, tiles, 1)


def wo_a_fp8_chain_call(s: int, h: int, dh: int, rd: int, n_pos: int, g: int, n: int, k: int,
                        block: int, n_blocks: int, *, fp8_dtype, amax_floor: float, dtype,
                        o_dtype, rope_dtype, wgmma: bool = False, sms: int = 0) -> ChainCall:
    """The unfused chain as one call: ``quant_call``, then ``gemm_call`` on its outputs, the
    GEMM the quant's programmatic dependent where torch's launcher makes it one
    (``configs.chain_dependent``, ``pdl_ok``). Operands as ``wo_a_fp8_call``'s: inputs ``o``,
    positions, cos, sin, ``w``, ``w_scale`` (uint8) and, split, the GEMM's counters; outputs
    ``y``, then one scratch holding the quant's outputs (``x_fp8`` first, where the GEMM's
    descriptor may start) and the GEMM's parts, then the counters."""
    dependent = chain_dependent(s, g, n, k, block, wgmma=wgmma)
    quant = quant_call(s, h, dh, rd, n_pos, g, block, fp8_dtype=fp8_dtype, amax_floor=amax_floor,
                       o_dtype=o_dtype, rope_dtype=rope_dtype, dependent=dependent)
    gemm = gemm_call(s, g, n, k, block, n_blocks, dtype=dtype, wgmma=wgmma, sms=sms,
                     dependent=dependent)
    split = bool(gemm.counters)
    pieces = dict(x_fp8=(quant.out_shape[0].shape, fp8_dtype),
                  x_scale=(quant.out_shape[1].shape, jnp.uint8))
    if split:  # the GEMM's own scratch (its parts)
        pieces["gemm"] = (gemm.out_shape[1].shape, jnp.uint8)
    y = 6 + split
    scratch = Scratch.of(y + 1, **pieces)
    x, xs = scratch.refs["x_fp8"], scratch.refs["x_scale"]
    # The GEMM's operands: x, w, x_scale, w_scale, [counters], y, [its scratch, counters out].
    gemm = gemm.renumbered((x, Ref(4), xs, Ref(5), *(Ref(6),) * split, Ref(y),
                            *((scratch.refs["gemm"], Ref(y + 2)) if split else ())))
    return ChainCall((quant.renumbered((*map(Ref, range(4)), x, xs)), gemm),
                     (gemm.out_shape[0], scratch.shape, *gemm.out_shape[2:]), gemm.counters, 1)


def wo_a_fp8(o, positions, cos_cache, sin_cache, w, w_scale, num_groups: int, *,
             amax_floor: float, dtype, packed=None):
    """``y [S, G, N]`` of the chain in one custom call: the fused launch where
    ``wo_a_fp8_fits``, else ``wo_a_fp8_chain_call``; inputs already checked, ``positions``
    ``[S]`` (the caller slices it). ``packed``: a ``jax_ops.FP8Weight`` whose ``data`` the
    kernels read ``w`` and ``w_scale`` from in place (``w``, ``w_scale``: its shapes)."""
    s, h, dh = o.shape
    g, n, k = w.shape
    if s == 0:  # a zero-size grid is not a valid launch
        return jnp.zeros((0, g, n), dtype)
    rd, block = 2 * cos_cache.shape[1], k // w_scale.shape[2]
    shape = (s, h, dh, rd, cos_cache.shape[0], num_groups, n, k, block, w_scale.shape[1])
    kinds = dict(fp8_dtype=w.dtype, amax_floor=amax_floor, dtype=dtype, o_dtype=o.dtype,
                 rope_dtype=cos_cache.dtype)
    if wo_a_fp8_fits(s, g, n, k, block, dh, rd):
        call = wo_a_fp8_call(*shape, **kinds)
    else:
        wgmma = wgmma_ok()
        call = wo_a_fp8_chain_call(*shape, **kinds, wgmma=wgmma, sms=sm_count() if wgmma else 0)
    if packed is not None:
        (y,) = run(weight_in_place(call, packed.scale_offset, np.dtype(w.dtype).name), o,
                   positions, cos_cache, sin_cache, packed.data)
        return y
    (y,) = run(call, o, positions, cos_cache, sin_cache, w, woa_jax.e8m0_bytes(w_scale))
    return y


def weight_in_place(call: KernelCall | ChainCall, scale_offset: int, fp8: str):
    """``call`` (inputs ``o``, positions, cos, sin, ``w``, ``w_scale``, then the rest) with
    ``w`` and ``w_scale`` read from one ``uint8`` operand, input 4: ``w`` at its start (where
    a TMA descriptor may start), ``w_scale`` ``scale_offset`` bytes in; every later operand
    one place earlier."""
    n_operands = 1 + max(_operand_indices(call))
    moved = (*map(Ref, range(4)), Ref(4, 0, fp8), Ref(4, scale_offset, "uint8"),
             *(Ref(i - 1) for i in range(6, max(6, n_operands))))
    launches = tuple(launch.renumbered(moved) for launch in call.launches)
    if isinstance(call, KernelCall):
        return launches[0]
    return dataclasses.replace(call, launches=launches)


def _operand_indices(call: KernelCall | ChainCall):
    """Every operand index a launch of ``call`` refers to."""
    for launch in call.launches:
        for a in launch.args:
            if isinstance(a, (Ref, xla_ffi.Desc)):
                yield a.index


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
