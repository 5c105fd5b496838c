"""Triton kernels of the BF16 chain's GEMM (no torch import: any launcher may use them), each
named after the op that launches it (``woa_triton::wo_a_bf16``, ``::wo_a_bf16_rotating``).

``y[s, g, n] = sum_k A[s, g, k] * W[g, n, k]`` with A the inverse-rotated ``o`` viewed as
``[S, G, K]``, fp32 accumulation, bf16 out (docs/NUMERICS.md, the BF16 path). A is never
materialized: its NoPE K tiles are read straight from ``o [S, H, Dh]`` and its rope K tiles from
``R [S, H, RD]``, the rotated tails (``kernels.inverse_rope_kernel`` with ``TAIL_ONLY``). A K
tile of BLOCK_K lanes, with BLOCK_K dividing both Dh and RD, lies in one head and is either all
NoPE or all rope, so choosing its source is scalar arithmetic outside the tile load.

* ``wo_a_bf16_kernel``: pointer loads, one K loop whose body is a load and a dot (the
  software pipeliner's form); each tile picks its base pointer and row stride.
* ``wo_a_bf16_tma_kernel``: tensor-descriptor (TMA) tiles; a descriptor cannot be picked
  per tile inside a pipelined loop, so the K loop is split in two, the group's NoPE tiles from
  ``o`` and then its rope tiles from ``R`` (the sum's order is free: the tolerance is
  ``gemm_bf16``).
* ``wo_a_bf16_rotating_kernel``: the whole chain in one launch, for groups of whole heads: the
  same two K loops with pointer loads, the second rotating each rope tile of ``o`` itself (the
  bits of ``kernels.inverse_rope_kernel``). Each loop's addresses are the loop index times
  constants, which keeps its loads vectorized and pipelined; a per-tile choice of source does
  not.

Array inputs, runtime scalars, the output, then constexprs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels import _rotated_bf16, _round_bf16_rne, _split_k_store


@triton.jit
def _dot(acc, a, b, DOT_IN_FP32: tl.constexpr):
    """``acc + a @ b^T`` for bf16 ``a [BM, BK]``, ``b [BN, BK]``, fp32 ``acc``.

    ``DOT_IN_FP32``: the operands are widened first (exact) for Triton's CPU interpreter, whose
    ``tl.dot`` multiplies the bit patterns of bf16 operands (triton-lang/triton#11584).
    """
    if DOT_IN_FP32:
        return tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(a, tl.trans(b), acc)


@triton.jit
def _settled(acc, SETTLE_MMA: tl.constexpr):
    """``acc``, read by an opaque copy where ``SETTLE_MMA`` (CUDA) asks.

    The copy needs the loop's MMAs complete, so none stays in flight into the next iteration.
    A tile computed in registers is wgmma's register operand; Triton's pipeliner (3.6) lets
    the next iteration overwrite those registers while earlier wgmmas may still read them
    (triton-lang/triton#9433): wrong tiles whenever another kernel's MMAs slow the SM down.
    """
    if SETTLE_MMA:
        acc = tl.inline_asm_elementwise("mov.f32 $0, $1;", "=f,f", [acc], dtype=tl.float32,
                                        is_pure=True, pack=1)
    return acc


@triton.jit
def _tile(w_ptr, M, SWG: tl.constexpr, SWN: tl.constexpr, N: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The program's output tile on grid ``(M tiles * N tiles, G)``, N tiles fastest:
    ``(g, offs_m, offs_n, offs_k, m_ok, n_ok, w_rows)``, ``w_rows`` the first K tile of its
    weight rows."""
    NUM_N: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    pid = tl.program_id(0)
    g = tl.program_id(1).to(tl.int64)
    offs_m = (pid // NUM_N).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % NUM_N) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + g * SWG + offs_n[:, None].to(tl.int64) * SWN + offs_k[None, :]
    return g, offs_m, offs_n, offs_k, offs_m < M, offs_n < N, w_rows


@triton.jit
def wo_a_bf16_kernel(
    o_ptr, r_ptr, w_ptr, M,
    y_ptr,
    SOM: tl.constexpr, SOH: tl.constexpr,  # o [S, H, Dh] token and head strides (Dh contiguous)
    SWG: tl.constexpr, SWN: tl.constexpr,  # w [G, N, K] strides (K contiguous)
    SYM: tl.constexpr, SYG: tl.constexpr,  # y [S, G, N] strides (N contiguous)
    H: tl.constexpr, DH: tl.constexpr, RD: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    """One ``[BLOCK_M, BLOCK_N]`` tile of group ``program_id(1)``'s ``y``.

    Grid ``(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), G)``, N tiles fastest: the programs that run
    together share their A rows, and a group's weight stays in L2 while its tiles run. ``R`` is
    ``[S, H, RD]`` contiguous. Group ``g`` holds ``o``'s flat lanes ``[g K, (g + 1) K)`` of each
    token (a group may start inside a head when G > H).
    """
    ROPE_FROM: tl.constexpr = DH - RD
    g, offs_m, offs_n, offs_k, m_ok, n_ok, w_rows = _tile(w_ptr, M, SWG, SWN, N, BLOCK_M,
                                                          BLOCK_N, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(K // BLOCK_K):
        lane = g * K + kt * BLOCK_K  # the tile's first lane in the token's H * Dh lanes
        head = lane // DH
        d = lane % DH
        rope = d >= ROPE_FROM
        a_base = tl.where(rope, r_ptr + head * RD + (d - ROPE_FROM), o_ptr + head * SOH + d)
        a_stride = tl.where(rope, H * RD, SOM)
        a = tl.load(a_base + offs_m[:, None] * a_stride + offs_k[None, :], mask=m_ok[:, None],
                    other=0.0)
        b = tl.load(w_rows + kt * BLOCK_K, mask=n_ok[:, None], other=0.0)
        acc = _dot(acc, a, b, DOT_IN_FP32)
    tl.store(y_ptr + offs_m[:, None] * SYM + g * SYG + offs_n[None, :],
             _round_bf16_rne(acc).to(tl.bfloat16), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def wo_a_bf16_tma_kernel(
    o_desc, r_desc, w_desc, M,
    y_ptr,
    SYM: tl.constexpr, SYG: tl.constexpr,  # y [S, G, N] strides (N contiguous)
    HPG: tl.constexpr, DH: tl.constexpr, RD: tl.constexpr, N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    """``wo_a_bf16_kernel``'s tile with tensor-descriptor loads, for groups of whole heads.

    ``o_desc`` views ``o`` as ``[S, H * Dh]``, ``r_desc`` ``R`` as ``[S, H * RD]`` and
    ``w_desc`` ``w`` as ``[G * N, K]``, with ``HPG`` heads per group (``K = HPG * Dh``); rows
    past M read as zeros. ``N % BLOCK_N == 0``, so a weight tile never straddles two groups.
    """
    K: tl.constexpr = HPG * DH
    NOPE_TILES: tl.constexpr = (DH - RD) // BLOCK_K  # per head
    ROPE_TILES: tl.constexpr = RD // BLOCK_K
    NUM_N: tl.constexpr = N // BLOCK_N
    pid = tl.program_id(0)
    g = tl.program_id(1)
    m0 = (pid // NUM_N) * BLOCK_M
    n0 = (pid % NUM_N) * BLOCK_N
    w_row = g * N + n0
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(HPG * NOPE_TILES):
        k = (t // NOPE_TILES) * DH + (t % NOPE_TILES) * BLOCK_K
        a = o_desc.load([m0, g * K + k])
        b = w_desc.load([w_row, k])
        acc = _dot(acc, a, b, DOT_IN_FP32)
    for t in range(HPG * ROPE_TILES):
        a = r_desc.load([m0, g * (HPG * RD) + t * BLOCK_K])
        b = w_desc.load([w_row, (t // ROPE_TILES) * DH + (DH - RD) + (t % ROPE_TILES) * BLOCK_K])
        acc = _dot(acc, a, b, DOT_IN_FP32)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * SYM + g * SYG + offs_n[None, :],
             _round_bf16_rne(acc).to(tl.bfloat16), mask=(offs_m < M)[:, None])


@triton.jit
def wo_a_bf16_rotating_kernel(
    o_ptr, pos_ptr, cos_ptr, sin_ptr, w_ptr, M, n_pos_rows,
    y_ptr,
    part_ptr, count_ptr,  # SPLIT_K > 1 only: fp32 parts [SPLIT_K, M, G, N], int32 counters
    SOM: tl.constexpr, SOH: tl.constexpr,  # o [S, H, Dh] token and head strides (Dh contiguous)
    SCP: tl.constexpr, SSP: tl.constexpr,  # cos/sin [P, RD / 2] row strides
    SWG: tl.constexpr, SWN: tl.constexpr,  # w [G, N, K] strides (K contiguous)
    SYM: tl.constexpr, SYG: tl.constexpr,  # y [S, G, N] strides (N contiguous)
    HPG: tl.constexpr, DH: tl.constexpr, RD: tl.constexpr, N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ROUND_PRODUCTS: tl.constexpr, DOT_IN_FP32: tl.constexpr, SETTLE_MMA: tl.constexpr,
    SPLIT_K: tl.constexpr = 1,
):
    """One ``[BLOCK_M, BLOCK_N]`` tile of group ``program_id(1)``'s ``y = inv_rope(o) @ w^T``.

    Grid ``(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), G, SPLIT_K)``, N tiles fastest; group ``g`` is
    heads ``[g HPG, (g + 1) HPG)`` (``K = HPG * DH``). The NoPE tiles are multiplied as they lie
    in ``o``; each rope tile is rotated by -theta in fp32 and rounded to bf16 first, with
    cos/sin rows at the positions clamped to ``[0, n_pos_rows - 1]``. ``SETTLE_MMA`` (CUDA)
    completes each rope tile's MMAs before the next tile is rotated (``_settled``).

    ``SPLIT_K > 1`` splits K by whole heads (``SPLIT_K`` divides ``HPG``): K part
    ``program_id(2)`` takes ``HPG / SPLIT_K`` heads, and the parts meet in
    ``kernels._split_k_store``, so few tiles (few groups at decode sizes) still fill the GPU
    without narrowing the tile, which would read ``o`` once per narrow tile.
    """
    NOPE_TILES: tl.constexpr = (DH - RD) // BLOCK_K  # per head
    ROPE_TILES: tl.constexpr = RD // BLOCK_K
    HALF: tl.constexpr = BLOCK_K // 2
    HEADS: tl.constexpr = HPG // SPLIT_K  # this K part's heads
    g, offs_m, offs_n, offs_k, m_ok, n_ok, w_rows = _tile(w_ptr, M, SWG, SWN, N, BLOCK_M,
                                                          BLOCK_N, BLOCK_K)
    pid_k = tl.program_id(2)
    w_rows += pid_k * (HEADS * DH)
    o_rows = (o_ptr + offs_m[:, None] * SOM + (g * HPG + pid_k * HEADS) * SOH
              + offs_k[None, :])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(HEADS * NOPE_TILES):
        head = t // NOPE_TILES
        d = (t % NOPE_TILES) * BLOCK_K
        a = tl.load(o_rows + head * SOH + d, mask=m_ok[:, None], other=0.0)
        b = tl.load(w_rows + head * DH + d, mask=n_ok[:, None], other=0.0)
        acc = _dot(acc, a, b, DOT_IN_FP32)
    pos = tl.load(pos_ptr + offs_m, mask=m_ok, other=0).to(tl.int64)
    pos = tl.minimum(tl.maximum(pos, 0), n_pos_rows - 1)
    pairs = tl.arange(0, HALF)
    for t in range(HEADS * ROPE_TILES):
        head = t // ROPE_TILES
        d = (DH - RD) + (t % ROPE_TILES) * BLOCK_K
        col = (t % ROPE_TILES) * HALF + pairs
        c = tl.load(cos_ptr + pos[:, None] * SCP + col[None, :], mask=m_ok[:, None],
                    other=1.0).to(tl.float32)
        s = tl.load(sin_ptr + pos[:, None] * SSP + col[None, :], mask=m_ok[:, None],
                    other=0.0).to(tl.float32)
        x = tl.load(o_rows + head * SOH + d, mask=m_ok[:, None], other=0.0)
        a = _rotated_bf16(x, c, s, BLOCK_M, BLOCK_K, ROUND_PRODUCTS)
        b = tl.load(w_rows + head * DH + d, mask=n_ok[:, None], other=0.0)
        acc = _settled(_dot(acc, a, b, DOT_IN_FP32), SETTLE_MMA)
    _split_k_store(acc, y_ptr, part_ptr, count_ptr, offs_m, offs_n, g,
                   m_ok[:, None] & n_ok[None, :], M, pid_k, tl.program_id(0), SYM, SYG, N,
                   SPLIT_K, True)
