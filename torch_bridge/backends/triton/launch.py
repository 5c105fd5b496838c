"""torch launchers of the Triton kernels, registered as ``torch.library`` custom ops.

The ops mutate preallocated outputs and return nothing, so ``torch.compile`` sees opaque calls
(no stride baking, vllm issue #41106) and CUDA-graph capture sees fixed buffers: the launchers
allocate nothing when outputs are given (except split-K's fp32 parts, which a capture takes
from its private pool), never synchronise, and read int32 or int64 positions directly (no
``.to(int64)`` copy).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import threading

import numpy as np
import torch
import triton

from woa_jax import AITER_AMAX_FLOOR

from ..torch_ref import fp8_max, fp8_max_reciprocal
from . import kernels

_LIB = "woa_triton"
log = logging.getLogger("woa")


# ---------------------------------------------------------------------------------------------
# Inverse RoPE + 1 x GS E8M0 quantization
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """Launch shape of the quant kernel.

    ``block_h == 0``: the flat-rows kernel, ``block_r`` quant groups per program. Else the
    per-head kernel, ``block_r`` tokens x ``block_h`` heads per program.
    """

    block_r: int = 32
    num_warps: int = 4
    block_h: int = 0

    def __post_init__(self):
        _check_power_of_two(self, "block_r", self.block_r, 1)
        _check_power_of_two(self, "num_warps", self.num_warps, 1)
        if self.block_h < 0:
            raise ValueError(f"QuantConfig.block_h must be >= 0 (0: the flat-rows kernel), got "
                             f"{self.block_h}")

    def label(self) -> str:
        return f"r{self.block_r}w{self.num_warps}" + (f"h{self.block_h}" if self.block_h else "")


def _check_power_of_two(cfg, field: str, value: int, least: int) -> None:
    """Triton tile sizes (``tl.arange`` extents, warp counts) must be powers of two."""
    if value < least or value & (value - 1):
        raise ValueError(f"{type(cfg).__name__}.{field} must be a power of two >= {least}, got "
                         f"{value}")


def quant_config(s: int) -> QuantConfig:
    """The quant launch shape for ``s`` tokens (tuned on an H200; see benchmarks/RESULTS.md).

    The per-head kernel with one warp per program and 4 tokens x 1 head: 4.19 TB/s at
    S = 8192, G = 16 and 3.85 at S = 1024 (session 10, with the kernel's loads four groups
    ahead of its stores; 8 tokens: 4.02 and 3.63 before that change). One warp holds a whole
    1 x 128 group per token row, so each thread keeps more loads in flight and more programs
    fit on an SM (4 warps: 3.53 and 3.15 TB/s; the flat-rows kernel 2.6). 2 tokens per program
    lost everywhere from S = 64 (3.14 TB/s at S = 8192).
    """
    return QuantConfig(4, 1, block_h=1)


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


@dataclasses.dataclass(frozen=True)
class QuantLaunch:
    """Which quant kernel runs for a problem (shared by the torch and JAX launchers)."""

    per_head: bool  # inv_rope_group_quant_head_kernel, else inv_rope_group_quant_kernel
    grid: tuple[int, ...]
    n_work: int  # the kernel's first scalar: tokens (per head) or quant groups (flat)
    shape: dict[str, int]  # its launch-shape constexprs


def quant_launch(s: int, h: int, dh: int, quant_group_size: int,
                 cfg: QuantConfig) -> QuantLaunch:
    """The per-head kernel when ``cfg.block_h`` is set and GS divides Dh (``block_h`` cut to a
    divisor of H), else the flat-rows kernel."""
    if cfg.block_h and dh % quant_group_size == 0:
        block_h = math.gcd(h, cfg.block_h)
        return QuantLaunch(True, (triton.cdiv(s, cfg.block_r) * (h // block_h),), s,
                           dict(H=h, BLOCK_T=cfg.block_r, BLOCK_H=block_h))
    nq = h * dh // quant_group_size
    return QuantLaunch(False, (triton.cdiv(s * nq, cfg.block_r),), s * nq,
                       dict(NQ=nq, BLOCK_R=cfg.block_r))


def _hw_fp8_cast(fp8_dtype: torch.dtype) -> bool:
    """Whether the compiled fp32 -> fp8 cast is already RNE on the e4m3 grid (CUDA e4m3fn).

    The interpreter rounds ties away from zero and AMD's e4m3fnuz cast is not checked here, so
    those round on the fp32 side first (same bytes, more instructions).
    """
    from . import interpreter_on

    return (not interpreter_on() and torch.version.hip is None
            and fp8_dtype == torch.float8_e4m3fn)


#: The launch function behind each registered op, for ``_run_mutating``'s eager path.
_LAUNCHERS: dict[object, object] = {}


def _launcher_op(name: str, mutates_args: tuple[str, ...]):
    """Register a launch function as the custom op ``woa_triton::name`` (opaque to
    ``torch.compile`` and fake tensors) and remember the function for plain eager calls."""
    def register(fn):
        op = torch.library.custom_op(f"{_LIB}::{name}", mutates_args=mutates_args)(fn)
        _LAUNCHERS[op] = fn
        return op
    return register


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _plain_eager(args) -> bool:
    """No dispatch mode (fake tensors, ``make_fx``), functorch transform or tensor subclass is
    in play: the op's dispatch would only reach the launch function."""
    return (torch._C._len_torch_dispatch_stack() == 0
            and not torch._C._are_functorch_transforms_active()
            and all(type(a) in _PLAIN_TENSORS for a in args if isinstance(a, torch.Tensor)))


