"""``read_weight``: the FP8 weight read once and nothing else, the decode GEMM's memory floor.

At decode sizes the GEMM's time is its weight read: a kernel that only reads the same bytes, in
the same CUDA graph timing, shows how far the GEMM and the chain sit above what moving the
weight costs.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: int32 words (16 KiB) a program reads: 512 programs of 8 warps at G = 2, the fastest grid
#: of plain reads of that weight on the H200.
SLICE_WORDS = 4096
NUM_WARPS = 8


@triton.jit
def read_kernel(words_ptr, sums_ptr, n_words, SLICE: tl.constexpr):
    """Sum one ``SLICE``-word slice of ``words`` per program, in int64: exact, so no check
    relies on how an int32 sum wraps (Triton's interpreter before 3.9 raises instead)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * SLICE + tl.arange(0, SLICE)
    words = tl.load(words_ptr + offs, mask=offs < n_words, other=0)
    tl.store(sums_ptr + pid, tl.sum(words.to(tl.int64), 0))


def read_weight(sets, on_gpu):
    """One call per set reads its weight ``w [G, N, K]`` (fp8, contiguous) as int32 words; the
    check compares each program's sum with torch's of the same slice."""
    import torch

    def prepare(p):
        words = p.w.view(torch.int32).view(-1)
        programs = triton.cdiv(words.numel(), SLICE_WORDS)
        return words, torch.empty(programs, dtype=torch.int64, device=words.device)

    def read(words, sums):
        read_kernel[(sums.numel(),)](words, sums, words.numel(), SLICE=SLICE_WORDS,
                                     num_warps=NUM_WARPS)
        return sums

    prepared = [prepare(p) for p in sets]
    words, sums = prepared[0]
    got = read(words, sums)
    padded = torch.zeros(sums.numel() * SLICE_WORDS, dtype=torch.int64, device=words.device)
    padded[:words.numel()] = words.to(torch.int64)
    want = padded.view(-1, SLICE_WORDS).sum(1)
    if not torch.equal(got, want):
        raise AssertionError("read_weight: a program's sum differs from torch's")
    return [(lambda a=a: read(*a)) for a in prepared], "sums exact"
