"""Triton kernel bodies of the inverse RoPE + 1 x GS E8M0 FP8 quant (no torch import: JAX
launches them too).

* ``inverse_rope_group_quant_head_kernel``: inverse GPT-J RoPE of each head's rope tail in
  fp32, then 1 x GS E8M0 (round-up) FP8 group quantization; one pass over ``o``, a (token
  block, head) per program (docs/NUMERICS.md, the quantization contract).
* ``inverse_rope_group_quant_kernel``: the same over flat groups, for head dims that GS does
  not divide.

Their arguments follow ``kernels``' order: array inputs, runtime scalars, outputs, constexprs.
The rotation and quantization helpers are ``kernels``', shared with the fused chain.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels import _dependent_start, _inverse_rope_pairs, _quantize_group, _rope_cos_sin


@triton.jit
def _inverse_rope_group(x, lane0, pos, row_ok, cos_ptr, sin_ptr, stride_cp, stride_sp,
                        ROPE_FROM: tl.constexpr, ROWS: tl.constexpr, WIDTH: tl.constexpr,
                        ROUND_PRODUCTS: tl.constexpr):
    """Inverse RoPE of ``WIDTH`` lanes per row (a quant group, or a whole head),
    ``x [ROWS, WIDTH]`` fp32 starting at head lane ``lane0``; lanes below ``ROPE_FROM`` pass
    through unchanged, cos/sin rows are ``pos``.

    Not ``_rope_cos_sin``: here the rotation's select depends on the lane only (rows out of
    range rotate by cos 1, sin 0 and are never stored); a per-row select added a ``selp`` per
    rotated value to the per-head kernel's sm_90 code."""
    lane = lane0 + 2 * tl.arange(0, WIDTH // 2)  # head offset of each pair's even lane
    is_rope = lane >= ROPE_FROM
    col = (lane - ROPE_FROM) // 2
    rope_ok = row_ok[:, None] & is_rope[None, :]
    c = tl.load(cos_ptr + pos[:, None] * stride_cp + col[None, :], mask=rope_ok,
                other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + pos[:, None] * stride_sp + col[None, :], mask=rope_ok,
                other=0.0).to(tl.float32)
    return _inverse_rope_pairs(x, c, s, is_rope[None, :], ROWS, WIDTH, ROUND_PRODUCTS)


@triton.jit
def inverse_rope_group_quant_kernel(
    o_ptr, pos_ptr, cos_ptr, sin_ptr, n_rows, n_pos_rows, stride_os, stride_cp, stride_sp,
    q_ptr, s_ptr,  # outputs after inputs and scalars (the order jax_launch passes them in)
    NQ: tl.constexpr,  # quant groups per token, H * Dh / GS
    GS: tl.constexpr,
    DH: tl.constexpr,
    RD: tl.constexpr,
    INV_FP8_MAX: tl.constexpr,  # fp32(1 / fp8_max), exactly representable
    FP8_MAX: tl.constexpr,
    FP8_MIN_NORMAL_EXP: tl.constexpr,  # -6 for e4m3fn, -7 for e4m3fnuz
    AMAX_FLOOR: tl.constexpr,  # the fp32-rounded floor
    HW_CAST: tl.constexpr,  # the target's fp32 -> fp8 cast is RNE (CUDA e4m3fn)
    ROUND_PRODUCTS: tl.constexpr,  # how the rotation rounds its products (_product)
    BLOCK_R: tl.constexpr,
    PDL: tl.constexpr = False,  # launched as a programmatic dependent launch (_dependent_start)
):
    """One program quantizes ``BLOCK_R`` consecutive 1 x GS groups of the flat ``[S * NQ, GS]``.

    Row ``r`` is quant group ``r % NQ`` of token ``r // NQ``; its lanes are ``o``'s lanes
    ``(r % NQ) * GS + [0, GS)`` of that token, so ``x_fp8`` and ``x_scale`` are written with the
    same flat index as the (contiguous) outputs. A lane meets its GPT-J partner through
    ``split``/``join`` (cheaper than a second load of ``lane ^ 1``).
    """
    HALF: tl.constexpr = GS // 2
    _dependent_start(PDL, True)
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    tok = rows // NQ
    qg = rows % NQ
    lanes = tl.arange(0, GS)
    x = tl.load(o_ptr + tok[:, None] * stride_os + qg[:, None] * GS + lanes[None, :],
                mask=row_ok[:, None], other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + tok, mask=row_ok, other=0).to(tl.int64)
    pos = tl.minimum(tl.maximum(pos, 0), n_pos_rows - 1)  # AITER's clamp
    # GPT-J pairs: (even, odd) neighbours; pair p sits at head offset d = (qg*GS + 2p) % DH.
    pairs = tl.arange(0, HALF)
    d = (qg[:, None] * GS + 2 * pairs[None, :]) % DH
    c, s, is_rope = _rope_cos_sin(d, row_ok, pos, cos_ptr, sin_ptr, stride_cp, stride_sp,
                                  DH - RD)
    v = _inverse_rope_pairs(x, c, s, is_rope, BLOCK_R, GS, ROUND_PRODUCTS)
    q, byte = _quantize_group(v, INV_FP8_MAX, FP8_MAX, FP8_MIN_NORMAL_EXP, AMAX_FLOOR, HW_CAST,
                              q_ptr.dtype.element_ty)
    out_off = rows[:, None] * GS + lanes[None, :]
    tl.store(q_ptr + out_off, q, mask=row_ok[:, None])
    tl.store(s_ptr + rows, byte.to(tl.uint8), mask=row_ok)


@triton.jit
def _store_scales(s_ptr, byte, toks, groups, n_tokens, NQ: tl.constexpr,
                  MN_ALIGN: tl.constexpr):
    """Store the ``[T, n]`` scale bytes of tokens ``toks [T]`` in quant groups ``groups [n]``.

    ``MN_ALIGN == 0``: E8M0 bytes in the row layout ``[S, NQ]``. ``MN_ALIGN > 0``: the fp32
    value ``2**(byte - 127)`` (the byte shifted into the exponent field, as
    ``torch_ref.e8m0_decode``) at ``group * S_pad + token``, ``S_pad`` = S rounded up to
    ``MN_ALIGN``: the token-major layout DeepGEMM's sm_90 kernels read their activation scales
    in, written here so that no conversion runs between the quant and that GEMM."""
    tok_ok = (toks < n_tokens)[:, None]
    if MN_ALIGN == 0:
        tl.store(s_ptr + toks[:, None] * NQ + groups[None, :], byte.to(tl.uint8), mask=tok_ok)
    else:
        ld = (n_tokens + MN_ALIGN - 1) // MN_ALIGN * MN_ALIGN
        value = (byte.to(tl.int32) << 23).to(tl.float32, bitcast=True)
        tl.store(s_ptr + groups[None, :] * ld + toks[:, None], value, mask=tok_ok)


@triton.jit
def inverse_rope_group_quant_head_kernel(
    o_ptr, pos_ptr, cos_ptr, sin_ptr, n_tokens, n_pos_rows, stride_os, stride_cp, stride_sp,
    q_ptr, s_ptr,  # outputs after inputs and scalars (the order jax_launch passes them in)
    H: tl.constexpr, DH: tl.constexpr, RD: tl.constexpr, GS: tl.constexpr,
    INV_FP8_MAX: tl.constexpr,  # fp32(1 / fp8_max), exactly representable
    FP8_MAX: tl.constexpr,
    FP8_MIN_NORMAL_EXP: tl.constexpr,  # -6 for e4m3fn, -7 for e4m3fnuz
    AMAX_FLOOR: tl.constexpr,  # the fp32-rounded floor
    HW_CAST: tl.constexpr,  # the target's fp32 -> fp8 cast is RNE (CUDA e4m3fn)
    ROUND_PRODUCTS: tl.constexpr,  # how the rotation rounds its products (_product)
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
    PDL: tl.constexpr = False,  # launched as a programmatic dependent launch (_dependent_start)
    WHOLE_HEAD: tl.constexpr = False,  # a head row at a time (Dh a power of two)
    SCALE_MN_ALIGN: tl.constexpr = 0,  # > 0: fp32 scales, token-major (_store_scales)
):
    """One program quantizes ``BLOCK_T`` tokens x ``BLOCK_H`` heads, one 1 x GS group at a time.

    Which groups hold rope lanes is known at compile time (the last RD lanes of each head), so
    only those pay for the GPT-J pair split, the cos/sin loads and the rotation; the others are
    load -> amax -> scale -> store. ``x_fp8 [S, G, D]`` is ``o``'s packed (H, Dh) layout, so a
    group's output offset is its input offset without the token padding.

    The 1D grid walks heads fastest: programs that run together read one token block's rows
    end to end, and a token's scale bytes (one sector per group) are complete in L2 before it
    evicts them.

    Loads run four groups ahead of the stores (``w0`` .. ``w3``): the compiler keeps a load
    after a store that may alias it, so a load written next to its group would be issued only
    once the group before it had arrived and been stored, one memory round trip per group.
    ``WHOLE_HEAD`` instead loads, rotates and stores each head row whole, the scale bytes in one
    store: the fewest memory instructions a row can take, for grids whose programs all run at
    once, where a program's latency is the kernel's time.
    """
    NG: tl.constexpr = DH // GS
    ROPE_FROM: tl.constexpr = DH - RD
    FP8_TY: tl.constexpr = q_ptr.dtype.element_ty
    HEAD_BLOCKS: tl.constexpr = H // BLOCK_H
    _dependent_start(PDL, True)
    pid = tl.program_id(0)
    toks = (pid // HEAD_BLOCKS).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_ok = toks < n_tokens
    pos = tl.load(pos_ptr + toks, mask=tok_ok, other=0).to(tl.int64)
    pos = tl.minimum(tl.maximum(pos, 0), n_pos_rows - 1)  # AITER's clamp
    for hh in range(BLOCK_H):
        h = (pid % HEAD_BLOCKS) * BLOCK_H + hh
        out_row = q_ptr + toks[:, None] * (H * DH) + h * DH
        if WHOLE_HEAD:
            head = tl.arange(0, DH)
            x = tl.load(o_ptr + toks[:, None] * stride_os + h * DH + head[None, :],
                        mask=tok_ok[:, None], other=0.0).to(tl.float32)
            x = _inverse_rope_group(x, 0, pos, tok_ok, cos_ptr, sin_ptr, stride_cp, stride_sp,
                                    ROPE_FROM, BLOCK_T, DH, ROUND_PRODUCTS)
            q, byte = _quantize_group(tl.reshape(x, (BLOCK_T * NG, GS)), INV_FP8_MAX, FP8_MAX,
                                      FP8_MIN_NORMAL_EXP, AMAX_FLOOR, HW_CAST, FP8_TY)
            tl.store(out_row + head[None, :], tl.reshape(q, (BLOCK_T, DH)), mask=tok_ok[:, None])
            _store_scales(s_ptr, tl.reshape(byte, (BLOCK_T, NG)), toks,
                          h * NG + tl.arange(0, NG), n_tokens, H * NG, SCALE_MN_ALIGN)
        else:
            lanes = tl.arange(0, GS)
            in_row = o_ptr + toks[:, None] * stride_os + h * DH + lanes[None, :]
            w0 = tl.load(in_row, mask=tok_ok[:, None], other=0.0)
            w1 = w0  # past the last group: never read
            w2 = w0
            w3 = w0
            if NG > 1:
                w1 = tl.load(in_row + GS, mask=tok_ok[:, None], other=0.0)
            if NG > 2:
                w2 = tl.load(in_row + 2 * GS, mask=tok_ok[:, None], other=0.0)
            if NG > 3:
                w3 = tl.load(in_row + 3 * GS, mask=tok_ok[:, None], other=0.0)
            for j in tl.static_range(NG):
                x = w0.to(tl.float32)
                w0, w1, w2 = w1, w2, w3
                if j + 4 < NG:
                    w3 = tl.load(in_row + (j + 4) * GS, mask=tok_ok[:, None], other=0.0)
                if (j + 1) * GS > ROPE_FROM:  # this group holds rope lanes
                    x = _inverse_rope_group(x, j * GS, pos, tok_ok, cos_ptr, sin_ptr, stride_cp,
                                            stride_sp, ROPE_FROM, BLOCK_T, GS, ROUND_PRODUCTS)
                q, byte = _quantize_group(x, INV_FP8_MAX, FP8_MAX, FP8_MIN_NORMAL_EXP, AMAX_FLOOR,
                                          HW_CAST, FP8_TY)
                tl.store(out_row + j * GS + lanes[None, :], q, mask=tok_ok[:, None])
                _store_scales(s_ptr, tl.reshape(byte, (BLOCK_T, 1)), toks,
                              h * NG + j + tl.arange(0, 1), n_tokens, H * NG, SCALE_MN_ALIGN)