def _run_mutating(op, mutated: tuple[torch.Tensor, ...], *args) -> None:
    """Call a launcher op that writes ``mutated`` in place, with as little host time as it can.

    Eager with plain tensors, the launch function runs directly: the custom op's dispatch cost
    40-80 us of host time per call on the H200 host (quant 114 -> 74 us, Gluon GEMM 155 -> 74),
    which made an eager G = 2 prefill chunk host-bound.
    The version counters of ``mutated`` are bumped here, so autograd's in-place checks keep
    working. Anything else (``torch.compile``, fake tensors, functorch, subclasses) goes
    through the op, which has fake implementations.
    """
    if torch.compiler.is_compiling():
        op(*args)
        return
    launcher = _LAUNCHERS.get(op)
    if launcher is not None and _plain_eager(args):
        launcher(*args)
    else:
        with torch._C._AutoDispatchBelowADInplaceOrView():
            op(*args)
    torch.autograd.graph.increment_version(mutated)


def _on_device_of(t: torch.Tensor):
    """Triton launches on torch's current CUDA device: make it the operands' (a no-op when it
    already is, and for the interpreter's CPU tensors)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _as_bytes(scale: torch.Tensor) -> torch.Tensor:
    return scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale


def _quant_constants(fp8_dtype: torch.dtype, amax_floor: float) -> dict:
    return dict(_quant_constants_cached(fp8_dtype, amax_floor, _hw_fp8_cast(fp8_dtype)))


@functools.cache
def _quant_constants_cached(fp8_dtype: torch.dtype, amax_floor: float,
                            hw_cast: bool) -> tuple[tuple[str, object], ...]:
    # ~4 us of finfo/numpy work per call otherwise (measured on a CPU), on every quant launch.
    return (("INV_FP8_MAX", fp8_max_reciprocal(fp8_dtype)), ("FP8_MAX", fp8_max(fp8_dtype)),
            ("FP8_MIN_NORMAL_EXP", _min_normal_exp(fp8_dtype)),
            ("AMAX_FLOOR", float(np.float32(amax_floor))), ("HW_CAST", hw_cast))


@_launcher_op("inverse_rope_group_quant_", mutates_args=("x_fp8", "x_scale"))
def _inverse_rope_group_quant_op(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                                 sin_cache: torch.Tensor, x_fp8: torch.Tensor,
                                 x_scale: torch.Tensor, quant_group_size: int,
                                 amax_floor: float, block_r: int, num_warps: int,
                                 block_h: int) -> None:
    with _on_device_of(o):
        s, h, dh = o.shape
        if s == 0:
            return
        plan = quant_launch(s, h, dh, quant_group_size, QuantConfig(block_r, num_warps, block_h))
        kernel = (kernels.inv_rope_group_quant_head_kernel if plan.per_head
                  else kernels.inv_rope_group_quant_kernel)
        kernel[plan.grid](
            o, positions, cos_cache, sin_cache, plan.n_work, cos_cache.shape[0], o.stride(0),
            cos_cache.stride(0), sin_cache.stride(0), x_fp8, x_scale, GS=quant_group_size, DH=dh,
            RD=2 * cos_cache.shape[1], num_warps=num_warps, **plan.shape,
            **_quant_constants(x_fp8.dtype, amax_floor))


@_inverse_rope_group_quant_op.register_fake
def _(o, positions, cos_cache, sin_cache, x_fp8, x_scale, quant_group_size, amax_floor, block_r,
      num_warps, block_h) -> None:
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
      positions: ``[>= S]`` int32 or int64 (a strided view is packed first: the kernels read
        them with unit stride); clamped to ``[0, P - 1]`` in the kernel.
      cos_cache, sin_cache: ``[P, rd / 2]`` bf16, fp16 or fp32.
      num_groups: G; D = H * Dh / G.
      quant_group_size: GS in {32, 64, 128}.
      amax_floor: 1e-8 (AITER) or 1e-10 (vLLM CUDA).
      x_fp8: optional contiguous ``[S, G, D]`` fp8 output (its dtype picks e4m3fn / e4m3fnuz).
      x_scale: optional contiguous ``[S, G, D / GS]`` uint8 or float8_e8m0fnu output.
      config: launch shape; ``None`` uses ``quant_config(S)``.

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
    cfg = config or quant_config(s)
    scale_bytes = _as_bytes(x_scale)
    _run_mutating(_inverse_rope_group_quant_op, (x_fp8, scale_bytes),
                  _last_dims_contiguous(o), _rows_contiguous(positions),
                  _rows_contiguous(cos_cache), _rows_contiguous(sin_cache), x_fp8, scale_bytes,
                  quant_group_size,
                  float(amax_floor), cfg.block_r, cfg.num_warps, cfg.block_h)
    return x_fp8, x_scale


# ---------------------------------------------------------------------------------------------
# BF16 chain: in-place inverse RoPE of the rope tail
# ---------------------------------------------------------------------------------------------

INPLACE_BLOCK_R = 32


@_launcher_op("inverse_rope_", mutates_args=("o",))
def _inverse_rope_op(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
                     sin_cache: torch.Tensor) -> None:
    with _on_device_of(o):
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
    rd = 2 * cos_cache.shape[1]
    if rd & (rd - 1) or rd > o.shape[2]:
        raise ValueError(f"in-place inverse RoPE: rd = 2 * cos_cache.shape[1] = {rd} must be a "
                         f"power of two (a Triton tile) no larger than head_dim {o.shape[2]}")
    if o.dtype != torch.bfloat16:
        raise TypeError(f"in-place inverse RoPE is the BF16 chain's: o must be bfloat16, got "
                        f"{o.dtype}")
    if o.stride(2) != 1 or o.stride(1) != o.shape[2]:
        raise ValueError(f"in-place inverse RoPE needs o with packed [H, Dh] dims, got strides "
                         f"{list(o.stride())}")
    _run_mutating(_inverse_rope_op, (o,), o, _rows_contiguous(positions),
                  _rows_contiguous(cos_cache), _rows_contiguous(sin_cache))
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
    """One launch shape of the block-scaled GEMM: the pointer kernel (``bmm_fp8_block_kernel``),
    its TMA variant (``tma``) or the Gluon kernel (``wgmma``)."""

    block_m: int
    block_n: int
    split_k: int = 1
    swap_ab: bool = False
    num_warps: int = 4
    num_stages: int = 4
    #: Tensor-descriptor (TMA) tiles; used when the operands allow it (see ``_tma_ok``).
    tma: bool = False
    #: TMA and wgmma kernels: resident programs per SM looping over tiles (0: one program per
    #: tile).
    programs_per_sm: int = 0
    #: The Gluon kernel (``gluon_kernels``; Hopper only): async MMAs, each K block's fp32
    #: promotion overlapped with the next block's MMA. Needs ``block_n`` dividing the scale
    #: block, and ``block_m == 16 * num_warps`` (64 or 128); swapped (``swap_ab``, the
    #: decode tile: tokens on the MMA's N side), 8 to 64 tokens and ``block_n`` (64 or 128) a
    #: multiple of ``16 * num_warps``.
    wgmma: bool = False

    def __post_init__(self):
        # tl.dot needs every tile dim >= 16; wgmma takes 8 tokens on its N side.
        _check_power_of_two(self, "block_m", self.block_m,
                            8 if self.wgmma and self.swap_ab else 16)
        _check_power_of_two(self, "block_n", self.block_n, 16)
        _check_power_of_two(self, "num_warps", self.num_warps, 1)
        if self.split_k < 1 or self.num_stages < 1 or self.programs_per_sm < 0:
            raise ValueError(f"GemmConfig needs split_k >= 1, num_stages >= 1 and "
                             f"programs_per_sm >= 0, got {self}")
        if self.tma and self.split_k > 1:
            raise ValueError("GemmConfig: the TMA kernel does not split K; use tma=False with "
                             f"split_k={self.split_k}")
        if self.programs_per_sm and not (self.tma or self.wgmma):
            raise ValueError("GemmConfig.programs_per_sm applies to the TMA and wgmma kernels "
                             "only; set tma=True, wgmma=True or programs_per_sm=0")
        if self.wgmma and (self.tma or self.split_k > 1 or not _wgmma_tile_ok(self)):
            raise ValueError(f"GemmConfig.wgmma is its own kernel: it needs tma=False, "
                             f"split_k=1 and either block_m = 16 * num_warps in (64, 128), "
                             f"or swap_ab=True with block_m in 8..64 and block_n in (64, 128) "
                             f"a multiple of 16 * num_warps; got {self}")

    def label(self) -> str:
        tma = f"W{self.programs_per_sm or ''}" if self.wgmma else ""
        if self.tma:
            tma = f"T{self.programs_per_sm or ''}"
        return (f"m{self.block_m}n{self.block_n}k{self.split_k}{'s' if self.swap_ab else ''}"
                f"w{self.num_warps}st{self.num_stages}{tma}")


def _wgmma_tile_ok(cfg: GemmConfig) -> bool:
    """The Gluon kernel's tiles: the MMA's M side (tokens, or weight rows when swapped) in
    16-row slices per warp."""
    if cfg.swap_ab:
        return (cfg.block_m <= 64 and cfg.block_n in (64, 128)
                and cfg.block_n % (16 * cfg.num_warps) == 0)
    return cfg.block_m in (64, 128) and cfg.block_m == 16 * cfg.num_warps


def _memoized(fn):
    """Remember a launch-shape rule's answers (they are pure in their integer arguments): an
    eager prefill chunk pays host time for every step. A plain dict, not ``functools.cache``:
    the wrappers ask at trace time under ``torch.compile``, and Dynamo warns on every
    cache-wrapped call."""
    memo: dict[tuple, GemmConfig] = {}

    @functools.wraps(fn)
    def remembered(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())))
        found = memo.get(key)
        if found is None:
            if len(memo) >= 4096:  # every token count is a key: stay bounded
                memo.clear()
            found = memo[key] = fn(*args, **kwargs)
        return found
    return remembered


#: Tiles that one wave of 132 SMs (H100 / H200 SXM) runs at one program per SM.
_ONE_WAVE_TILES = 128


@_memoized
def gemm_config(m: int, g: int, n: int, k: int, block: int, *,
                wgmma: bool = False) -> GemmConfig:
    """The launch shape for one problem, by M and G (tuned on an H200; benchmarks/RESULTS.md).

    Small M is weight-bandwidth-bound: up to 16 tokens they become the MMA's N side
    (``swap_ab``; wgmma needs 64 rows on its M side) and each program streams 64 weight rows by
    pointer loads. From 17 to 64 tokens, 64 x 64 pointer tiles (tokens on the M side, 6 stages)
    were fastest where they give more than 64 programs (session 9, H200, G = 16: M = 64
    23.3 us against 27.6 for the swapped pointer tiles, M = 32 21.5 against 24.3; G = 8, M = 64:
    14.2 against 17.9); this is also the tile of the JAX native route, which cannot take TMA or
    Gluon kernels. Above 64 tokens, 64 x 128
    TMA tiles with 4 warps and 4 stages were fastest (6-14 % ahead of pointer loads at M = 1024
    and 8192; 128 x 128 / 8 warps, persistent grids and warp specialization tied or lost). With
    64 programs or fewer (G = 2, TP8) the SMs starve: K is split (``_k_split``) so that about
    256 programs stream the weight (G = 2: 9.2 -> 7.3 us at M = 1, 15.7 -> 11.1 us at M = 128).
    The parts are added in the kernel in K order, so the bits do not depend on timing
    (``_bmm_tile``), and no zeroing or rounding launch runs around the GEMM.

    ``wgmma``: the Gluon kernel can run (``wgmma_available``). Up to 16 tokens it takes the
    swapped tile, 64 weight rows x 8 or 16 tokens, where that gives 128 programs or more (G >= 8;
    fewer would need split-K, which this kernel lacks): bit-equal to the pointer tiles and
    faster in session 12 (G = 16: 18.1 against 18.4 us at M = 1, 19.3 against 19.7 at
    M = 16; G = 8: 11.1 against 11.8 at M = 1, 12.2 against 12.9 at M = 16), with 8 stages
    at one program per SM and 6 at two (G = 8 / 16). Above 16 tokens, when 64 x 128
    tiles make one wave (64 to ``_ONE_WAVE_TILES``; above 64 for M <= 64), it takes them with
    6 stages, one program per tile: G = 16, M = 64: 21.7 us against 23.0 for the 64 x 64
    pointer tiles; G = 8, M = 128: 14.7 against 18.7; G = 2, M = 512: 13.5 against 16.2. At
    M <= 16 that tile tied or lost to the pointer tiles, and so it did at M <= 64 with 64 tiles
    (G = 8, M = 32: 13.9 against 12.9 us; M = 64: 14.6 against 14.1). Beyond one wave, above
    M = 64, it takes 128 x 128 tiles with 8 warps, 4 stages and one persistent program per SM
    when more than 64 tiles fill the GPU: at M = 8192, G = 16 it ran in 942 us against 1334 us
    for the 64 x 128 TMA kernel, and it was the fastest shape at M = 128, 512 and 8192 for
    G = 16 and G = 2 too.
    """
    if wgmma and block == 128 and n % 128 == 0:
        if m <= 16:
            cfg = GemmConfig(8 if m <= 8 else 16, 64, swap_ab=True, num_warps=4, wgmma=True)
            programs = _programs(cfg, m, g, n)
            if programs >= _ONE_WAVE_TILES:
                return dataclasses.replace(
                    cfg, num_stages=8 if programs <= _ONE_WAVE_TILES else 6)
        if m > 16:
            cfg = GemmConfig(64, 128, num_warps=4, num_stages=6, wgmma=True)
            # Up to 64 tokens, 64 such tiles (G = 8) lost to the 64 x 64 pointer tiles below.
            fewest = 64 if m > 64 else 65
            if fewest <= _programs(cfg, m, g, n) <= _ONE_WAVE_TILES:
                return cfg
        if m > 64:
            cfg = GemmConfig(128, 128, num_warps=8, num_stages=4, wgmma=True, programs_per_sm=1)
            if _programs(cfg, m, g, n) > 64:
                return cfg
    if m <= 16:
        cfg = GemmConfig(16, 64, swap_ab=True, num_warps=4, num_stages=5)
    elif m <= 64:
        cfg = GemmConfig(64, 64, num_warps=4, num_stages=6)
        if _programs(cfg, m, g, n) > 64:
            return cfg
        # 64 programs or fewer (G = 2): K is split below, on the swapped tile tuned there.
        cfg = GemmConfig(64, 64, swap_ab=True, num_warps=4, num_stages=4)
    else:
        cfg = GemmConfig(64, 128, num_warps=4, num_stages=4, tma=True)
    if _programs(cfg, m, g, n) > 64:
        return cfg
    if not cfg.swap_ab:
        cfg = GemmConfig(64, 64, num_warps=4, num_stages=4)
    return dataclasses.replace(cfg, split_k=_k_split(cfg, m, g, n, k // block), tma=False,
                               num_stages=4)


def _k_split(cfg: GemmConfig, m: int, g: int, n: int, k_blocks: int) -> int:
    """K parts for a grid of 64 or fewer tiles: about 256 programs, at most 8 parts, at most
    256 / block_m (the last part reads every part back: at G = 2, M = 64, 64 x 64 tiles took
    12.9 us split 8 ways, 9.4 us split 4 ways), and a divisor of the K blocks."""
    programs = max(1, _programs(cfg, m, g, n))  # zero tokens: any shape, nothing launches
    split = max(1, min(8, 256 // programs, 256 // cfg.block_m))
    while k_blocks % split:
        split //= 2
    return split


def _check_split(cfg: GemmConfig, k_blocks: int) -> None:
    if k_blocks % cfg.split_k:
        raise ValueError(f"split_k={cfg.split_k} does not divide K / B = {k_blocks}")


def _programs(cfg: GemmConfig, m: int, g: int, n: int) -> int:
    return triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n) * g


@functools.cache
def _sm_count(device_index: int | None) -> int:
    """The device's SM count; 4 under the interpreter, so persistent grids loop in CPU tests."""
    from . import interpreter_on

    if interpreter_on():
        return 4
    return torch.cuda.get_device_properties(device_index).multi_processor_count


