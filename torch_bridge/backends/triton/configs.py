"""Launch rules of the Triton kernels: launch shapes, the choosers and the kernels' constants.

Pure functions of integers and dtype names (no torch, no Triton, no GPU), shared by the torch
launchers and the JAX launcher (``jax_launch``), so both launch the same kernels the same way.
The BF16 chain's GEMM has its own rules (``bf16_configs``). The shapes were tuned on an H200;
``benchmarks/RESULTS.md`` holds the figures.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

import woa_jax


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_power_of_two(cfg, field: str, value: int, least: int) -> None:
    """Triton tile sizes (``tl.arange`` extents, warp counts) must be powers of two."""
    if value < least or value & (value - 1):
        raise ValueError(f"{type(cfg).__name__}.{field} must be a power of two >= {least}, got "
                         f"{value}")


# ---------------------------------------------------------------------------------------------
# Inverse RoPE + 1 x GS E8M0 quantization
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """Launch shape of the quant kernel.

    ``block_h == 0``: the flat-rows kernel, ``block_r`` quant groups per program. Else the
    per-head kernel, ``block_r`` tokens x ``block_h`` heads per program, a group at a time, or
    a head row at a time with ``whole_head`` (where Dh is a power of two; else by groups).
    """

    block_r: int = 32
    num_warps: int = 4
    block_h: int = 0
    #: Launched as a programmatic dependent (CUDA, Hopper on, unless ``WOA_PDL=0``): wait for
    #: the kernel before it, and let the next one launch at once (``quant_config``).
    pdl: bool = False
    whole_head: bool = False

    def __post_init__(self):
        _check_power_of_two(self, "block_r", self.block_r, 1)
        _check_power_of_two(self, "num_warps", self.num_warps, 1)
        if self.block_h < 0:
            raise ValueError(f"QuantConfig.block_h must be >= 0 (0: the flat-rows kernel), got "
                             f"{self.block_h}")
        if self.whole_head and not self.block_h:
            raise ValueError("QuantConfig.whole_head needs the per-head kernel (block_h >= 1), "
                             "got block_h=0")

    def label(self) -> str:
        return (f"r{self.block_r}w{self.num_warps}" + (f"h{self.block_h}" if self.block_h else "")
                + ("W" if self.whole_head else "") + ("P" if self.pdl else ""))


def quant_config(s: int, *, heads: int = 0, dependent: bool = False) -> QuantConfig:
    """The quant launch shape for ``s`` tokens of ``heads`` heads: the per-head kernel, one
    warp a program and one head. Up to ``WHOLE_HEAD_ROWS`` (token, head) rows it takes whole
    head rows, 1 token a program up to ``DEPENDENT_QUANT_ROWS`` rows, else 2: such grids run
    at once, so the kernel lasts as long as one program, and whole rows take the fewest memory
    instructions. Larger grids (or ``heads`` unknown) take ``quant_tokens(s)`` tokens a group
    at a time, which keeps more loads in flight per warp.

    One warp holds a whole 1 x 128 group per token row, so each thread keeps more loads in
    flight and more programs fit on an SM than with 4 warps or the flat-rows kernel.

    A programmatic dependent (``pdl``, where the device takes one: ``_common.pdl``) launches
    while the kernel before it finishes, waits before its first load, and lets the next one
    launch at once: for ``heads`` heads up to ``DEPENDENT_QUANT_ROWS`` (token, head) rows,
    where the launch it saves is a large part of the kernel (larger grids run slower as
    dependents), and at every size before a GEMM launched as its dependent (``dependent``,
    ``gemm.chain_dependent``).
    """
    rows = s * heads
    small = 0 < rows <= DEPENDENT_QUANT_ROWS
    if 0 < rows <= WHOLE_HEAD_ROWS:
        return QuantConfig(1 if small else 2, 1, block_h=1, pdl=dependent or small,
                           whole_head=True)
    return QuantConfig(quant_tokens(s), 1, block_h=1, pdl=dependent or small)


def quant_tokens(s: int) -> int:
    """Tokens a program of the group-at-a-time quant takes (``quant_config``: grids above
    ``WHOLE_HEAD_ROWS``, or the heads not given): 1 up to 8 tokens, 2 up to 16, else 4.

    A program's masked rows cost as much as its live ones, and a decode batch's programs all
    fit on the GPU at once, so there its time is one program's: the fewer rows a program
    holds, the sooner the grid is done. Larger batches take 4 rows a program, which keeps
    more loads in flight per warp.
    """
    return 1 if s <= 8 else 2 if s <= 16 else 4


#: (token, head) rows up to which the quant launches as a programmatic dependent on its own.
DEPENDENT_QUANT_ROWS = 1600
#: (token, head) rows up to which the quant takes whole head rows (``quant_config``).
WHOLE_HEAD_ROWS = 2048


@dataclasses.dataclass(frozen=True)
class QuantLaunch:
    """Which quant kernel runs for a problem, and its grid."""

    per_head: bool  # inverse_rope_group_quant_head_kernel, else inverse_rope_group_quant_kernel
    grid: tuple[int, ...]
    n_work: int  # the kernel's first scalar: tokens (per head) or quant groups (flat)
    shape: dict[str, int]  # its launch-shape constexprs


def quant_launch(s: int, h: int, dh: int, quant_group_size: int,
                 cfg: QuantConfig) -> QuantLaunch:
    """The per-head kernel when ``cfg.block_h`` is set and GS divides Dh (``block_h`` cut to a
    divisor of H; whole head rows only where Dh is a power of two), else the flat-rows
    kernel."""
    if cfg.block_h and dh % quant_group_size == 0:
        block_h = math.gcd(h, cfg.block_h)
        whole = cfg.whole_head and dh & (dh - 1) == 0
        return QuantLaunch(True, (cdiv(s, cfg.block_r) * (h // block_h),), s,
                           dict(H=h, BLOCK_T=cfg.block_r, BLOCK_H=block_h, WHOLE_HEAD=whole))
    nq = h * dh // quant_group_size
    return QuantLaunch(False, (cdiv(s * nq, cfg.block_r),), s * nq,
                       dict(NQ=nq, BLOCK_R=cfg.block_r))


@functools.cache
def quant_constants(fp8_name: str, amax_floor: float,
                    hw_cast: bool) -> tuple[tuple[str, object], ...]:
    """The quantizing kernels' constexprs for an fp8 format (``"float8_e4m3fn"`` or
    ``"float8_e4m3fnuz"``), as ``(name, value)`` pairs; cached, as every launch asks. The
    format's limits are the oracle's (``woa_jax``).

    ``hw_cast``: the target's fp32 -> fp8 cast is already round-to-nearest-even (CUDA e4m3fn).
    """
    try:
        fp8_max = woa_jax.fp8_max(fp8_name)
    except TypeError:
        raise ValueError(f"fp8 dtype {fp8_name!r} is not float8_e4m3fn or float8_e4m3fnuz") \
            from None
    return (("INV_FP8_MAX", float(woa_jax.fp8_max_reciprocal(fp8_name))), ("FP8_MAX", fp8_max),
            ("FP8_MIN_NORMAL_EXP", woa_jax.fp8_min_normal_exp(fp8_name)),
            ("AMAX_FLOOR", float(np.float32(amax_floor))), ("HW_CAST", hw_cast))


#: ``ROUND_PRODUCTS`` values: leave the products to the compiler, or round each product to fp32
#: with the target's own multiply instruction (PTX ``mul.rn.f32``, AMDGCN ``v_mul_f32``).
PRODUCTS_AS_COMPILED, PRODUCTS_PTX, PRODUCTS_AMDGCN = 0, 1, 2

#: Dtypes whose products of two values are exact in fp32 (at most 24 significant bits).
_NARROW_FLOATS = ("bfloat16", "float16")


def round_products(o_dtype: str, rope_dtype: str, target: str) -> int:
    """How the rotation's kernels must round the products ``a * cos`` and ``b * sin``.

    The oracle rounds each product to fp32 before the sum; a compiled ``a * c + b * s`` becomes
    a fused multiply-add, which differs when a product is inexact. Products of two bf16/fp16
    values are exact, so only an fp32 ``o`` or fp32 table needs each product rounded on its own
    (``target``: ``"cuda"``, ``"hip"``, or ``"interpreter"``, which never contracts).
    """
    if o_dtype in _NARROW_FLOATS and rope_dtype in _NARROW_FLOATS:
        return PRODUCTS_AS_COMPILED
    return {"cuda": PRODUCTS_PTX, "hip": PRODUCTS_AMDGCN}.get(target, PRODUCTS_AS_COMPILED)


# ---------------------------------------------------------------------------------------------
# Block-scaled FP8 batched GEMM
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One launch shape of the block-scaled GEMM: the pointer kernel
    (``batched_gemm_a8w8_mxscale_kernel``), its TMA variant (``tma``) or the wgmma kernel
    (``wgmma``)."""

    block_m: int
    block_n: int
    split_k: int = 1
    swap_ab: bool = False
    num_warps: int = 4
    num_stages: int = 4
    #: Tensor-descriptor (TMA) tiles; used when the operands allow it.
    tma: bool = False
    #: TMA and wgmma kernels: resident programs per SM looping over tiles (0: one program per
    #: tile).
    programs_per_sm: int = 0
    #: The wgmma kernel (``wgmma_kernels``; Hopper only): async MMAs, each K block's fp32
    #: promotion overlapped with the next block's MMA. Needs ``block_n`` dividing the scale
    #: block, and ``block_m == 16 * num_warps`` (64 or 128); or swapped (``swap_ab``, the
    #: decode tile: tokens on the MMA's N side), 8 to 64 tokens and ``block_n`` (64 or 128) a
    #: multiple of ``16 * num_warps``. It splits K too (``split_k``), with the pointer kernel's
    #: scratch. Its persistent unswapped, unsplit tiles run its warp-specialized variant
    #: (``warp_specialized``).
    wgmma: bool = False
    #: Launched as a programmatic dependent of the kernel before it on the stream (CUDA,
    #: Hopper on): the wgmma kernel requests its first weight tiles before waiting for that
    #: kernel, so only where it does not write ``w`` (the FP8 chain's quant,
    #: ``gemm.chain_dependent``); the pointer kernel waits before any load.
    pdl: bool = False

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
        if self.wgmma and (self.tma or not _wgmma_tile_ok(self)):
            raise ValueError(f"GemmConfig.wgmma is its own kernel: it needs tma=False and "
                             f"either block_m = 16 * num_warps in (64, 128), "
                             f"or swap_ab=True with block_m in 8..64 and block_n in (64, 128) "
                             f"a multiple of 16 * num_warps; got {self}")

    def label(self) -> str:
        tma = f"W{self.programs_per_sm or ''}" if self.wgmma else ""
        if self.tma:
            tma = f"T{self.programs_per_sm or ''}"
        return (f"m{self.block_m}n{self.block_n}k{self.split_k}{'s' if self.swap_ab else ''}"
                f"w{self.num_warps}st{self.num_stages}{tma}{'P' if self.pdl else ''}")


