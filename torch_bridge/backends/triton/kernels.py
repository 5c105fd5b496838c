"""Triton kernel bodies of the ``wo_a`` chains (no torch import: JAX launches them too).

Kernels, named after the op they run:

* The quant kernels (inverse RoPE + 1 x GS E8M0 FP8 quantization) are in ``quant_kernels``;
  their rotation and quantization helpers are here, shared with the fused chain.
* ``batched_gemm_a8w8_mxscale_kernel``: block-scaled FP8 batched GEMM, fp32 promotion once per
  scale block along K (docs/NUMERICS.md, the GEMM contract), pointer loads, optional split-K
  reduced in the kernel; ``batched_gemm_a8w8_mxscale_tma_kernel``: the same with
  tensor-descriptor (TMA) tiles, optionally persistent. The Hopper wgmma kernel is in
  ``wgmma_kernels``.
* ``wo_a_fp8_kernel``: the FP8 chain in one launch, each program quantizing the activations of
  its tile before the GEMM's swapped product (decode sizes); its Hopper twin on the wgmma
  GEMM's tile is ``wgmma_kernels.wo_a_fp8_wgmma_kernel``, which calls the rotation and scale
  helpers here.
* ``inverse_rope_kernel``: the BF16 chain's inverse RoPE of the rope tail, in place, into a
  rotated copy, or into a buffer of the rotated tails alone (the A operand's rope tiles of
  ``bf16_kernels.wo_a_bf16_kernel``).

The kernels take array inputs, runtime scalars, outputs (then split-K's scratch), then
constexprs. Torch (``quant``, ``gemm``, ``chain``) and JAX (``jax_launch``) launch these same
bodies.

E8M0 scales travel as uint8 (Triton rejects ``float8_e8m0fnu`` arguments) and are decoded here
by placing the byte in the fp32 exponent field.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _e8m0_to_f32(byte):
    """uint8 E8M0 byte -> fp32 ``2**(b - 127)`` (0 -> +0.0, 255 -> +inf; real data never there)."""
    return (byte.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _scaled_block_mma(acc, a, b, a_s, b_s, SWAP_AB: tl.constexpr):
    """``acc + (a @ b^T) * a_s b_s^T`` for one scale block of K, promoted to fp32 here.

    ``a [BM, SB]`` activations with row scales ``a_s [BM]``, ``b [BN, SB]`` weights with
    ``b_s [BN]``; with ``SWAP_AB`` the accumulator is the transposed ``[BN, BM]`` tile.
    """
    if SWAP_AB:
        acc += tl.dot(b, tl.trans(a)) * b_s[:, None] * a_s[None, :]
    else:
        acc += tl.dot(a, tl.trans(b)) * a_s[:, None] * b_s[None, :]
    return acc


@triton.jit
def _round_fp8_rne(v, MIN_NORMAL_EXP: tl.constexpr):
    """fp32 ``v`` rounded to nearest-even on the e4m3 grid (3 mantissa bits), still fp32.

    Adding and subtracting ``C = 2**(E + 20)`` rounds ``|v|`` (exponent ``E``, floored at the
    format's smallest normal exponent) to a multiple of its e4m3 ulp ``2**(E - 3)`` with fp32 RNE.
    The final cast is then exact, so the bytes do not depend on how the target (or Triton's CPU
    interpreter, which rounds ties away) converts fp32 to fp8.
    """
    bits = v.to(tl.uint32, bitcast=True)
    mag = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF).to(tl.int32) - 127, MIN_NORMAL_EXP)
    c = ((e + 20 + 127) << 23).to(tl.float32, bitcast=True)
    r = (mag + c) - c
    return (r.to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)


@triton.jit
def _round_bf16_rne(x):
    """fp32 ``x`` rounded to nearest-even bf16, still fp32 (the cast after it is exact)."""
    u = x.to(tl.uint32, bitcast=True)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return tl.where(x == x, r, x)


@triton.jit
def _product(a, b, ROUND_PRODUCTS: tl.constexpr):
    """fp32 ``a * b``; with ``ROUND_PRODUCTS`` (``configs.round_products``) an instruction that
    rounds the product itself, which no compiler pass fuses into an FMA with the sum after it.

    PTX's ``mul.rn`` is never contracted (an explicit rounding mode), and inline assembly is
    opaque to LLVM; ``v_mul_f32`` is AMDGCN's fp32 multiply.
    """
    if ROUND_PRODUCTS == 1:
        p = tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b],
                                      dtype=tl.float32, is_pure=True, pack=1)
    elif ROUND_PRODUCTS == 2:
        p = tl.inline_asm_elementwise("v_mul_f32 $0, $1, $2", "=v,v,v", [a, b],
                                      dtype=tl.float32, is_pure=True, pack=1)
    else:
        p = a * b
    return p


@triton.jit
def _rotate(a, b, c, s, ROUND_PRODUCTS: tl.constexpr):
    """``(a c + b s, b c - a s)`` in fp32, each product rounded before the sum where
    ``ROUND_PRODUCTS`` asks (the oracle's arithmetic: docs/NUMERICS.md, inverse RoPE)."""
    return (_product(a, c, ROUND_PRODUCTS) + _product(b, s, ROUND_PRODUCTS),
            _product(b, c, ROUND_PRODUCTS) - _product(a, s, ROUND_PRODUCTS))


@triton.jit
def _rotated_bf16(x, c, s, ROWS: tl.constexpr, WIDTH: tl.constexpr,
                  ROUND_PRODUCTS: tl.constexpr):
    """The BF16 chain's rotation of ``x [ROWS, WIDTH]``, all rope lanes (GPT-J pairs), by
    -theta: fp32 math, rounded to nearest-even in ``x``'s dtype (bf16). ``c``, ``s``:
    ``[ROWS, WIDTH / 2]``."""
    a, b = tl.split(tl.reshape(x.to(tl.float32), (ROWS, WIDTH // 2, 2)))
    v = tl.reshape(tl.join(*_rotate(a, b, c, s, ROUND_PRODUCTS)), (ROWS, WIDTH))
    return _round_bf16_rne(v).to(x.dtype)


@triton.jit
def _inverse_rope_pairs(x, c, s, is_rope, ROWS: tl.constexpr, GS: tl.constexpr,
                        ROUND_PRODUCTS: tl.constexpr):
    """Rotate the GPT-J pairs of ``x [ROWS, GS]`` (fp32) by -theta where ``is_rope``.

    ``c``, ``s`` and ``is_rope`` broadcast to ``[ROWS, GS / 2]``.
    """
    a, b = tl.split(tl.reshape(x, (ROWS, GS // 2, 2)))
    a1, b1 = _rotate(a, b, c, s, ROUND_PRODUCTS)
    a2 = tl.where(is_rope, a1, a)
    b2 = tl.where(is_rope, b1, b)
    return tl.reshape(tl.join(a2, b2), (ROWS, GS))


@triton.jit
def _rope_cos_sin(lane, row_ok, pos, cos_ptr, sin_ptr, stride_cp, stride_sp,
                  ROPE_FROM: tl.constexpr):
    """``(cos, sin, is_rope)`` of the GPT-J pairs whose even lanes sit at head offsets
    ``lane [ROWS, GS / 2]``: pairs from ``ROPE_FROM`` on rotate, in rows ``row_ok`` (cos/sin
    rows ``pos``); the others get (1, 0), and ``is_rope`` False."""
    is_rope = (lane >= ROPE_FROM) & row_ok[:, None]
    col = (lane - ROPE_FROM) // 2
    c = tl.load(cos_ptr + pos[:, None] * stride_cp + col, mask=is_rope, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + pos[:, None] * stride_sp + col, mask=is_rope, other=0.0).to(tl.float32)
    return c, s, is_rope


@triton.jit
def _dependent_start(PDL: tl.constexpr, LET_NEXT_START: tl.constexpr):
    """Under programmatic dependent launch (Hopper on) a kernel may start while the one before
    it on the stream still runs: wait until that kernel has finished and its writes are
    visible, before any load. ``LET_NEXT_START``: let the next kernel launch now (it waits in
    turn); only for kernels of one wave, as the next kernel's waiting programs would take the
    SMs a later wave needs."""
    if PDL:
        if LET_NEXT_START:
            gdc_launch_dependents()
        gdc_wait()


@triton.jit
def _abs_max(v):
    """Row amax of ``v [R, L]`` with fmaxf semantics: a NaN lane is ignored."""
    return tl.max(tl.where(v == v, tl.abs(v), 0.0), axis=1)


@triton.jit
def _e8m0_scale(amax, INV_FP8_MAX: tl.constexpr, AMAX_FLOOR: tl.constexpr):
    """A group's E8M0 byte (int32) from its amax, AITER's round-up rule, and the exact fp32
    reciprocal of its scale, ``2**(127 - byte)`` (NaN for byte 255, an inf lane)."""
    amax = tl.maximum(amax, AMAX_FLOOR)
    u = (amax * INV_FP8_MAX).to(tl.uint32, bitcast=True)
    exp = (u >> 23) & 0xFF
    bump = (exp < 0xFF) & ((u & 0x7FFFFF) != 0)
    byte = (exp + bump.to(tl.uint32)).to(tl.int32)
    inv = (tl.minimum(tl.maximum(254 - byte, 1), 254) << 23).to(tl.float32, bitcast=True)
    return byte, tl.where(byte == 0xFF, float("nan"), inv)


@triton.jit
def _to_fp8(v, inv, FP8_MAX: tl.constexpr, FP8_MIN_NORMAL_EXP: tl.constexpr,
            HW_CAST: tl.constexpr, FP8_TY: tl.constexpr):
    """fp32 ``v`` times its group's ``inv`` (``_e8m0_scale``, broadcast), cast to fp8."""
    q = v * inv
    # The clamp never binds for finite groups; NaN (an inf/NaN lane) must survive it as NaN.
    q = tl.minimum(tl.maximum(q, -FP8_MAX, propagate_nan=tl.PropagateNan.ALL), FP8_MAX,
                   propagate_nan=tl.PropagateNan.ALL)
    if not HW_CAST:  # the interpreter and non-RNE targets: round on the fp32 side first
        q = _round_fp8_rne(q, FP8_MIN_NORMAL_EXP)
    return q.to(FP8_TY)


@triton.jit
def _quantize_group(v, INV_FP8_MAX: tl.constexpr, FP8_MAX: tl.constexpr,
                    FP8_MIN_NORMAL_EXP: tl.constexpr, AMAX_FLOOR: tl.constexpr,
                    HW_CAST: tl.constexpr, FP8_TY: tl.constexpr):
    """fp32 groups ``v [R, GS]`` -> (fp8 ``[R, GS]``, E8M0 bytes ``[R]`` int32), AITER's rule."""
    byte, inv = _e8m0_scale(_abs_max(v), INV_FP8_MAX, AMAX_FLOOR)
    return _to_fp8(v, inv[:, None], FP8_MAX, FP8_MIN_NORMAL_EXP, HW_CAST, FP8_TY), byte


@triton.jit
def batched_gemm_a8w8_mxscale_tma_kernel(
    x_desc, w_desc, y_desc, xs_ptr, ws_ptr, M, num_programs,
    SXSM: tl.constexpr, SXSG: tl.constexpr,  # x_scale [M, G, K/SB] strides (last contiguous)
    SWSG: tl.constexpr, SWSN: tl.constexpr,  # w_scale [G, N/SB, K/SB] strides
    G: tl.constexpr, N: tl.constexpr, K: tl.constexpr, SB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    """``batched_gemm_a8w8_mxscale_kernel``'s math with tensor-descriptor (TMA) tiles, optionally
    persistent.

    ``x_desc`` views x as ``[M, G*K]``, ``w_desc`` w as ``[G*N, K]`` and ``y_desc`` y as
    ``[M, G*N]`` (N % BLOCK_N == 0, so a tile never straddles two groups). The copy engine
    fetches the tiles (no per-thread address arithmetic; rows past M read as zeros and are
    clipped on store). ``num_programs`` programs walk the tiles group by group, M tile by M
    tile, N tiles fastest, so each group's weight and the current activations stay in L2.
    """
    BLOCK_K: tl.constexpr = SB
    KB: tl.constexpr = K // SB
    NUM_N: tl.constexpr = N // BLOCK_N
    tiles_per_group = tl.cdiv(M, BLOCK_M) * NUM_N
    n_tiles = tiles_per_group * G
    for tile in range(tl.program_id(0), n_tiles, num_programs):
        g = tile // tiles_per_group
        r = tile % tiles_per_group
        m0 = (r // NUM_N) * BLOCK_M
        n0 = (r % NUM_N) * BLOCK_N
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m_ok = offs_m < M
        offs_n = n0 + tl.arange(0, BLOCK_N)
        xs_rows = xs_ptr + g.to(tl.int64) * SXSG + offs_m.to(tl.int64) * SXSM
        ws_rows = ws_ptr + g.to(tl.int64) * SWSG + (offs_n // SB) * SWSN
        if SWAP_AB:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(KB):
            a = x_desc.load([m0, g * K + kb * BLOCK_K])
            b = w_desc.load([g * N + n0, kb * BLOCK_K])
            a_s = _e8m0_to_f32(tl.load(xs_rows + kb, mask=m_ok, other=127))
            b_s = _e8m0_to_f32(tl.load(ws_rows + kb))
            acc = _scaled_block_mma(acc, a, b, a_s, b_s, SWAP_AB)
        if SWAP_AB:
            out = tl.trans(acc)
        else:
            out = acc
        if OUT_BF16:
            y_desc.store([m0, g * N + n0], _round_bf16_rne(out).to(tl.bfloat16))
        else:
            y_desc.store([m0, g * N + n0], out)


@triton.jit
def batched_gemm_a8w8_mxscale_kernel(
    x_ptr, w_ptr, xs_ptr, ws_ptr, M,
    y_ptr,
    part_ptr, count_ptr,  # SPLIT_K > 1 only: fp32 parts [SPLIT_K, M, G, N], int32 counters
    SXM: tl.constexpr, SXG: tl.constexpr,  # x [M, G, K] strides (K contiguous)
    SXSM: tl.constexpr, SXSG: tl.constexpr,  # x_scale [M, G, K/SB] strides (last contiguous)
    SWG: tl.constexpr, SWN: tl.constexpr,  # w [G, N, K] strides
    SWSG: tl.constexpr, SWSN: tl.constexpr,  # w_scale [G, ceil(N/SB), K/SB] strides
    SYM: tl.constexpr, SYG: tl.constexpr,  # y [M, G, N] strides (N contiguous)
    N: tl.constexpr, K: tl.constexpr, SB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
    SWAP_AB: tl.constexpr, OUT_BF16: tl.constexpr,
    PDL: tl.constexpr = False,  # launched as a programmatic dependent launch (_dependent_start)
):
    """``y[m, g, n] = sum_kb xs[m,g,kb] * ws[g,n/SB,kb] * sum_{k in kb} x[m,g,k] w[g,n,k]``.

    Grid ``(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), G, SPLIT_K)``; N tiles vary fastest so one
    M tile's activations are read once while the group's weight stays in L2. BLOCK_K equals the
    scale block SB, so each ``tl.dot`` covers one scale block and is promoted to fp32 with both
    scales applied (Hopper's reduced-precision fp8 accumulation stays inside one block).
    ``SWAP_AB`` computes the transposed tile ``w x^T`` so that small M becomes the MMA's N side
    (wgmma needs >= 64 rows on the M side). ``SPLIT_K > 1`` splits K over programs and
    reduces the parts in the kernel, in K order (see ``_gemm_tile``).
    """
    NUM_N: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    _dependent_start(PDL, False)
    pid = tl.program_id(0)
    _gemm_tile(x_ptr, w_ptr, xs_ptr, ws_ptr, M, y_ptr, part_ptr, count_ptr, pid // NUM_N,
              pid % NUM_N, tl.program_id(1).to(tl.int64), tl.program_id(2), SXM, SXG, SXSM,
              SXSG, SWG, SWN, SWSG, SWSN, SYM, SYG, N, K, SB, BLOCK_M, BLOCK_N, SPLIT_K, SWAP_AB,
              OUT_BF16)


@triton.jit
def _gemm_tile(x_ptr, w_ptr, xs_ptr, ws_ptr, M, y_ptr, part_ptr, count_ptr, pid_m, pid_n, g, pid_k,
              SXM: tl.constexpr, SXG: tl.constexpr, SXSM: tl.constexpr, SXSG: tl.constexpr,
              SWG: tl.constexpr, SWN: tl.constexpr, SWSG: tl.constexpr, SWSN: tl.constexpr,
              SYM: tl.constexpr, SYG: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
              SB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              SPLIT_K: tl.constexpr, SWAP_AB: tl.constexpr, OUT_BF16: tl.constexpr):
    """One output tile (M tile ``pid_m``, N tile ``pid_n``, group ``g``, K part ``pid_k``) of
    ``batched_gemm_a8w8_mxscale_kernel``: the pipelined K loop, promotion per scale block, the
    store (``_split_k_store``)."""
    BLOCK_K: tl.constexpr = SB
    KB: tl.constexpr = K // SB
    offs_m = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    x_rows = x_ptr + g * SXG + offs_m[:, None] * SXM + offs_k[None, :]
    w_rows = w_ptr + g * SWG + offs_n[:, None].to(tl.int64) * SWN + offs_k[None, :]
    xs_rows = xs_ptr + g * SXSG + offs_m * SXSM
    ws_rows = ws_ptr + g * SWSG + (offs_n // SB) * SWSN
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    KB_PER: tl.constexpr = KB // SPLIT_K
    for i in range(KB_PER):
        kb = pid_k * KB_PER + i
        a = tl.load(x_rows + kb * BLOCK_K, mask=m_ok[:, None], other=0.0)
        b = tl.load(w_rows + kb * BLOCK_K, mask=n_ok[:, None], other=0.0)
        a_s = _e8m0_to_f32(tl.load(xs_rows + kb, mask=m_ok, other=127))
        b_s = _e8m0_to_f32(tl.load(ws_rows + kb, mask=n_ok, other=127))
        acc = _scaled_block_mma(acc, a, b, a_s, b_s, SWAP_AB)
    if SWAP_AB:
        acc = tl.trans(acc)
    tile = pid_m * ((N + BLOCK_N - 1) // BLOCK_N) + pid_n
    _split_k_store(acc, y_ptr, part_ptr, count_ptr, offs_m, offs_n, g,
                   m_ok[:, None] & n_ok[None, :], M, pid_k, tile, SYM, SYG, N, SPLIT_K, OUT_BF16)


@triton.jit
def _split_k_store(out, y_ptr, part_ptr, count_ptr, offs_m, offs_n, g, ok, M, pid_k, tile,
                   SYM: tl.constexpr, SYG: tl.constexpr, N: tl.constexpr,
                   SPLIT_K: tl.constexpr, OUT_BF16: tl.constexpr):
    """Store K part ``pid_k`` of output tile ``tile`` of group ``g`` (grid axis 1 is G). With
    ``SPLIT_K > 1`` (serial split-K) each K part parks its fp32 tile in ``part [SPLIT_K, M, G,
    N]`` and takes a ticket from the tile's counter in ``count_ptr``; the part that arrives last
    adds the parts in K order (so the bits never depend on arrival order), writes ``y`` and
    sets the counter back to 0 for the next launch. Counters must start at 0."""
    if SPLIT_K > 1:
        G = tl.num_programs(1)
        part_off = (offs_m[:, None] * G + g) * N + offs_n[None, :]
        part_stride = G.to(tl.int64) * M * N  # M may arrive as a constexpr 1
        tl.store(part_ptr + pid_k * part_stride + part_off, out, mask=ok)
        tl.debug_barrier()  # every thread's part is written before the ticket releases it
        counter = count_ptr + tile * G + g
        ticket = tl.atomic_add(counter, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:
            out = tl.load(part_ptr + part_off, mask=ok, other=0.0, cache_modifier=".cg")
            for k_part in tl.static_range(1, SPLIT_K):
                out += tl.load(part_ptr + k_part * part_stride + part_off, mask=ok, other=0.0,
                               cache_modifier=".cg")
            tl.store(counter, 0)
            _store_tile(y_ptr, out, offs_m, offs_n, g, ok, SYM, SYG, OUT_BF16)
    else:
        _store_tile(y_ptr, out, offs_m, offs_n, g, ok, SYM, SYG, OUT_BF16)


@triton.jit
def _store_tile(y_ptr, out, offs_m, offs_n, g, ok, SYM: tl.constexpr, SYG: tl.constexpr,
                OUT_BF16: tl.constexpr):
    """Write one fp32 output tile to ``y``, rounded to nearest-even for a bf16 ``y``."""
    if OUT_BF16:
        out = _round_bf16_rne(out)
    tl.store(y_ptr + g * SYG + offs_m[:, None] * SYM + offs_n[None, :],
             out.to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def wo_a_fp8_kernel(
    o_ptr, pos_ptr, cos_ptr, sin_ptr, w_ptr, ws_ptr, M, n_pos_rows,
    x_ptr, xs_ptr, y_ptr,  # outputs: the quantized activations (scratch) and y
    part_ptr, count_ptr,  # SPLIT_K > 1 only (see batched_gemm_a8w8_mxscale_kernel)
    SOM: tl.constexpr,  # o [S, H, Dh] token stride; group g's K lanes start at g * K
    SCP: tl.constexpr, SSP: tl.constexpr,  # cos/sin row strides
    SWG: tl.constexpr, SWN: tl.constexpr,  # w [G, N, K] strides
    SWSG: tl.constexpr, SWSN: tl.constexpr,  # w_scale [G, ceil(N/SB), K/SB] strides
    SYM: tl.constexpr, SYG: tl.constexpr,  # y [M, G, N] strides (N contiguous)
    G: tl.constexpr, N: tl.constexpr, K: tl.constexpr, SB: tl.constexpr, DH: tl.constexpr,
    RD: tl.constexpr, INV_FP8_MAX: tl.constexpr, FP8_MAX: tl.constexpr,
    FP8_MIN_NORMAL_EXP: tl.constexpr, AMAX_FLOOR: tl.constexpr, HW_CAST: tl.constexpr,
    ROUND_PRODUCTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr, OUT_BF16: tl.constexpr, QUANT_ROWS: tl.constexpr,
):
    """The decode chain in one launch: each program first quantizes the activations its tile
    reads, then runs ``batched_gemm_a8w8_mxscale_kernel``'s swapped tile on them.

    Prologue: inverse RoPE + 1 x SB E8M0 quant (the quant group is the scale block) of the
    program's tokens and K blocks of ``o``, ``QUANT_ROWS`` (token, K block) rows at a time,
    written to ``x_fp8 [M, G, K]`` / ``x_scale [M, G, K/SB]`` (contiguous). The programs of the
    other N tiles of the same group write the same bytes there; a program reads back only
    lanes it wrote itself, after a block barrier. So the one launch gives the two-kernel
    chain's bits, without the second launch and the gap between the two.
    """
    KB: tl.constexpr = K // SB
    KB_PER: tl.constexpr = KB // SPLIT_K
    NUM_N: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    ROPE_FROM: tl.constexpr = DH - RD
    FP8_TY: tl.constexpr = x_ptr.dtype.element_ty
    pid = tl.program_id(0)
    pid_m = pid // NUM_N
    g = tl.program_id(1).to(tl.int64)
    pid_k = tl.program_id(2)
    m0 = pid_m.to(tl.int64) * BLOCK_M
    n_rows = tl.minimum(BLOCK_M, M - m0) * KB_PER  # (token, K block) rows of this tile
    lanes = tl.arange(0, SB)
    pairs = tl.arange(0, SB // 2)
    for r0 in range(0, n_rows, QUANT_ROWS):
        r = r0 + tl.arange(0, QUANT_ROWS)
        row_ok = r < n_rows
        tok = m0 + r // KB_PER
        kb = pid_k * KB_PER + r % KB_PER
        x = tl.load(o_ptr + tok[:, None] * SOM + g * K + kb[:, None] * SB + lanes[None, :],
                    mask=row_ok[:, None], other=0.0).to(tl.float32)
        pos = tl.load(pos_ptr + tok, mask=row_ok, other=0).to(tl.int64)
        pos = tl.minimum(tl.maximum(pos, 0), n_pos_rows - 1)  # AITER's clamp
        # Head offset of each even lane (a group may start inside a head when G > H).
        lane = (g * K + kb[:, None] * SB) % DH + 2 * pairs[None, :]
        c, s, is_rope = _rope_cos_sin(lane, row_ok, pos, cos_ptr, sin_ptr, SCP, SSP, ROPE_FROM)
        x = _inverse_rope_pairs(x, c, s, is_rope, QUANT_ROWS, SB, ROUND_PRODUCTS)
        q, byte = _quantize_group(x, INV_FP8_MAX, FP8_MAX, FP8_MIN_NORMAL_EXP, AMAX_FLOOR,
                                  HW_CAST, FP8_TY)
        tl.store(x_ptr + tok[:, None] * (G * K) + g * K + kb[:, None] * SB + lanes[None, :], q,
                 mask=row_ok[:, None])
        tl.store(xs_ptr + tok * (G * KB) + g * KB + kb, byte.to(tl.uint8), mask=row_ok)
    tl.debug_barrier()  # this block's x writes are visible to all its threads
    _gemm_tile(x_ptr, w_ptr, xs_ptr, ws_ptr, M, y_ptr, part_ptr, count_ptr, pid_m, pid % NUM_N,
              g, pid_k, G * K, K, G * KB, KB, SWG, SWN, SWSG, SWSN, SYM, SYG, N, K, SB, BLOCK_M,
              BLOCK_N, SPLIT_K, True, OUT_BF16)


@triton.jit
def inverse_rope_kernel(
    o_ptr, pos_ptr, cos_ptr, sin_ptr, n_rows, n_pos_rows, stride_os, stride_oh, stride_cp,
    stride_sp, y_ptr, stride_ys, stride_yh,
    H: tl.constexpr, DH: tl.constexpr, RD: tl.constexpr, BLOCK_R: tl.constexpr,
    COPY_NOPE: tl.constexpr, ROUND_PRODUCTS: tl.constexpr, TAIL_ONLY: tl.constexpr,
):
    """Rotate the last RD lanes of each of ``BLOCK_R`` (token, head) rows of ``o`` by -theta
    into ``y``; with ``COPY_NOPE`` the other lanes are copied too (``y`` a rotated copy of
    ``o``), else ``y`` is ``o`` and they are not touched (in place). With ``TAIL_ONLY`` ``y``
    is ``[S, H, RD]``: the rotated tails alone, nothing else written.

    fp32 math, result rounded (RNE) to bf16 (the BF16 chain). The tail's code is the same in
    every mode, so they give the same bits.
    """
    HALF: tl.constexpr = RD // 2
    ROPE_FROM: tl.constexpr = DH - RD
    pid = tl.program_id(0)
    rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    tok = rows // H
    head = rows % H
    lanes = tl.arange(0, RD)
    in_row = o_ptr + tok[:, None] * stride_os + head[:, None] * stride_oh + lanes[None, :]
    out_row = y_ptr + tok[:, None] * stride_ys + head[:, None] * stride_yh + lanes[None, :]
    x = tl.load(in_row + ROPE_FROM, mask=row_ok[:, None], other=0.0)
    pos = tl.load(pos_ptr + tok, mask=row_ok, other=0).to(tl.int64)
    pos = tl.minimum(tl.maximum(pos, 0), n_pos_rows - 1)
    cols = tl.arange(0, HALF)
    c = tl.load(cos_ptr + pos[:, None] * stride_cp + cols[None, :], mask=row_ok[:, None],
                other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + pos[:, None] * stride_sp + cols[None, :], mask=row_ok[:, None],
                other=0.0).to(tl.float32)
    if COPY_NOPE:
        # After the tail's loads, and in one load where Dh is a tile: chunked load/store pairs
        # may alias, so they would run one after another (latency-bound at decode sizes).
        if (DH & (DH - 1)) == 0:
            row = tl.arange(0, DH)
            ok = row_ok[:, None] & (row[None, :] < ROPE_FROM)
            src = o_ptr + tok[:, None] * stride_os + head[:, None] * stride_oh + row[None, :]
            dst = y_ptr + tok[:, None] * stride_ys + head[:, None] * stride_yh + row[None, :]
            tl.store(dst, tl.load(src, mask=ok), mask=ok)
        else:
            for c0 in tl.static_range(0, ROPE_FROM, RD):
                ok = row_ok[:, None] & (c0 + lanes[None, :] < ROPE_FROM)
                tl.store(out_row + c0, tl.load(in_row + c0, mask=ok), mask=ok)
    if not TAIL_ONLY:
        out_row += ROPE_FROM
    tl.store(out_row, _rotated_bf16(x, c, s, BLOCK_R, RD, ROUND_PRODUCTS), mask=row_ok[:, None])
