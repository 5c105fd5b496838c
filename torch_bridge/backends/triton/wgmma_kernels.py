"""Gluon (explicit-layout Triton) kernel for the block-scaled FP8 GEMM on Hopper.

``tl.dot`` cannot overlap the per-scale-block fp32 promotion with the tensor cores: the product
of one K block must be waited for before it is scaled, so the warpgroups idle while they
promote. Here each K block's product goes to a fresh accumulator asynchronously, and the
previous block's product is promoted while the next MMA runs (two products in flight).

``wo_a_fp8_wgmma_kernel`` runs the FP8 chain in one launch on the same K loop: each program
quantizes its activations with ``kernels``' rotation and scale helpers into shared memory,
where the loop's MMAs read them, then streams its weight tiles.

Like ``kernels``, this module imports no torch: the operands arrive as tensor descriptors and
raw pointers. Importing it needs a Triton with Gluon's Hopper dialect (3.5 or newer).
"""

from __future__ import annotations

import functools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from . import kernels

#: The CTA-wide barrier: ``gl.thread_barrier`` up to Triton 3.6, ``gl.barrier`` after.
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

# Triton 3.6 names the TMA copies async_copy_*; 3.7+ renamed them async_load /
# async_store and later removed the old names.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

#: Triton 3.6 names the shared-memory view ``_reinterpret``; later versions ``reinterpret``.
_PUBLIC_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))

#: Gluon element types by dtype name (torch's and NumPy's names agree for these).
_GL_DTYPES = {"float8_e4m3fn": gl.float8e4nv, "bfloat16": gl.bfloat16, "float32": gl.float32}


@functools.cache
def smem_layout(tile: tuple[int, int], dtype_name: str):
    """The swizzled shared-memory layout of a TMA tile of ``dtype_name`` (slow to build, so
    built once); the torch and JAX launchers' descriptors use it."""
    return gl.NVMMASharedLayout.get_default_for(list(tile), _GL_DTYPES[dtype_name])