def _wgmma_tile_ok(cfg: GemmConfig) -> bool:
    """The wgmma kernel's tiles: the MMA's M side (tokens, or weight rows when swapped) in
    16-row slices per warp."""
    if cfg.swap_ab:
        return (cfg.block_m <= 64 and cfg.block_n in (64, 128)
                and cfg.block_n % (16 * cfg.num_warps) == 0)
    return cfg.block_m in (64, 128) and cfg.block_m == 16 * cfg.num_warps


def _memoized(fn):
    """Remember a launch-shape rule's answers (pure in their integer arguments): an eager
    prefill chunk asks on every step. A plain dict, not ``functools.cache``: the launchers ask
    at trace time under ``torch.compile``, and Dynamo warns on every cache-wrapped call."""
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
ONE_WAVE_TILES = 128

#: Grids of at most this many programs starve the SMs; K is split for them (``k_split``).
FEW_PROGRAMS = 64

#: Up to 16 tokens, swapped wgmma grids of at most this many tiles (G = 2) split K into one
#: wave rather than take the pointer kernel (``gemm_config``).
FEW_SWAPPED_TILES = 32


def programs(cfg: GemmConfig, m: int, g: int, n: int) -> int:
    """Output tiles of an ``[M, G, N]`` product at ``cfg``'s tile (one program each)."""
    return cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n) * g


