"""Warp-specialized Gluon variant of the Hopper wgmma GEMM, for its persistent tiles.

``wgmma_kernels.batched_gemm_a8w8_mxscale_wgmma_kernel`` has one set of warps both request the
TMA loads and run the MMAs, so each refill waits behind the MMA wait that frees its stage. Here a
one-warp producer partition streams the x and w tiles into a ring of ``STAGES`` shared stages on
its own, and the default partition (the warpgroups) only waits for full stages, runs the MMAs,
promotes the products and stores the tiles.

Per K block the MMA and the promotion are the wgmma kernel's own (same wgmma shape, a fresh
product per 128-K block, ``acc + product * scale`` in K order), so the outputs are the same
bits. Persistent unswapped tiles only, no split K.

The scales of a tile (its tokens' ``x_scale`` rows and its weight block's ``w_scale`` row) are
read once when the tile starts and kept in shared memory as fp32 block scales, one row per K
block, so the K loop reads them from shared memory instead of waiting on global loads.

Two barrier rings: ``ready[s]`` (the producer's expect-tx; the TMA engine completes it when the
stage's bytes land) and ``empty[s]`` (one arrival, after every consumer warpgroup has waited
for the MMA that read the stage and met at a partition-wide barrier). Round
``r = i // STAGES`` of stage ``s`` waits for ``ready`` phase ``r & 1``; the producer waits for
``empty`` phase ``(r & 1) ^ 1``, which a fresh barrier passes at once in round 0.

Like ``wgmma_kernels``, this module imports no torch. It needs Gluon's ``warp_specialize`` with
the ``functions_and_args`` signature (Triton 3.6).
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma_wait,
)

from .wgmma_kernels import (
    _PUBLIC_REINTERPRET,
    _block_scale,
    _cta_barrier,
    _issue_load,
    _mma,
    _promote,
    _store_tile,
    _tile_origin,
    _wait_prior_grid,
)


@gluon.jit
def _rows_view(scales):
    """``scales [KB_ROWS, BLOCK_M]`` as one ``[BLOCK_M]`` row per K block (``.index(kb)``):
    the same bytes, as the row-major layout stores them."""
    layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    if _PUBLIC_REINTERPRET:
        return scales.reinterpret(gl.float32, scales.shape, layout)
    else:
        return scales._reinterpret(gl.float32, scales.shape, layout)


@gluon.jit
def _stage_scales(scales, xs_ptr, ws_ptr, g, m0, n0, M, SXSM: gl.constexpr, SXSG: gl.constexpr,
                  SWSG: gl.constexpr, SWSN: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_K: gl.constexpr, KB: gl.constexpr, num_warps: gl.constexpr):
    """Write one tile's block scales, ``2**(xs - 127) * 2**(ws - 127)`` for each token row and
    K block (rows past M as 1), into ``scales [KB_ROWS, BLOCK_M]`` fp32, K block major. The
    first barrier keeps the previous tile's reads ahead of the writes, the second the writes
    ahead of this tile's reads."""
    KB_ROWS: gl.constexpr = scales.shape[0]
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, KB_ROWS, layout=gl.SliceLayout(0, layout))
    xs = gl.load(xs_ptr + g * SXSG + rows.to(gl.int64)[:, None] * SXSM + cols[None, :],
                 mask=(rows[:, None] < M) & (cols[None, :] < KB), other=127)
    ws = gl.load(ws_ptr + g * SWSG + (n0 // BLOCK_K) * SWSN + cols, mask=cols < KB, other=127)
    block_scales = _block_scale(xs, ws[None, :])
    _cta_barrier()
    scales.store(gl.permute(block_scales, (1, 0)))
    _cta_barrier()


@gluon.jit
def _ws_producer(x_desc, w_desc, a_bufs, b_bufs, ready, empty, M, num_programs,
                 G: gl.constexpr, N: gl.constexpr, K: gl.constexpr, STAGES: gl.constexpr,
                 PDL: gl.constexpr):
    """Worker partition (one warp): TMA-load K block ``i`` of this program's tiles into stage
    ``i % STAGES`` once the consumers have released it. ``PDL``: the first ``STAGES`` weight
    tiles are requested before waiting for the kernel before this one, the activations after
    (the stages are free then: round 0 needs no release)."""
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    KB: gl.constexpr = K // BLOCK_K
    NUM_N: gl.constexpr = N // BLOCK_N
    pid = gl.program_id(0)
    tiles_per_group = gl.cdiv(M, BLOCK_M) * NUM_N
    total = gl.cdiv(tiles_per_group * G - pid, num_programs) * KB
    first = 0
    if PDL:
        for j in gl.static_range(STAGES):
            if j < total:
                _issue_load(x_desc, w_desc, a_bufs, b_bufs, ready, j, pid, num_programs,
                            tiles_per_group, K, N, KB, NUM_N, 1, STAGES, 1)
        _wait_prior_grid()
        for j in gl.static_range(STAGES):
            if j < total:
                _issue_load(x_desc, w_desc, a_bufs, b_bufs, ready, j, pid, num_programs,
                            tiles_per_group, K, N, KB, NUM_N, 1, STAGES, 2)
        first = STAGES
    for i in range(first, total):
        mbarrier.wait(empty.index(i % STAGES), ((i // STAGES) & 1) ^ 1)
        _issue_load(x_desc, w_desc, a_bufs, b_bufs, ready, i, pid, num_programs,
                    tiles_per_group, K, N, KB, NUM_N, 1, STAGES)


@gluon.jit
def _take(a_bufs, b_bufs, ready, i, product, STAGES: gl.constexpr):
    """Wait until stage ``i % STAGES`` holds K block ``i``, and start its MMA into ``product``."""
    mbarrier.wait(ready.index(i % STAGES), (i // STAGES) & 1)
    return _mma(a_bufs, b_bufs, i, product, False, STAGES)


@gluon.jit
def _release(empty, i, total, STAGES: gl.constexpr):
    """Hand stage ``i % STAGES`` back to the producer once its MMA has completed (the caller
    waited for it), unless no later block reuses it. The runtime branch also keeps the
    promotions in program order: without it the compiler sinks some of them past later MMAs,
    and the products they hold spill."""
    if i + STAGES < total:
        _cta_barrier()  # both warpgroups' waits are done before the one arrival
        mbarrier.arrive(empty.index(i % STAGES))


@gluon.jit
def _ws_consumer(y_desc, a_bufs, b_bufs, y_smem, scales, ready, empty, xs_ptr, ws_ptr, M,
                 num_programs, SXSM: gl.constexpr, SXSG: gl.constexpr, SWSG: gl.constexpr,
                 SWSN: gl.constexpr, G: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
                 STAGES: gl.constexpr, num_warps: gl.constexpr, PDL: gl.constexpr):
    """Default partition: the wgmma kernel's K loop (unsplit, unswapped), with stage waits on
    ``ready`` in place of its loads, releases on ``empty`` where it would refill, and each
    tile's block scales staged in ``scales`` (``_stage_scales``). ``PDL``: the scales are read
    after the kernel before this one has finished."""
    BLOCK_M: gl.constexpr = y_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = y_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.shape[2]
    KB: gl.constexpr = K // BLOCK_K
    NUM_N: gl.constexpr = N // BLOCK_N
    pid = gl.program_id(0)
    tiles_per_group = gl.cdiv(M, BLOCK_M) * NUM_N
    my_tiles = gl.cdiv(tiles_per_group * G - pid, num_programs)
    total = my_tiles * KB
    if PDL:
        _wait_prior_grid()

    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 32])
    token_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    rows = _rows_view(scales)
    for t in range(my_tiles):
        g, m0, n0 = _tile_origin(pid + t * num_programs, tiles_per_group, NUM_N, BLOCK_M,
                                 BLOCK_N)
        base = t * KB
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_layout)
        # As in the wgmma kernel: register sets A and B take the blocks' products in turn, the
        # K loop unrolled (a runtime loop serializes the wgmmas, ptxas C7514).
        spent = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, mma_layout)
        _stage_scales(scales, xs_ptr, ws_ptr, g, m0, n0, M, SXSM, SXSG, SWSG, SWSN, BLOCK_M,
                      BLOCK_K, KB, num_warps)
        pending = _take(a_bufs, b_bufs, ready, base, acc, STAGES)
        for kb in gl.static_range(1, KB - 1, 2):
            i = base + kb
            in_b = _take(a_bufs, b_bufs, ready, i, spent, STAGES)
            scale_a = rows.index(kb - 1).load(token_layout)
            prod_a = warpgroup_mma_wait(num_outstanding=1, deps=(pending,))
            _release(empty, i - 1, total, STAGES)
            acc = _promote(acc, prod_a, scale_a, False)

            pending = _take(a_bufs, b_bufs, ready, i + 1, prod_a, STAGES)
            scale_b = rows.index(kb).load(token_layout)
            spent = warpgroup_mma_wait(num_outstanding=1, deps=(in_b,))
            _release(empty, i, total, STAGES)
            acc = _promote(acc, spent, scale_b, False)
        if KB % 2 == 0:  # one block left for set B
            i = base + KB - 1
            in_b = _take(a_bufs, b_bufs, ready, i, spent, STAGES)
            scale_a = rows.index(KB - 2).load(token_layout)
            prod_a = warpgroup_mma_wait(num_outstanding=1, deps=(pending,))
            _release(empty, i - 1, total, STAGES)
            acc = _promote(acc, prod_a, scale_a, False)
            scale_b = rows.index(KB - 1).load(token_layout)
            prod_b = warpgroup_mma_wait(num_outstanding=0, deps=(in_b,))
            _release(empty, i, total, STAGES)
            acc = _promote(acc, prod_b, scale_b, False)
        else:
            i = base + KB - 1
            scale_a = rows.index(KB - 1).load(token_layout)
            prod_a = warpgroup_mma_wait(num_outstanding=0, deps=(pending,))
            _release(empty, i, total, STAGES)
            acc = _promote(acc, prod_a, scale_a, False)
        _store_tile(acc, y_desc, y_smem, m0, g * N + n0, False)
    tma.store_wait(pendings=0)


@gluon.jit
def batched_gemm_a8w8_mxscale_wgmma_ws_kernel(
    x_desc, w_desc, y_desc, xs_ptr, ws_ptr, M, num_programs,
    part_ptr, count_ptr,  # unused (no split K): kept so launches match the wgmma kernel's
    SXSM: gl.constexpr, SXSG: gl.constexpr,  # x_scale [M, G, K/SB] strides (last contiguous)
    SWSG: gl.constexpr, SWSN: gl.constexpr,  # w_scale [G, N/SB, K/SB] strides
    G: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
    STAGES: gl.constexpr, num_warps: gl.constexpr, PRODUCER_NUM_REGS: gl.constexpr,
    SWAP_AB: gl.constexpr = False, SPLIT_K: gl.constexpr = 1, PDL: gl.constexpr = False,
):
    """``y [M, G, N] = dq(x) @ dq(w)^T`` per group, persistent ``BLOCK_M x BLOCK_N`` tiles, the
    loads in a producer warp of their own.

    The descriptors, scale strides and parameters are
    ``batched_gemm_a8w8_mxscale_wgmma_kernel``'s (``SWAP_AB`` and ``SPLIT_K`` must stay off), so
    a launch of that kernel runs this one unchanged; ``PDL`` as there. ``num_programs``
    programs take every ``num_programs``-th tile, group by group; ``num_warps`` (the
    consumers: ``BLOCK_M == 16 * num_warps``) does not count the producer warp;
    ``PRODUCER_NUM_REGS``: the producer warpgroup's registers a thread
    (``configs.WS_PRODUCER_REGS``).
    """
    BLOCK_M: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
    gl.static_assert(not SWAP_AB and SPLIT_K == 1,
                     "the warp-specialized kernel runs unsplit, unswapped tiles")
    gl.static_assert(BLOCK_K % BLOCK_N == 0, "a tile's weight rows share one scale block")
    gl.static_assert(BLOCK_M == 16 * num_warps, "each warp owns 16 rows of the tile")
    # A stage is released only after the next block's MMA has started: one stage would wait
    # for itself.
    gl.static_assert(STAGES >= 2, "the producer needs a second stage to fill")

    a_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    b_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    y_smem = gl.allocate_shared_memory(y_desc.dtype, [BLOCK_M, BLOCK_N], y_desc.layout)
    scales = gl.allocate_shared_memory(gl.float32, [triton.next_power_of_2(K // BLOCK_K), BLOCK_M],
                                       gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for st in gl.static_range(STAGES):
        mbarrier.init(ready.index(st), count=1)
        mbarrier.init(empty.index(st), count=1)
    fence_async_shared()

    gl.warp_specialize([
        (_ws_consumer, (y_desc, a_bufs, b_bufs, y_smem, scales, ready, empty, xs_ptr, ws_ptr,
                        M, num_programs, SXSM, SXSG, SWSG, SWSN, G, N, K, STAGES, num_warps,
                        PDL)),
        (_ws_producer, (x_desc, w_desc, a_bufs, b_bufs, ready, empty, M, num_programs, G, N, K,
                        STAGES, PDL)),
    ], [1], [PRODUCER_NUM_REGS])
    # No mbarrier.invalidate at exit: the barriers die with the CTA, and Gluon puts a partition
    # barrier between each pair of invalidations, on every launch's critical path.