@gluon.jit
def _e8m0_to_f32(byte):
    return (byte.to(gl.int32) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _block_scale(x_bytes, w_byte):
    """Row scales of one K block, ``2**(xs - 127) * 2**(ws - 127)``: exact in fp32 unless the
    product falls below 2**-126, far below any real activation and weight scale pair (it saves
    a multiply per accumulator element)."""
    return _e8m0_to_f32(x_bytes) * _e8m0_to_f32(w_byte)


@gluon.jit
def _mma(a_bufs, b_bufs, i, product, SWAP_AB: gl.constexpr, STAGES: gl.constexpr,
         X_RESIDENT: gl.constexpr = False):
    """Start the MMA of K block ``i`` into ``product`` (overwritten): ``x @ w^T`` or, swapped,
    ``w @ x^T``. The weight tile sits in stage ``i % STAGES``; the activations' there too, or
    with ``X_RESIDENT`` (a program's one work unit, its activations written to shared memory
    up front) in slot ``i``."""
    if X_RESIDENT:
        a = a_bufs.index(i)
    else:
        a = a_bufs.index(i % STAGES)
    b = b_bufs.index(i % STAGES)
    if SWAP_AB:
        return warpgroup_mma(b, a.permute((1, 0)), product, use_acc=False, is_async=True)
    else:
        return warpgroup_mma(a, b.permute((1, 0)), product, use_acc=False, is_async=True)


@gluon.jit
def _promote(acc, product, token_scales, SWAP_AB: gl.constexpr):
    """``acc + product * scale`` with the per-token scales along the tokens' axis."""
    if SWAP_AB:
        return acc + product * token_scales[None, :]
    else:
        return acc + product * token_scales[:, None]


@gluon.jit
def _tile_origin(tile, tiles_per_group, NUM_N: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr):
    """(group, first row, first column) of a tile; tiles run group by group, N fastest."""
    r = tile % tiles_per_group
    return tile // tiles_per_group, (r // NUM_N) * BLOCK_M, (r % NUM_N) * BLOCK_N


@gluon.jit
def _unit_origin(unit, tiles_per_group, NUM_N: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, SPLIT_K: gl.constexpr, KB_PER: gl.constexpr):
    """(group, first row, first column, first K block) of a work unit: K part
    ``unit % SPLIT_K`` of tile ``unit // SPLIT_K``, so a tile's parts run side by side."""
    g, m0, n0 = _tile_origin(unit // SPLIT_K, tiles_per_group, NUM_N, BLOCK_M, BLOCK_N)
    return g, m0, n0, (unit % SPLIT_K) * KB_PER


@gluon.jit
def _issue_load(x_desc, w_desc, a_bufs, b_bufs, ready, j, first_unit, num_programs,
                tiles_per_group, K: gl.constexpr, N: gl.constexpr, KB_PER: gl.constexpr,
                NUM_N: gl.constexpr, SPLIT_K: gl.constexpr, STAGES: gl.constexpr,
                PART: gl.constexpr = 0):
    """TMA-load this program's ``j``-th K block (over all its work units) into stage
    ``j % STAGES``: both tiles (``PART`` 0), or the weight's with the stage's byte count (1)
    and later the activations' (2), or the weight's alone, activations resident (3)."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    g, m0, n0, kb0 = _unit_origin(first_unit + (j // KB_PER) * num_programs, tiles_per_group,
                                  NUM_N, BLOCK_M, BLOCK_N, SPLIT_K, KB_PER)
    k0 = (kb0 + j % KB_PER) * BLOCK_K
    s = j % STAGES
    if PART == 3:
        mbarrier.expect(ready.index(s), w_desc.block_type.nbytes)
    elif PART != 2:
        mbarrier.expect(ready.index(s), x_desc.block_type.nbytes + w_desc.block_type.nbytes)
    if PART != 2:
        _tma_load(w_desc, [g * N + n0, k0], ready.index(s), b_bufs.index(s))
    if PART == 0 or PART == 2:
        _tma_load(x_desc, [m0, g * K + k0], ready.index(s), a_bufs.index(s))


@gluon.jit
def _tile_scales(xs_ptr, ws_ptr, g, m0, n0, kb0, M, SXSM: gl.constexpr, SXSG: gl.constexpr,
                 SWSG: gl.constexpr, SWSN: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_K: gl.constexpr, KB_PER: gl.constexpr, token_layout: gl.constexpr):
    """A tile's scale addresses from K block ``kb0`` (its tokens' ``x_scale`` rows, masked past
    M, and its weight block's ``w_scale`` row) and the scale bytes of its first two K blocks,
    for register sets A and B."""
    rows = m0 + gl.arange(0, BLOCK_M, layout=token_layout)
    xs_rows = xs_ptr + g * SXSG + rows.to(gl.int64) * SXSM + kb0
    rows_ok = rows < M
    ws_row = ws_ptr + g * SWSG + (n0 // BLOCK_K) * SWSN + kb0
    xs_a = gl.load(xs_rows, mask=rows_ok, other=127)
    ws_a = gl.load(ws_row)
    xs_b = gl.load(xs_rows + 1, mask=rows_ok & (KB_PER > 1), other=127)
    ws_b = gl.load(ws_row + 1, mask=KB_PER > 1, other=127)
    return xs_rows, rows_ok, ws_row, xs_a, ws_a, xs_b, ws_b


@gluon.jit
def _wait_prior_grid():
    """Under programmatic dependent launch, wait until the kernel before this one on the stream
    has finished and its writes are visible (a no-op in a plain launch)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _store_tile(acc, y_desc, y_smem, m0, n0, SWAP_AB: gl.constexpr):
    """TMA-store one output tile through ``y_smem``. The previous tile's store must have read
    ``y_smem`` before it is overwritten; the copy engine clips rows past M."""
    tma.store_wait(pendings=0)
    if SWAP_AB:
        y_smem.store(gl.permute(acc.to(y_desc.dtype), (1, 0)))
    else:
        y_smem.store(acc.to(y_desc.dtype))
    fence_async_shared()
    _tma_store(y_desc, [m0, n0], y_smem)


@gluon.jit
def _part(acc, part_ptr, k_part, part, stride, off, ok):
    """K part ``k_part`` of a tile: this program's own (``part``) from registers, another's
    from memory."""
    return gl.where(part == k_part, acc, gl.load(part_ptr + k_part * stride + off,
                                                 mask=ok & (part != k_part), other=0.0,
                                                 cache_modifier=".cg"))


@gluon.jit
def _reduce_parts(acc, part_ptr, count_ptr, tile, part, g, m0, n0, M, y_desc, y_smem,
                  G: gl.constexpr, N: gl.constexpr, SPLIT_K: gl.constexpr,
                  SWAP_AB: gl.constexpr, NUM_WARPS: gl.constexpr):
    """Serial split-K, as ``kernels._gemm_tile`` does it: park this K part's fp32 tile in
    ``part [SPLIT_K, M, G, N]``, take a ticket from the tile's counter, and if it is the last
    one add the parts in K order (its own from registers: the same bits as reading it back, so
    the sum never depends on arrival order), store ``y`` and set the counter back to 0."""
    BLOCK_M: gl.constexpr = y_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = y_desc.block_type.shape[1]
    layout: gl.constexpr = acc.type.layout
    # The other parts held at once take at most 96 fp32 registers a thread (a 64 x 64 tile in
    # 4 parts); a 64 x 128 tile's 7 others would spill.
    REDUCE_UNROLLED: gl.constexpr = (SPLIT_K - 1) * BLOCK_M * BLOCK_N <= 96 * 32 * NUM_WARPS
    toks = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0 if SWAP_AB else 1, layout))
    cols = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1 if SWAP_AB else 0, layout))
    rows = (toks.to(gl.int64) * G + g) * N
    if SWAP_AB:
        off = rows[None, :] + cols[:, None]
        ok = (toks[None, :] < M) & (cols[:, None] < N)
    else:
        off = rows[:, None] + cols[None, :]
        ok = (toks[:, None] < M) & (cols[None, :] < N)
    stride = gl.to_tensor(M).to(gl.int64) * (G * N)  # one part (M may be a constexpr 1)
    gl.store(part_ptr + part * stride + off, acc, mask=ok)
    _cta_barrier()  # every thread's part is written before the ticket releases it
    ticket = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    if ticket == SPLIT_K - 1:
        total = _part(acc, part_ptr, 0, part, stride, off, ok)
        # Unrolled, every part's load is issued before the sums: one L2 round trip, not one
        # per part. A runtime loop where the parts would not fit in registers beside the tile.
        if REDUCE_UNROLLED:
            for k_part in gl.static_range(1, SPLIT_K):
                total += _part(acc, part_ptr, k_part, part, stride, off, ok)
        else:
            for k_part in range(1, SPLIT_K):
                total += _part(acc, part_ptr, k_part, part, stride, off, ok)
        gl.store(count_ptr + tile, 0)
        _store_tile(total, y_desc, y_smem, m0, g * N + n0, SWAP_AB)