#: ``wgmma_available`` per device index. A plain dict, not ``functools.cache``: the GEMM wrapper
#: asks at trace time under ``torch.compile``, and Dynamo warns on every cache-wrapped call.
_WGMMA_AVAILABLE: dict[int | None, tuple[bool, str]] = {}


def wgmma_available(device_index: int | None) -> tuple[bool, str]:
    """Whether the Gluon wgmma GEMM can run on this CUDA device: ``(ok, reason)`` (cached)."""
    found = _WGMMA_AVAILABLE.get(device_index)
    if found is None:
        found = _WGMMA_AVAILABLE[device_index] = _probe_wgmma(device_index)
    return found


def _probe_wgmma(device_index: int | None) -> tuple[bool, str]:
    from . import interpreter_on

    if interpreter_on():
        return False, "TRITON_INTERPRET=1 runs no Gluon kernels"
    if torch.version.hip is not None:
        return False, "the Gluon GEMM is written for NVIDIA Hopper (wgmma), not ROCm"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    major, minor = torch.cuda.get_device_capability(device_index)
    if major != 9:
        return False, f"wgmma needs compute capability 9.x (Hopper), this GPU is {major}.{minor}"
    try:
        from . import gluon_kernels  # noqa: F401
    except ImportError as e:
        return False, f"this Triton has no Gluon Hopper dialect ({e})"
    return True, "ok"