def chain_dependent(m: int, g: int, n: int, k: int, block: int, *, wgmma: bool) -> bool:
    """Whether the unfused FP8 chain launches its GEMM as its quant's programmatic dependent
    (on a device that takes one; both launchers ask this): where the GEMM is the wgmma kernel,
    which requests weight tiles before it waits for the quant (the pointer kernel waits first,
    and gains nothing). Only the launch differs: the bits are the GEMM's alone."""
    return gemm_config(m, g, n, k, block, wgmma=wgmma).wgmma


def dependent_streams_weight(m: int, g: int, n: int, k: int, block: int) -> bool:
    """Whether the wgmma GEMM, as the quant's dependent, requests all of its weight before it
    waits for the quant: K split into at most one wave of programs (``ONE_WAVE_TILES``), each
    program's K slice no deeper than its stages."""
    cfg = gemm_config(m, g, n, k, block, wgmma=True)
    return (cfg.wgmma and cfg.split_k > 1
            and programs(cfg, m, g, n) * cfg.split_k <= ONE_WAVE_TILES
            and k // block // cfg.split_k <= cfg.num_stages)


@_memoized
def gemm_config(m: int, g: int, n: int, k: int, block: int, *,
                wgmma: bool = False) -> GemmConfig:
    """The launch shape for one problem, by M and G.

    Weight-bandwidth-bound small M: up to 16 tokens they are the MMA's N side (``swap_ab``), 64
    weight rows per program by pointer loads; 17 to 64 tokens take 64 x 64 pointer tiles;
    above, 64 x 128 TMA tiles.
    Grids of ``FEW_PROGRAMS`` or fewer (G = 2) split K (``k_split``); the parts are added in
    the kernel in K order, so the bits do not depend on timing.

    ``wgmma`` (the wgmma kernel can run, ``wgmma_available``), with 128-blocks and N a multiple
    of 128: up to 16 tokens the swapped 64-row x 8/16-token tile where it gives at least one
    wave (``ONE_WAVE_TILES``), 8 stages at one program per SM, 6 above; where it gives at most
    ``FEW_SWAPPED_TILES`` (G = 2), the same tile with K split into one wave, which the FP8
    chain launches as its quant's dependent (between, G = 4, the pointer kernel's split is
    faster alone).
    Above 16 tokens, persistent 64-token tiles, warp-specialized (``warp_specialized``), the
    narrowest of 16, 32, 64 or 128 weight rows whose tiles fit one wave (``wave_tile``): their
    producer warp keeps a program's whole weight slice streaming, and unsplit tiles skip the
    split's write, ticket and read back. Where even the narrowest make at most
    ``FEW_PROGRAMS`` (G = 1 up to 64 tokens), 64 x 64 tiles, 8 stages, K split until they make
    one wave (each part streams its weight slice with all its loads in flight). Where none
    fits one wave, above 64 tokens, persistent 128 x 128 tiles, 8 warps, 5 stages,
    warp-specialized too, where more than 64 tiles fill the GPU.
    """
    if wgmma and block == 128 and n % 128 == 0:
        if m <= 16:
            cfg = GemmConfig(8 if m <= 8 else 16, 64, swap_ab=True, num_warps=4, wgmma=True)
            tiles = programs(cfg, m, g, n)
            if tiles >= ONE_WAVE_TILES:
                return dataclasses.replace(cfg, num_stages=8 if tiles <= ONE_WAVE_TILES else 6)
            if tiles <= FEW_SWAPPED_TILES:
                return dataclasses.replace(cfg, num_stages=8, split_k=k_split(
                    cfg, m, g, n, k // block, most=ONE_WAVE_TILES))
        if m > 16 and (cfg := wave_tile(m, g, n)) is not None:
            if programs(cfg, m, g, n) > FEW_PROGRAMS:
                return cfg
            cfg = GemmConfig(64, 64, num_warps=4, num_stages=8, wgmma=True)
            split = k_split(cfg, m, g, n, k // block, most=ONE_WAVE_TILES)
            return dataclasses.replace(cfg, split_k=split)
        if m > 64:
            cfg = GemmConfig(128, 128, num_warps=8, num_stages=5, wgmma=True, programs_per_sm=1)
            if programs(cfg, m, g, n) > FEW_PROGRAMS:
                return cfg
    if m <= 16:
        cfg = GemmConfig(16, 64, swap_ab=True, num_warps=4, num_stages=5)
    elif m <= 64:
        cfg = GemmConfig(64, 64, num_warps=4, num_stages=6)
        if programs(cfg, m, g, n) > FEW_PROGRAMS:
            return cfg
        # Few programs (G = 2): K is split below, on the swapped tile.
        cfg = GemmConfig(64, 64, swap_ab=True, num_warps=4, num_stages=4)
    else:
        cfg = GemmConfig(64, 128, num_warps=4, num_stages=4, tma=True)
    if programs(cfg, m, g, n) > FEW_PROGRAMS:
        return cfg
    if not cfg.swap_ab:
        cfg = GemmConfig(64, 64, num_warps=4, num_stages=4)
    return dataclasses.replace(cfg, split_k=k_split(cfg, m, g, n, k // block), tma=False,
                               num_stages=4)


#: Weight rows and stages of the persistent 64-token tiles ``wave_tile`` picks from, narrowest
#: first; each width with the stages it was measured at (16 rows on the H100, the others on the
#: H200). 16 rows give G = 2 up to 64 tokens a wave of unsplit tiles.
WAVE_TILES = ((16, 12), (32, 12), (64, 10), (128, 8))


def wave_tile(m: int, g: int, n: int) -> GemmConfig | None:
    """The narrowest persistent 64-token wgmma tile of ``WAVE_TILES`` whose tiles fit one wave
    (``ONE_WAVE_TILES``), so the most programs share the weight; ``None`` where none fits."""
    for block_n, stages in WAVE_TILES:
        cfg = GemmConfig(64, block_n, num_warps=4, num_stages=stages, wgmma=True,
                         programs_per_sm=1)
        if programs(cfg, m, g, n) <= ONE_WAVE_TILES:
            return cfg
    return None


def k_split(cfg: GemmConfig, m: int, g: int, n: int, k_blocks: int, *, most: int = 256) -> int:
    """K parts for a grid of few tiles: at most ``most`` programs in all, at most 8 parts, at
    most 256 / block_m (the last part reads every part back), and a divisor of the K blocks.

    The pointer kernels take two programs per SM (``most`` 256); the wgmma kernel's 8 stages
    fill an SM, so its split stops at one wave (``ONE_WAVE_TILES``): a second wave doubles it.
    """
    tiles = max(1, programs(cfg, m, g, n))  # zero tokens: any shape, nothing launches
    split = max(1, min(8, most // tiles, 256 // cfg.block_m))
    while k_blocks % split:
        split //= 2
    return split


#: Registers a thread of the warp-specialized kernel's producer warpgroup keeps (its
#: ``setmaxnreg``; the consumers get the rest, 240): it only issues TMA copies.
WS_PRODUCER_REGS = 24


def warp_specialized(cfg: GemmConfig) -> bool:
    """Whether a wgmma launch runs ``wgmma_ws_kernels``' kernel (a producer warp of its own
    streams the tiles): its persistent, unswapped, unsplit tiles, whose producer keeps loading
    across a program's tiles while the consumers finish one."""
    return cfg.wgmma and cfg.programs_per_sm > 0 and not cfg.swap_ab and cfg.split_k == 1


def check_split(cfg: GemmConfig, k_blocks: int) -> None:
    """Raise ``ValueError`` unless ``cfg.split_k`` divides the K blocks."""
    if k_blocks % cfg.split_k:
        raise ValueError(f"split_k={cfg.split_k} does not divide K / B = {k_blocks}")


def tile_programs(m: int, g: int, n: int, block_m: int, block_n: int, programs_per_sm: int,
                  sm_count: int, split_k: int = 1) -> int:
    """Grid of the tile-walking kernels (TMA, wgmma): one program per output tile (per K part
    of a tile, split ``split_k`` ways), or at most ``programs_per_sm`` resident programs per SM
    that loop over them."""
    tiles = cdiv(m, block_m) * (n // block_n) * g * split_k
    if programs_per_sm:
        return min(tiles, programs_per_sm * sm_count)
    return tiles


#: Hopper's shared memory per block (227 KiB), less what the wgmma kernel's barriers take.
SMEM_BYTES = 227 * 1024 - 256


@dataclasses.dataclass(frozen=True)
class WgmmaLaunch:
    """One wgmma GEMM launch, as the torch and JAX launchers make it: the grid (``programs``),
    the ``(shape, strides, tile)`` of the x, w and y descriptors, and the constexprs."""

    programs: int
    views: tuple[tuple[tuple[int, int], tuple[int, int], tuple[int, int]], ...]
    constexprs: dict


def wgmma_launch(m: int, g: int, n: int, k: int, block: int, cfg: GemmConfig, *,
                 out_bytes: int, sms: int, x_row: int, y_row: int,
                 scale_strides: tuple[int, int, int, int],
                 resident_x: bool = False) -> WgmmaLaunch:
    """The wgmma kernel's launch for ``x [M, G, K]`` (rows ``x_row`` apart, (G, K) packed),
    ``w [G, N, K]`` contiguous, ``y [M, G, N]`` (rows ``y_row`` apart) and scales with strides
    ``(x_scale M, x_scale G, w_scale G, w_scale N)``, on a GPU of ``sms`` SMs. ``cfg.split_k``
    must divide the K blocks (``check_split``). ``resident_x``: the fused chain's, whose
    program holds its work unit's activations in shared memory (``wgmma_stages``)."""
    bm, bn = cfg.block_m, cfg.block_n
    check_split(cfg, k // block)
    programs = tile_programs(m, g, n, bm, bn, cfg.programs_per_sm, sms, cfg.split_k)
    specialized = warp_specialized(cfg)
    stages = wgmma_stages(cfg.num_stages, k // block // cfg.split_k, bm, bn, block, out_bytes,
                          staged_scales=specialized, resident_x=resident_x)
    if specialized:  # its ring spans tiles; a lone stage would wait for itself
        stages = max(2, stages)
    sxsm, sxsg, swsg, swsn = scale_strides
    views = (((m, g * k), (x_row, 1), (bm, block)), ((g * n, k), (k, 1), (bn, block)),
             ((m, g * n), (y_row, 1), (bm, bn)))
    constexprs = dict(SXSM=sxsm, SXSG=sxsg, SWSG=swsg, SWSN=swsn, G=g, N=n, K=k, STAGES=stages,
                      num_warps=cfg.num_warps, SWAP_AB=cfg.swap_ab, SPLIT_K=cfg.split_k,
                      PDL=cfg.pdl)
    if warp_specialized(cfg):
        constexprs["PRODUCER_NUM_REGS"] = WS_PRODUCER_REGS
    return WgmmaLaunch(programs, views, constexprs)


def wgmma_stages(requested: int, k_blocks: int, block_m: int, block_n: int, block: int,
                 out_bytes: int, *, staged_scales: bool = False,
                 resident_x: bool = False) -> int:
    """The wgmma kernel's pipeline depth: ``requested``, at most one stage per K block (of a
    K part, when split) and as many fp8 ``x``/``w`` tile pairs as fit in shared memory beside
    the output tile (so an fp32 output gets fewer stages than a bf16 one) and, with
    ``staged_scales`` (the warp-specialized kernel), a tile's block scales
    (``staged_scale_bytes``); with ``resident_x`` (the fused chain's kernel), ``w`` tiles
    beside the work unit's every ``x`` tile (``wo_a_fp8_blocker`` says when one fits)."""
    stage_bytes = (block_n if resident_x else block_m + block_n) * block
    fixed = block_m * block_n * out_bytes
    if staged_scales:
        fixed += staged_scale_bytes(k_blocks, block_m)
    if resident_x:
        fixed += k_blocks * block_m * block
    return max(0, min(requested, k_blocks, (SMEM_BYTES - fixed) // stage_bytes))


def staged_scale_bytes(k_blocks: int, block_m: int) -> int:
    """Shared memory of the warp-specialized kernel's staged block scales (its ``scales``
    allocation): fp32, one ``block_m`` row per K block, the K blocks padded to a power of
    two."""
    return (1 << (k_blocks - 1).bit_length()) * block_m * 4


# ---------------------------------------------------------------------------------------------
# The fused FP8 chain (wo_a_fp8_kernel)
# ---------------------------------------------------------------------------------------------

#: Activations one step of the fused kernel's prologue quantizes: 32 groups of 128 (16 fp32
#: values per thread at 8 warps).
WO_A_FP8_QUANT_LANES = 4096

#: Activations the whole fused grid's prologues quantize, at most: every weight-row tile
#: quantizes its K slice of every token again, so this is ``M * G * K * N / BLOCK_N``.
WO_A_FP8_GRID_LANES = 1 << 19


def wo_a_fp8_chosen(m: int, g: int, n: int, k: int, block: int, *, dependent: bool,
                    wgmma: bool = False) -> bool:
    """Whether ``wo_a_fp8`` runs the fused kernel by default: always where its launch shape is
    the wgmma kernel's (``wo_a_fp8_config``: one token at G <= 4 on Hopper); else when each
    program's prologue is one step (at most ``WO_A_FP8_QUANT_LANES`` activations) and the
    grid's prologues together quantize at most ``WO_A_FP8_GRID_LANES`` (M <= 8 at G = 2,
    M <= 4 at G = 4, M <= 2 at G = 8, M = 1 at G = 16). Beyond either, the repeated
    quantization keeps the tensor cores idle longer than a second launch costs.

    ``dependent``: the unfused chain would launch its GEMM as the quant's programmatic
    dependent on this device (``chain_dependent`` where PDL is on). Where that GEMM then has
    its whole weight requested before the quant ends (``dependent_streams_weight``: G = 2 up
    to 8 tokens on V4), the quant's time hides under the weight stream and the two launches
    win, so the kernel is not fused."""
    cfg = wo_a_fp8_config(m, g, n, k, block, wgmma=wgmma)
    if cfg.wgmma:
        return True
    if dependent and dependent_streams_weight(m, g, n, k, block):
        return False
    return (m * (k // block) // cfg.split_k * block <= WO_A_FP8_QUANT_LANES
            and m * g * k * cdiv(n, cfg.block_n) <= WO_A_FP8_GRID_LANES)


@_memoized
def wo_a_fp8_config(m: int, g: int, n: int, k: int, block: int, *,
                    wgmma: bool = False) -> GemmConfig:
    """The fused kernel's launch shape for ``m`` tokens: 16-64 token columns x 128 weight rows,
    8 warps; K split as the GEMM splits it when the tiles are few (``FEW_PROGRAMS``), then 4
    stages, else 5.

    ``wgmma`` (the wgmma kernel can run, ``wgmma_available``), with 128-blocks, N a multiple of
    128 and K of 8 blocks: one token at G <= 4 takes the wgmma kernel's swapped 8 x 128 tile,
    K split 8 ways (``wgmma_stages`` gives each part a stage per K block, its whole slice in
    flight), faster in a model step of many layers than both the pointer kernel's fused tile
    and the quant with its dependent GEMM there."""
    if (wgmma and m == 1 and g <= 4 and block == 128 and n % 128 == 0
            and k % (8 * block) == 0):
        return GemmConfig(8, 128, split_k=8, swap_ab=True, num_warps=4, num_stages=8,
                          wgmma=True)
    block_m = min(64, max(16, 1 << max(0, m - 1).bit_length()))
    cfg = GemmConfig(block_m, 128, swap_ab=True, num_warps=8, num_stages=5)
    if programs(cfg, m, g, n) > FEW_PROGRAMS:
        return cfg
    return dataclasses.replace(cfg, split_k=k_split(cfg, m, g, n, k // block), num_stages=4)


def hw_fp8_cast(fp8_name: str, target: str) -> bool:
    """Whether the compiled fp32 -> fp8 cast on ``target`` is already RNE on the e4m3 grid.

    Only CUDA's e4m3fn cast is; the interpreter rounds ties away from zero and AMD's e4m3fnuz
    cast is not checked here, so those round on the fp32 side first (same bytes, more
    instructions).
    """
    return target == "cuda" and fp8_name == "float8_e4m3fn"


def wo_a_fp8_blocker(dh: int, rd: int, block: int, config: GemmConfig | None = None, *,
                     k: int | None = None) -> str | None:
    """Why the fused kernel cannot run a chain of head dim ``dh``, rope dim ``rd`` and scale
    block ``block`` at launch shape ``config`` over ``k`` (``None`` when it can)."""
    if dh % block:
        return f"head_dim {dh} is not a multiple of the scale block {block}"
    if rd > dh:
        return f"rope dim {rd} exceeds head_dim {dh}"
    if config is not None and (config.tma or config.programs_per_sm or not config.swap_ab):
        return (f"the fused kernels take swapped tiles, one per program (swap_ab=True, "
                f"tma=False, programs_per_sm=0), got {config}")
    if config is not None and config.wgmma and block % config.block_n:
        return (f"the fused wgmma kernel's weight rows share one scale block: block_n "
                f"{config.block_n} must divide {block}")
    if config is not None and config.wgmma and k is not None and wgmma_stages(
            1, k // block // config.split_k, config.block_m, config.block_n, block, 4,
            resident_x=True) < 1:
        return (f"the fused wgmma kernel holds its K part's activations in shared memory: "
                f"{k // block // config.split_k} K blocks of block_m {config.block_m} rows "
                f"leave no room for a weight stage; split K further or take fewer tokens")
    return None