@gluon.jit
def batched_gemm_a8w8_mxscale_wgmma_kernel(
    x_desc, w_desc, y_desc, xs_ptr, ws_ptr, M, num_programs,
    part_ptr, count_ptr,  # SPLIT_K > 1 only: fp32 parts [SPLIT_K, M, G, N], int32 counters
    SXSM: gl.constexpr, SXSG: gl.constexpr,  # x_scale [M, G, K/SB] strides (last contiguous)
    SWSG: gl.constexpr, SWSN: gl.constexpr,  # w_scale [G, N/SB, K/SB] strides
    G: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
    STAGES: gl.constexpr, num_warps: gl.constexpr, SWAP_AB: gl.constexpr = False,
    SPLIT_K: gl.constexpr = 1, PDL: gl.constexpr = False,
):
    """``y [M, G, N] = dq(x) @ dq(w)^T`` per group in ``BLOCK_M x BLOCK_N`` tiles.

    ``x_desc`` views x as ``[M, G*K]`` with ``[BLOCK_M, SB]`` tiles, ``w_desc`` w as
    ``[G*N, K]`` with ``[BLOCK_N, SB]`` tiles and ``y_desc`` y as ``[M, G*N]``; BLOCK_K is the
    scale block SB and BLOCK_N divides SB, so one weight scale covers a tile's K block.
    ``num_programs`` programs take every ``num_programs``-th tile; the copy engine keeps
    ``STAGES`` K blocks in flight across tile boundaries, so the next tile's first blocks load
    while this one finishes, and each tile's store drains while the next one computes.

    ``SWAP_AB`` (decode): the tile's weight rows take the MMA's M side and its tokens the N
    side, which wgmma lets be as narrow as 8, so a few tokens do not pad to 64 rows.

    ``SPLIT_K > 1`` (few tiles): each tile's K blocks are cut into ``SPLIT_K`` parts, each a
    work unit of its own, so more SMs stream the weight; the parts are added in K order by the
    last to finish (``_reduce_parts``). Counters must start at 0.

    ``PDL`` (a programmatic dependent of the kernel before it, the FP8 chain's quant): the
    first ``STAGES`` weight tiles are requested before waiting for that kernel, so the weight
    streams while it runs; activations, scales, counters and every write come after the wait.
    That kernel must not write ``w``.
    """
    pid = gl.program_id(0)
    tiles_per_group, my_units, total = _program_units(x_desc, w_desc, M, pid, num_programs, G,
                                                      N, K, SPLIT_K)
    a_bufs, b_bufs, y_smem, ready = _allocate(x_desc, w_desc, y_desc, STAGES, STAGES)
    if PDL:
        _first_loads(x_desc, w_desc, a_bufs, b_bufs, ready, pid, num_programs, tiles_per_group,
                     total, K, N, SPLIT_K, STAGES, 1)
        _wait_prior_grid()
    _first_loads(x_desc, w_desc, a_bufs, b_bufs, ready, pid, num_programs, tiles_per_group,
                 total, K, N, SPLIT_K, STAGES, 2 if PDL else 0)
    _run_units(x_desc, w_desc, y_desc, xs_ptr, ws_ptr, M, num_programs, part_ptr, count_ptr,
               a_bufs, b_bufs, y_smem, ready, pid, my_units, total, tiles_per_group, SXSM, SXSG,
               SWSG, SWSN, G, N, K, STAGES, num_warps, SWAP_AB, SPLIT_K)