def wgmma_chosen(m: int, g: int, n: int, k: int, block: int) -> bool:
    """Whether ``batched_gemm_a8w8_mxscale`` runs this problem on the Gluon kernel by default
    (on the current CUDA device)."""
    return wgmma_available(None)[0] and gemm_config(m, g, n, k, block, wgmma=True).wgmma


def _tile_programs(m: int, g: int, n: int, block_m: int, block_n: int, programs_per_sm: int,
                   device_index: int | None) -> int:
    """Grid of the tile-walking kernels (TMA, Gluon): one program per output tile, or at most
    ``programs_per_sm`` resident programs per SM that loop over the tiles."""
    tiles = triton.cdiv(m, block_m) * (n // block_n) * g
    if programs_per_sm:
        return min(tiles, programs_per_sm * _sm_count(device_index))
    return tiles


def _tma_ok(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, block_n: int) -> bool:
    """Whether x, w, out can be viewed as the TMA kernel's 2D ``[M, G*K]``, ``[G*N, K]`` and
    ``[M, G*N]`` (packed inner dims, 16-byte aligned bases and row strides, N % BLOCK_N == 0)."""
    m, g, k = x.shape
    n = w.shape[1]
    return (n % block_n == 0 and x.stride(2) == 1 and x.stride(1) == k and w.is_contiguous()
            and out.stride(2) == 1 and out.stride(1) == n
            and x.stride(0) % 16 == 0 and (out.stride(0) * out.element_size()) % 16 == 0
            and all(t.data_ptr() % 16 == 0 for t in (x, w, out)))


@_launcher_op("bmm_fp8_block_", mutates_args=("out",))
def _bmm_op(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
            out: torch.Tensor, block_m: int, block_n: int, split_k: int, swap_ab: bool,
            num_warps: int, num_stages: int, tma: bool, programs_per_sm: int,
            wgmma: bool) -> None:
    with _on_device_of(x):
        m, g, k = x.shape
        n = w.shape[1]
        if m == 0:
            return
        block = k // x_scale.shape[2]
        if wgmma:
            if block % block_n == 0 and _tma_ok(x, w, out, block_n):
                _launch_wgmma(x, w, x_scale, w_scale, out, block_m, block_n, block, num_warps,
                              num_stages, programs_per_sm, swap_ab)
                return
            # A default shape whose operands the Gluon kernel cannot view (x transposed from
            # [G, M, K], a misaligned base; explicit ones were refused before): the Triton
            # kernels' own shape, as the swapped decode tile is too narrow for tl.dot.
            cfg = gemm_config(m, g, n, k, block)
            block_m, block_n, split_k, swap_ab = cfg.block_m, cfg.block_n, cfg.split_k, cfg.swap_ab
            num_warps, num_stages, tma = cfg.num_warps, cfg.num_stages, cfg.tma
            programs_per_sm = cfg.programs_per_sm
        if tma and split_k == 1 and _tma_ok(x, w, out, block_n):
            from triton.tools.tensor_descriptor import TensorDescriptor

            x_desc = TensorDescriptor(x, [m, g * k], [x.stride(0), 1], [block_m, block])
            w_desc = TensorDescriptor(w, [g * n, k], [k, 1], [block_n, block])
            y_desc = TensorDescriptor(out, [m, g * n], [out.stride(0), 1], [block_m, block_n])
            programs = _tile_programs(m, g, n, block_m, block_n, programs_per_sm, x.device.index)
            kernels.bmm_fp8_block_tma_kernel[(programs,)](
                x_desc, w_desc, y_desc, x_scale, w_scale, m, programs,
                SXSM=x_scale.stride(0), SXSG=x_scale.stride(1), SWSG=w_scale.stride(0),
                SWSN=w_scale.stride(1), G=g, N=n, K=k, SB=block, BLOCK_M=block_m, BLOCK_N=block_n,
                SWAP_AB=swap_ab, OUT_BF16=out.dtype == torch.bfloat16,
                num_warps=num_warps, num_stages=num_stages)
            return
        tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
        split_k, parts, counters = _split_scratch(out, split_k, tiles * g)
        kernels.bmm_fp8_block_kernel[(tiles, g, split_k)](
            x, w, x_scale, w_scale, m, out, parts, counters,
            SXM=x.stride(0), SXG=x.stride(1), SXSM=x_scale.stride(0), SXSG=x_scale.stride(1),
            SWG=w.stride(0), SWN=w.stride(1), SWSG=w_scale.stride(0), SWSN=w_scale.stride(1),
            SYM=out.stride(0), SYG=out.stride(1), N=n, K=k, SB=block,
            BLOCK_M=block_m, BLOCK_N=block_n, SPLIT_K=split_k, SWAP_AB=swap_ab,
            OUT_BF16=out.dtype == torch.bfloat16,
            num_warps=num_warps, num_stages=num_stages,
        )


@_bmm_op.register_fake
def _(x, w, x_scale, w_scale, out, block_m, block_n, split_k, swap_ab, num_warps,
      num_stages, tma, programs_per_sm, wgmma) -> None:
    return None


_GL_DTYPES = {torch.float8_e4m3fn: "float8e4nv", torch.bfloat16: "bfloat16",
              torch.float32: "float32"}


#: Hopper's shared memory per block (227 KiB), less what the kernel's barriers take.
_SMEM_BYTES = 227 * 1024 - 256


@functools.cache
def _smem_layout(tile: tuple[int, int], dtype: torch.dtype):
    """The swizzled shared-memory layout of a TMA tile (~5 us to build, so built once)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(list(tile), getattr(gl, _GL_DTYPES[dtype]))


def wgmma_stages(requested: int, k_blocks: int, block_m: int, block_n: int, block: int,
                 out_bytes: int) -> int:
    """The Gluon kernel's pipeline depth: ``requested``, at most one stage per K block and as
    many fp8 ``x``/``w`` tile pairs as fit in shared memory beside the output tile (so an fp32
    output gets fewer stages than a bf16 one)."""
    stage_bytes = (block_m + block_n) * block
    return min(requested, k_blocks, (_SMEM_BYTES - block_m * block_n * out_bytes) // stage_bytes)


#: Compiled Gluon GEMMs by launch key (see ``_launch_wgmma``). Triton's own launch path
#: re-derives the specialization on every call, ~150 us of host time per eager launch on the
#: H200 host (the TMA kernel's: ~65 us).
_GLUON_KERNELS: dict[tuple, object] = {}


def _launch_wgmma(x, w, x_scale, w_scale, out, block_m, block_n, block, num_warps,
                  num_stages, programs_per_sm, swap_ab) -> None:
    from triton import knobs
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from . import gluon_kernels

    m, g, k = x.shape
    n = w.shape[1]
    programs = _tile_programs(m, g, n, block_m, block_n, programs_per_sm, x.device.index)
    stages = wgmma_stages(num_stages, k // block, block_m, block_n, block, out.element_size())
    args = dict(SXSM=x_scale.stride(0), SXSG=x_scale.stride(1), SWSG=w_scale.stride(0),
                SWSN=w_scale.stride(1), G=g, N=n, K=k, STAGES=stages, num_warps=num_warps,
                SWAP_AB=swap_ab)
    # Everything Triton specializes this kernel on: the constexprs, the descriptors' tiles and
    # dtypes, the integers' value classes (== 1, % 16) and the scale pointers' alignment; the
    # row strides are in too (the descriptors' shapes and strides are runtime values).
    key = (x.device.index, block_m, block_n, x.dtype, out.dtype, x.stride(0), out.stride(0),
           *args.values(), m == 1, m % 16 == 0, programs == 1, programs % 16 == 0,
           x_scale.data_ptr() % 16 == 0, w_scale.data_ptr() % 16 == 0)

    def desc(t, shape, row_stride, tile):
        return TensorDescriptor(t, shape, [row_stride, 1], list(tile),
                                _smem_layout(tile, t.dtype))

    # Triton's own descriptor class: its launcher reads fields that vary between versions.
    descs = dict(x_desc=desc(x, [m, g * k], x.stride(0), (block_m, block)),
                 w_desc=desc(w, [g * n, k], k, (block_n, block)),
                 y_desc=desc(out, [m, g * n], out.stride(0), (block_m, block_n)))
    kernel = gluon_kernels.bmm_fp8_block_wgmma_kernel
    compiled = _GLUON_KERNELS.get(key)
    if compiled is None:
        _GLUON_KERNELS[key] = kernel[(programs,)](
            **descs, xs_ptr=x_scale, ws_ptr=w_scale, M=m, num_programs=programs, **args)
        return
    # The launch step of Triton's own path (3.6 to 3.9), profiler hooks included.
    values = dict(descs, xs_ptr=x_scale, ws_ptr=w_scale, M=m, num_programs=programs, **args)
    ordered = [values[name] for name in kernel.arg_names]
    stream = torch.cuda.current_stream(x.device).cuda_stream
    compiled.run(programs, 1, 1, stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata((programs, 1, 1), stream, *ordered),
                 knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *ordered)


def _check_explicit_wgmma(config: GemmConfig, x, w, out, block: int) -> None:
    """An explicit Gluon config must run the Gluon kernel: the default shape falls back to the
    Triton kernels, but an explicit one must not measure another kernel silently."""
    if block % config.block_n or not _tma_ok(x, w, out, config.block_n):
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
                              config: GemmConfig | None = None) -> torch.Tensor:
    """Block-scaled FP8 batched GEMM ``y [M, G, N] = dq(x) @ dq(w)^T`` per group, fp32 accumulation.

    Args:
      x: ``[M, G, K]`` fp8 (K contiguous; a transposed view of ``[G, M, K]`` is fine).
      w: ``[G, N, K]`` fp8, same dtype.
      x_scale: ``[M, G, K / B]`` uint8 or float8_e8m0fnu (1 x B groups, B = 128 or 32).
      w_scale: ``[G, ceil(N / B), K / B]`` uint8 or float8_e8m0fnu (B x B blocks).
      dtype: bf16 or fp32 output.
      out: optional ``[M, G, N]`` output with N contiguous (written in place).
      config: launch shape; ``None`` picks ``gemm_config`` by M and G.

    Returns:
      ``out`` (or a new tensor) ``[M, G, N]`` in ``dtype``.
    """
    m, g, k = x.shape
    n = w.shape[1]
    block = k // x_scale.shape[2]
    cfg = config or gemm_config(
        m, g, n, k, block, wgmma=x.is_cuda and wgmma_available(x.device.index)[0])
    out = _output(out, (m, g, n), dtype, x.device)
    x = _rows_contiguous(x)
    w = _rows_contiguous(w)
    xs, ws = _rows_contiguous(_as_bytes(x_scale)), _rows_contiguous(_as_bytes(w_scale))
    if config is not None and config.wgmma:
        _check_explicit_wgmma(config, x, w, out, block)
    _check_split(cfg, k // block)
    args = (cfg.block_m, cfg.block_n, cfg.split_k, cfg.swap_ab, cfg.num_warps, cfg.num_stages,
            cfg.tma, cfg.programs_per_sm, cfg.wgmma)
    _run_mutating(_bmm_op, (out,), x, w, xs, ws, out, *args)
    return out


def _output(out: torch.Tensor | None, shape: tuple[int, int, int], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
    """A GEMM's ``[M, G, N]`` output: ``out`` checked (N contiguous), or a new tensor."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(out.shape) != shape or out.stride(2) != 1:
        raise ValueError(f"out must be [M, G, N] = {list(shape)} with N contiguous, got shape "
                         f"{list(out.shape)} strides {list(out.stride())}")
    return out


# ---------------------------------------------------------------------------------------------
# Split-K scratch: fp32 parts, and tile counters that the kernel leaves at zero
# ---------------------------------------------------------------------------------------------

#: int32 tile counters per device (4 MiB). Serial split-K's last part sets its tile's counter
#: back to 0, so eager launches on one stream (which never overlap) share one range. A launch
#: captured in a CUDA graph gets a range of its own for good: graphs captured on one stream may
#: replay concurrently on different streams.
_SPLIT_COUNTERS = 1 << 20


class _CounterPool:
    def __init__(self, device: torch.device):
        self.counters = torch.zeros(_SPLIT_COUNTERS, dtype=torch.int32, device=device)
        self.used = 0
        self.by_stream: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()  # threads launching on different streams get disjoint ranges

    def _take(self, tiles: int) -> torch.Tensor | None:
        if self.used + tiles > _SPLIT_COUNTERS:
            return None
        self.used += tiles
        return self.counters[self.used - tiles:self.used]

    def take(self, tiles: int, stream: int | None) -> torch.Tensor | None:
        """``tiles`` zeroed counters for a launch on ``stream`` (``None``: being captured)."""
        with self.lock:
            if stream is None:
                return self._take(tiles)
            mine = self.by_stream.get(stream)
            if mine is None or mine.numel() < tiles:
                mine = self._take(tiles)
                if mine is not None:
                    self.by_stream[stream] = mine
            return mine


_COUNTER_POOLS: dict[torch.device, _CounterPool] = {}
_SPLIT_FALLBACK_LOGGED: set[str] = set()


def _split_scratch(out: torch.Tensor, split_k: int,
                   tiles: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``(split_k, parts, counters)`` for one pointer-kernel launch writing ``out [M, G, N]``
    in ``tiles`` output tiles: fp32 ``parts [split_k, M, G, N]`` and int32 counters; without
    split-K, ``(1, out, out)`` (unused). Runs unsplit, logged once, when no counters can be had:
    the pool is created on the first split launch outside CUDA-graph capture, and a long run of
    captures can use it up."""
    if split_k == 1:
        return 1, out, out
    capturing = out.is_cuda and torch.cuda.is_current_stream_capturing()
    pool = _COUNTER_POOLS.get(out.device)
    if pool is None and not capturing:
        pool = _COUNTER_POOLS[out.device] = _CounterPool(out.device)
    stream = None if capturing else (torch.cuda.current_stream(out.device).cuda_stream
                                     if out.is_cuda else 0)
    counters = pool.take(tiles, stream) if pool is not None else None
    if counters is None:
        why = ("its counters are created on the first split launch outside CUDA-graph capture; "
               "run once before capturing" if pool is None else
               f"its {_SPLIT_COUNTERS} counters are taken (each captured split launch keeps "
               f"its own)")
        if why not in _SPLIT_FALLBACK_LOGGED:
            _SPLIT_FALLBACK_LOGGED.add(why)
            log.warning("woa: triton GEMM runs without split-K (slower at small M): %s", why)
        return 1, out, out
    m, g, n = out.shape
    parts = torch.empty((split_k, m, g, n), dtype=torch.float32, device=out.device)
    return split_k, parts, counters


# ---------------------------------------------------------------------------------------------
# The FP8 chain: one fused kernel at decode sizes, quant + GEMM above
# ---------------------------------------------------------------------------------------------

#: Activations one step of the fused kernel's prologue quantizes: 32 groups of 128 (16 fp32
#: values per thread at 8 warps).
_FUSED_QUANT_LANES = 4096


def fused_chosen(m: int, g: int, n: int, k: int, block: int) -> bool:
    """Whether ``wo_a_fp8`` fuses this chain by default: when each program's prologue is one
    step (at most ``_FUSED_QUANT_LANES`` activations: M = 1 at G = 16, M <= 8 at G = 2).

    Measured on an H200 (benchmarks/RESULTS.md), fused against quant + GEMM: G = 16, M = 1:
    21.0 against 22.8 us; M = 4: 26.4 against 23.3 (session 5; with the whole M = 4 prologue in
    one step of 16384 activations, 25.7 against 23.9 in session 6). G = 2 (split-K reduced in
    the kernel, session 6): M = 1: 7.4 against 10.0; M = 4: 8.1 against 10.0. G = 2, M = 16
    (session 5, split-K by atomics then): 12.4 against 11.9.
    """
    cfg = fused_config(m, g, n, k, block)
    return m * (k // block) // cfg.split_k * block <= _FUSED_QUANT_LANES


@_memoized
def fused_config(m: int, g: int, n: int, k: int, block: int) -> GemmConfig:
    """The fused kernel's launch shape for ``m`` tokens: 16-64 token columns x 128 weight rows,
    8 warps; K split as the GEMM splits it (to ~256 programs when the tiles give 64 or fewer),
    then 4 stages, else 5 (the fastest shapes at G = 2 and 16, M = 1 and 4)."""
    block_m = min(64, max(16, triton.next_power_of_2(m)))
    cfg = GemmConfig(block_m, 128, swap_ab=True, num_warps=8, num_stages=5)
    if _programs(cfg, m, g, n) > 64:
        return cfg
    return dataclasses.replace(cfg, split_k=_k_split(cfg, m, g, n, k // block), num_stages=4)


def fusion_blocker(dh: int, rd: int, block: int,
                   config: GemmConfig | None = None) -> str | None:
    """Why the fused kernel cannot run a chain of head dim ``dh``, rope dim ``rd`` and scale
    block ``block`` at launch shape ``config`` (``None`` when it can)."""
    if dh % block:
        return f"head_dim {dh} is not a multiple of the scale block {block}"
    if rd > dh:
        return f"rope dim {rd} exceeds head_dim {dh}"
    if config is not None and (config.tma or config.wgmma or not config.swap_ab):
        return (f"the fused kernel has pointer-loaded, swapped tiles only (swap_ab=True, "
                f"tma=False, wgmma=False), got {config}")
    return None


@_launcher_op("inv_rope_quant_bmm_", mutates_args=("x_fp8", "x_scale", "out"))
def _fused_op(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
              sin_cache: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
              x_fp8: torch.Tensor, x_scale: torch.Tensor, out: torch.Tensor, amax_floor: float,
              block_m: int, block_n: int, split_k: int, num_warps: int,
              num_stages: int) -> None:
    with _on_device_of(o):
        s, _, dh = o.shape
        if s == 0:
            return
        g, n, k = w.shape
        block = k // w_scale.shape[2]
        tiles = triton.cdiv(s, block_m) * triton.cdiv(n, block_n)
        split_k, parts, counters = _split_scratch(out, split_k, tiles * g)
        kernels.inv_rope_quant_bmm_kernel[(tiles, g, split_k)](
            o, positions, cos_cache, sin_cache, w, w_scale, s, cos_cache.shape[0], x_fp8,
            x_scale, out, parts, counters, SOM=o.stride(0), SCP=cos_cache.stride(0),
            SSP=sin_cache.stride(0), SWG=w.stride(0), SWN=w.stride(1), SWSG=w_scale.stride(0),
            SWSN=w_scale.stride(1), SYM=out.stride(0), SYG=out.stride(1), G=g, N=n, K=k, SB=block,
            DH=dh,
            RD=2 * cos_cache.shape[1], **_quant_constants(w.dtype, amax_floor),
            BLOCK_M=block_m, BLOCK_N=block_n, SPLIT_K=split_k,
            OUT_BF16=out.dtype == torch.bfloat16, QUANT_ROWS=_FUSED_QUANT_LANES // block,
            num_warps=num_warps, num_stages=num_stages)


@_fused_op.register_fake
def _(o, positions, cos_cache, sin_cache, w, w_scale, x_fp8, x_scale, out, amax_floor, block_m,
      block_n, split_k, num_warps, num_stages) -> None:
    return None


def wo_a_fp8(o: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor,
             sin_cache: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, num_groups: int,
             *, amax_floor: float = AITER_AMAX_FLOOR, dtype: torch.dtype = torch.bfloat16,
             out: torch.Tensor | None = None, fused: bool | None = None,
             config: GemmConfig | None = None) -> torch.Tensor:
    """The FP8 chain ``y = dq(quant(inv_rope(o))) @ dq(w)^T``: one fused kernel at decode sizes.

    The fused kernel (``inv_rope_quant_bmm_kernel``) quantizes, in each program, the
    activations its tile reads and then multiplies them: one launch instead of two, and no gap
    between them. Its products are those of ``inverse_rope_group_quant`` followed by
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
      fused: ``None`` fuses where ``fused_chosen`` says so; ``True`` requires the fused kernel
        (raises if this chain cannot fuse), ``False`` runs quant + GEMM.
      config: the fused kernel's launch shape (a swapped pointer-load ``GemmConfig``) when it
        runs, else the GEMM's; ``None`` picks by S and G.

    Returns:
      ``out`` (or a new tensor) ``[S, G, N]`` in ``dtype``.
    """
    s, h, dh = o.shape
    g, n, k = w.shape
    block = k // w_scale.shape[2]
    if g != num_groups or h * dh != g * k:
        raise ValueError(f"o [S, H, Dh] = {list(o.shape)} and w [G, N, K] = {list(w.shape)} "
                         f"do not make num_groups = {num_groups} groups of K (need H * Dh = G * K)")
    blocker = fusion_blocker(dh, 2 * cos_cache.shape[1], block,
                             config if fused is not False else None)
    if fused and blocker:
        raise ValueError(f"wo_a_fp8(fused=True) cannot fuse this chain: {blocker}")
    if fused is None:
        fused = blocker is None and fused_chosen(s, g, n, k, block)
    if not fused:
        x_fp8, x_scale = inverse_rope_group_quant(o, positions, cos_cache, sin_cache, g, block,
                                                  amax_floor=amax_floor,
                                                  x_fp8=torch.empty((s, g, k), dtype=w.dtype,
                                                                    device=o.device))
        return batched_gemm_a8w8_mxscale(x_fp8, w, x_scale, w_scale, dtype=dtype, out=out,
                                         config=config)
    cfg = config or fused_config(s, g, n, k, block)
    _check_split(cfg, k // block)
    out = _output(out, (s, g, n), dtype, o.device)
    # The prologue's quantized activations (read back by the same program, never returned).
    x_fp8 = torch.empty((s, g, k), dtype=w.dtype, device=o.device)
    x_scale = torch.empty((s, g, k // block), dtype=torch.uint8, device=o.device)
    _run_mutating(_fused_op, (x_fp8, x_scale, out), _last_dims_contiguous(o),
                  _rows_contiguous(positions), _rows_contiguous(cos_cache),
                  _rows_contiguous(sin_cache), _rows_contiguous(w),
                  _rows_contiguous(_as_bytes(w_scale)), x_fp8, x_scale, out, float(amax_floor),
                  cfg.block_m, cfg.block_n, cfg.split_k, cfg.num_warps, cfg.num_stages)
    return out