@gluon.jit
def _program_units(x_desc, w_desc, M, pid, num_programs, G: gl.constexpr, N: gl.constexpr,
                   K: gl.constexpr, SPLIT_K: gl.constexpr):
    """(tiles per group, this program's work units, its K blocks over all of them)."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    tiles_per_group = gl.cdiv(M, BLOCK_M) * (N // BLOCK_N)
    my_units = gl.cdiv(tiles_per_group * G * SPLIT_K - pid, num_programs)
    return tiles_per_group, my_units, my_units * (K // BLOCK_K // SPLIT_K)


@gluon.jit
def _allocate(x_desc, w_desc, y_desc, STAGES: gl.constexpr, X_SLOTS: gl.constexpr):
    """The ring of ``STAGES`` w tiles with a ready barrier each, ``X_SLOTS`` x tiles (the ring's
    ``STAGES``, or a resident work unit's K blocks) and the output tile."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    a_bufs = gl.allocate_shared_memory(x_desc.dtype, [X_SLOTS, BLOCK_M, BLOCK_K], x_desc.layout)
    b_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    y_smem = gl.allocate_shared_memory(y_desc.dtype, [BLOCK_M, BLOCK_N], y_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for st in gl.static_range(STAGES):
        mbarrier.init(ready.index(st), count=1)
    return a_bufs, b_bufs, y_smem, ready


@gluon.jit
def _first_loads(x_desc, w_desc, a_bufs, b_bufs, ready, pid, num_programs, tiles_per_group,
                 total, K: gl.constexpr, N: gl.constexpr, SPLIT_K: gl.constexpr,
                 STAGES: gl.constexpr, PART: gl.constexpr):
    """Request the first ``STAGES`` K blocks' tiles (``PART`` as ``_issue_load``'s)."""
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    for j in gl.static_range(STAGES):
        if j < total:
            _issue_load(x_desc, w_desc, a_bufs, b_bufs, ready, j, pid, num_programs,
                        tiles_per_group, K, N, K // BLOCK_K // SPLIT_K, N // BLOCK_N, SPLIT_K,
                        STAGES, PART)


@gluon.jit
def _run_units(x_desc, w_desc, y_desc, xs_ptr, ws_ptr, M, num_programs, part_ptr, count_ptr,
               a_bufs, b_bufs, y_smem, ready, pid, my_units, total, tiles_per_group,
               SXSM: gl.constexpr, SXSG: gl.constexpr, SWSG: gl.constexpr, SWSN: gl.constexpr,
               G: gl.constexpr, N: gl.constexpr, K: gl.constexpr, STAGES: gl.constexpr,
               num_warps: gl.constexpr, SWAP_AB: gl.constexpr, SPLIT_K: gl.constexpr,
               X_RESIDENT: gl.constexpr = False):
    """This program's work units, their first ``STAGES`` K blocks already requested: the K
    loop with the promotion overlapped, then the store or the split-K reduction.
    ``X_RESIDENT``: one work unit, its activations already in ``a_bufs`` slot by K block, so
    refills load the weight alone."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    KB: gl.constexpr = K // BLOCK_K
    KB_PER: gl.constexpr = KB // SPLIT_K
    NUM_N: gl.constexpr = N // BLOCK_N
    REFILL: gl.constexpr = 3 if X_RESIDENT else 0  # _issue_load's PART
    MMA_M: gl.constexpr = BLOCK_N if SWAP_AB else BLOCK_M
    MMA_N: gl.constexpr = BLOCK_M if SWAP_AB else BLOCK_N
    gl.static_assert(BLOCK_K % BLOCK_N == 0, "a tile's weight rows share one scale block")
    gl.static_assert(MMA_M % (16 * num_warps) == 0, "each warp owns 16-row slices of the MMA")
    gl.static_assert(KB % SPLIT_K == 0, "the K parts split the K blocks evenly")

    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, MMA_N, 32])
    token_layout: gl.constexpr = gl.SliceLayout(0 if SWAP_AB else 1, mma_layout)
    for t in range(my_units):
        unit = pid + t * num_programs
        g, m0, n0, kb0 = _unit_origin(unit, tiles_per_group, NUM_N, BLOCK_M, BLOCK_N, SPLIT_K,
                                      KB_PER)
        base = t * KB_PER
        acc = gl.zeros([MMA_M, MMA_N], gl.float32, mma_layout)
        # Two register sets, A and B, take the K blocks' products in turn. A step issues the
        # MMA of block kb into its set (overwriting the product it promoted one step earlier),
        # waits for the other set's block kb - 1, refills that block's stage and promotes it
        # while block kb runs. Scale bytes are loaded two steps before their use. The K loop is
        # unrolled at compile time: in a runtime loop ptxas cannot tell which wgmma group a
        # wait retires and serializes every wgmma of the kernel (its warning C7514).
        spent = gl.zeros([MMA_M, MMA_N], gl.float32, mma_layout)
        xs_rows, rows_ok, ws_row, xs_a, ws_a, xs_b, ws_b = _tile_scales(
            xs_ptr, ws_ptr, g, m0, n0, kb0, M, SXSM, SXSG, SWSG, SWSN, BLOCK_M, BLOCK_K, KB_PER,
            token_layout)
        mbarrier.wait(ready.index(base % STAGES), (base // STAGES) & 1)
        pending = _mma(a_bufs, b_bufs, base, acc, SWAP_AB, STAGES, X_RESIDENT)
        for kb in gl.static_range(1, KB_PER - 1, 2):
            i = base + kb
            mbarrier.wait(ready.index(i % STAGES), (i // STAGES) & 1)
            in_b = _mma(a_bufs, b_bufs, i, spent, SWAP_AB, STAGES, X_RESIDENT)
            xs_far = gl.load(xs_rows + (kb + 1), mask=rows_ok, other=127)
            ws_far = gl.load(ws_row + (kb + 1))
            prod_a = warpgroup_mma_wait(num_outstanding=1, deps=(pending,))
            if i - 1 + STAGES < total:
                _issue_load(x_desc, w_desc, a_bufs, b_bufs, ready, i - 1 + STAGES, pid,
                            num_programs, tiles_per_group, K, N, KB_PER, NUM_N, SPLIT_K, STAGES,
                            REFILL)
            acc = _promote(acc, prod_a, _block_scale(xs_a, ws_a), SWAP_AB)
            xs_a, ws_a = xs_far, ws_far

            mbarrier.wait(ready.index((i + 1) % STAGES), ((i + 1) // STAGES) & 1)
            pending = _mma(a_bufs, b_bufs, i + 1, prod_a, SWAP_AB, STAGES, X_RESIDENT)
            ahead = kb + 2 < KB_PER
            xs_far = gl.load(xs_rows + (kb + 2), mask=rows_ok & ahead, other=127)
            ws_far = gl.load(ws_row + (kb + 2), mask=ahead, other=127)
            spent = warpgroup_mma_wait(num_outstanding=1, deps=(in_b,))
            if i + STAGES < total:
                _issue_load(x_desc, w_desc, a_bufs, b_bufs, ready, i + STAGES, pid,
                            num_programs, tiles_per_group, K, N, KB_PER, NUM_N, SPLIT_K, STAGES,
                            REFILL)
            acc = _promote(acc, spent, _block_scale(xs_b, ws_b), SWAP_AB)
            xs_b, ws_b = xs_far, ws_far
        if KB_PER % 2 == 0:  # one block left for set B
            i = base + KB_PER - 1
            mbarrier.wait(ready.index(i % STAGES), (i // STAGES) & 1)
            in_b = _mma(a_bufs, b_bufs, i, spent, SWAP_AB, STAGES, X_RESIDENT)
            prod_a = warpgroup_mma_wait(num_outstanding=1, deps=(pending,))
            if i - 1 + STAGES < total:
                _issue_load(x_desc, w_desc, a_bufs, b_bufs, ready, i - 1 + STAGES, pid,
                            num_programs, tiles_per_group, K, N, KB_PER, NUM_N, SPLIT_K, STAGES,
                            REFILL)
            acc = _promote(acc, prod_a, _block_scale(xs_a, ws_a), SWAP_AB)
            prod_b = warpgroup_mma_wait(num_outstanding=0, deps=(in_b,))
            if i + STAGES < total:
                _issue_load(x_desc, w_desc, a_bufs, b_bufs, ready, i + STAGES, pid,
                            num_programs, tiles_per_group, K, N, KB_PER, NUM_N, SPLIT_K, STAGES,
                            REFILL)
            acc = _promote(acc, prod_b, _block_scale(xs_b, ws_b), SWAP_AB)
        else:
            i = base + KB_PER - 1
            prod_a = warpgroup_mma_wait(num_outstanding=0, deps=(pending,))
            if i + STAGES < total:
                _issue_load(x_desc, w_desc, a_bufs, b_bufs, ready, i + STAGES, pid,
                            num_programs, tiles_per_group, K, N, KB_PER, NUM_N, SPLIT_K, STAGES,
                            REFILL)
            acc = _promote(acc, prod_a, _block_scale(xs_a, ws_a), SWAP_AB)
        if SPLIT_K == 1:
            _store_tile(acc, y_desc, y_smem, m0, g * N + n0, SWAP_AB)
        else:
            _reduce_parts(acc, part_ptr, count_ptr, unit // SPLIT_K, unit % SPLIT_K, g, m0, n0,
                          M, y_desc, y_smem, G, N, SPLIT_K, SWAP_AB, num_warps)
    tma.store_wait(pendings=0)
    # No mbarrier.invalidate at exit: the barriers die with the CTA, and each invalidation
    # costs a CTA barrier on every launch's critical path.


@gluon.jit
def _quantize_unit(o_ptr, pos_ptr, cos_ptr, sin_ptr, x_tiles, xs_ptr, M, n_pos_rows, g, m0, kb0,
                   SOM: gl.constexpr, SCP: gl.constexpr, SSP: gl.constexpr, G: gl.constexpr,
                   K: gl.constexpr, SB: gl.constexpr, DH: gl.constexpr, RD: gl.constexpr,
                   KB_PER: gl.constexpr, BLOCK_M: gl.constexpr, TOKEN_ROWS: gl.constexpr,
                   INV_FP8_MAX: gl.constexpr, FP8_MAX: gl.constexpr,
                   FP8_MIN_NORMAL_EXP: gl.constexpr, AMAX_FLOOR: gl.constexpr,
                   HW_CAST: gl.constexpr, ROUND_PRODUCTS: gl.constexpr,
                   QUANT_ROWS: gl.constexpr, num_warps: gl.constexpr):
    """Inverse RoPE + 1 x SB E8M0 quant of a work unit's activations (tokens ``m0`` on, K
    blocks ``kb0`` on), with ``kernels``' rotation and scale rule: K block ``kb0 + j`` of the
    tile's tokens into ``x_tiles [KB_PER, BLOCK_M, SB]`` slot ``j``, the scale bytes into
    ``x_scale [M, G, K/SB]``.

    Only ``TOKEN_ROWS`` token rows (a power of two, ``BLOCK_M`` or fewer when the call has
    fewer tokens) are computed, up to ``QUANT_ROWS`` (token, K block) rows a step, K block
    major; each slot's other rows repeat them (their products land in output columns nothing
    stores). A GPT-J pair's two lanes are loaded apart, so the rotation needs no reshape
    (layouts are explicit here), and joined again for the store."""
    KB: gl.constexpr = K // SB
    STEP_BLOCKS: gl.constexpr = (KB_PER if KB_PER * TOKEN_ROWS <= QUANT_ROWS
                                 else max(1, QUANT_ROWS // TOKEN_ROWS))
    ROWS: gl.constexpr = STEP_BLOCKS * TOKEN_ROWS
    gl.static_assert(KB_PER % STEP_BLOCKS == 0, "the steps cover the unit's K blocks evenly")
    gl.static_assert(BLOCK_M % TOKEN_ROWS == 0, "the computed rows tile the slot")
    # The slots as one [KB_PER * BLOCK_M, SB] tile: the same bytes, as the swizzle repeats
    # every 8 rows.
    gl.static_assert(BLOCK_M % 8 == 0, "a slot holds whole swizzle periods")
    if _PUBLIC_REINTERPRET:
        x_rows = x_tiles.reinterpret(x_tiles.dtype, [KB_PER * BLOCK_M, SB], x_tiles.layout)
    else:
        x_rows = x_tiles._reinterpret(x_tiles.dtype, [KB_PER * BLOCK_M, SB], x_tiles.layout)
    layout: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [num_warps, 1], [1, 0])
    repeat: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4], [1, 1, 1, 32], [1, 1, num_warps, 1],
                                            [3, 2, 1, 0])
    pairs = gl.arange(0, SB // 2, layout=gl.SliceLayout(0, layout))
    r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    toks = m0 + r % TOKEN_ROWS
    row_ok = toks < M
    tok = toks.to(gl.int64)
    pos = gl.load(pos_ptr + tok, mask=row_ok, other=0).to(gl.int64)
    pos = gl.minimum(gl.maximum(pos, 0), n_pos_rows - 1)  # AITER's clamp
    ok = row_ok[:, None]
    for j in gl.static_range(0, KB_PER, STEP_BLOCKS):
        lane0 = g * K + (kb0 + j + r // TOKEN_ROWS) * SB  # the row's first lane in its token
        even = lane0[:, None] + 2 * pairs[None, :]
        a = gl.load(o_ptr + tok[:, None] * SOM + even, mask=ok, other=0.0).to(gl.float32)
        b = gl.load(o_ptr + tok[:, None] * SOM + even + 1, mask=ok, other=0.0).to(gl.float32)
        c, s, is_rope = kernels._rope_cos_sin(even % DH, row_ok, pos, cos_ptr, sin_ptr, SCP,
                                              SSP, DH - RD)
        ra, rb = kernels._rotate(a, b, c, s, ROUND_PRODUCTS)
        a = gl.where(is_rope, ra, a)
        b = gl.where(is_rope, rb, b)
        byte, inv = kernels._e8m0_scale(gl.maximum(kernels._abs_max(a), kernels._abs_max(b)),
                                        INV_FP8_MAX, AMAX_FLOOR)
        q = gl.join(kernels._to_fp8(a, inv[:, None], FP8_MAX, FP8_MIN_NORMAL_EXP, HW_CAST,
                                    x_tiles.dtype),
                    kernels._to_fp8(b, inv[:, None], FP8_MAX, FP8_MIN_NORMAL_EXP, HW_CAST,
                                    x_tiles.dtype))
        if BLOCK_M > TOKEN_ROWS:
            q = gl.convert_layout(gl.reshape(q, [STEP_BLOCKS, 1, TOKEN_ROWS, SB]), repeat)
            q, _ = gl.broadcast(q, gl.zeros([STEP_BLOCKS, BLOCK_M // TOKEN_ROWS, TOKEN_ROWS, SB],
                                            x_tiles.dtype, repeat))
        x_rows.slice(j * BLOCK_M, STEP_BLOCKS * BLOCK_M).store(
            gl.reshape(q, [STEP_BLOCKS * BLOCK_M, SB]))
        gl.store(xs_ptr + tok * (G * KB) + lane0 // SB, byte.to(gl.uint8), mask=row_ok)


@gluon.jit
def wo_a_fp8_wgmma_kernel(
    x_desc, w_desc, y_desc, o_ptr, pos_ptr, cos_ptr, sin_ptr, ws_ptr, M, n_pos_rows,
    num_programs,
    x_ptr, xs_ptr,  # x_ptr unused (see x_desc); xs_ptr: the activations' scales, written
    part_ptr, count_ptr,  # SPLIT_K > 1 only (see batched_gemm_a8w8_mxscale_wgmma_kernel)
    SOM: gl.constexpr,  # o [S, H, Dh] token stride; group g's K lanes start at g * K
    SCP: gl.constexpr, SSP: gl.constexpr,  # cos/sin row strides
    SWSG: gl.constexpr, SWSN: gl.constexpr,  # w_scale [G, N/SB, K/SB] strides
    G: gl.constexpr, N: gl.constexpr, K: gl.constexpr, DH: gl.constexpr, RD: gl.constexpr,
    INV_FP8_MAX: gl.constexpr, FP8_MAX: gl.constexpr, FP8_MIN_NORMAL_EXP: gl.constexpr,
    AMAX_FLOOR: gl.constexpr, HW_CAST: gl.constexpr, ROUND_PRODUCTS: gl.constexpr,
    TOKEN_ROWS: gl.constexpr, QUANT_ROWS: gl.constexpr, STAGES: gl.constexpr,
    num_warps: gl.constexpr, SPLIT_K: gl.constexpr = 1, PDL: gl.constexpr = False,
):
    """The decode chain in one launch on the wgmma GEMM's swapped tile: each program quantizes
    the activations its tile reads (``_quantize_unit``) into shared memory, then requests its
    weight tiles and runs ``batched_gemm_a8w8_mxscale_wgmma_kernel``'s K loop on them, the
    activations resident (one slot per K block of its K part), only the weight streaming
    through the stages. The weight is requested after the quant's loads: requested first, the
    grid's whole weight stream sits ahead of the few activation and rope-table loads that
    every MMA waits on.

    One work unit (a tile's K part) per program: ``num_programs`` is the grid, every tile's
    every part. ``x_scale [M, G, K/SB]`` (contiguous) is scratch: the programs of a group's
    other N tiles write the same bytes there, and a program reads only rows it wrote itself.
    ``x_desc`` gives the activations' tile and shared layout; nothing reads or writes its
    memory. So the products are those of the quant followed by the wgmma GEMM with the same
    tile, in one launch.

    ``PDL``: launched as a programmatic dependent; it waits for the kernel before it ahead of
    any load, the weight's included (that kernel may write it).
    """
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    KB: gl.constexpr = K // BLOCK_K
    KB_PER: gl.constexpr = KB // SPLIT_K
    pid = gl.program_id(0)
    tiles_per_group, my_units, total = _program_units(x_desc, w_desc, M, pid, num_programs, G,
                                                      N, K, SPLIT_K)
    a_bufs, b_bufs, y_smem, ready = _allocate(x_desc, w_desc, y_desc, STAGES, KB_PER)
    if PDL:
        _wait_prior_grid()
    g, m0, n0, kb0 = _unit_origin(pid, tiles_per_group, N // BLOCK_N, BLOCK_M, BLOCK_N,
                                  SPLIT_K, KB_PER)
    _quantize_unit(o_ptr, pos_ptr, cos_ptr, sin_ptr, a_bufs, xs_ptr, M, n_pos_rows, g, m0, kb0,
                   SOM, SCP, SSP, G, K, BLOCK_K, DH, RD, KB_PER, BLOCK_M, TOKEN_ROWS,
                   INV_FP8_MAX, FP8_MAX, FP8_MIN_NORMAL_EXP, AMAX_FLOOR, HW_CAST, ROUND_PRODUCTS,
                   QUANT_ROWS, num_warps)
    fence_async_shared()  # the tiles' generic-proxy writes, ahead of the MMAs that read them
    _first_loads(x_desc, w_desc, a_bufs, b_bufs, ready, pid, num_programs, tiles_per_group,
                 total, K, N, SPLIT_K, STAGES, 3)
    _cta_barrier()  # and every thread's tiles and scale bytes written before any is read
    _run_units(x_desc, w_desc, y_desc, xs_ptr, ws_ptr, M, num_programs, part_ptr, count_ptr,
               a_bufs, b_bufs, y_smem, ready, pid, my_units, total, tiles_per_group, G * KB, KB,
               SWSG, SWSN, G, N, K, STAGES, num_warps, True, SPLIT_K, True)
