"""The BF16 chain (``WOA_BACKEND=bf16``): the fallback of the whole ``wo_a`` path.

Inverse RoPE in fp32 rounded to bf16, the exact BF16 dequantized weight (built and cached by the
caller, ``WoAProjection``), bf16 GEMM with fp32 accumulation, bf16 out (NUMERICS.md section 7).
On CPU the bf16 operands are upcast to fp32 (exact) so the product is an fp32 contraction with one
final rounding, like ``woa_jax.wo_a_bf16``; on GPUs it is torch's BLAS bf16 batched GEMM, which
accumulates in fp32 except where torch allows reduced-precision split-K reductions
(``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``, on by default).
"""

from __future__ import annotations

import torch

from .._dispatch import Case
from .torch_ref import rotate_inverse


class Bf16Backend:
    """Runs the ``wo_a`` op only (no FP8 ops); always available."""

    name = "bf16"

    def is_available(self) -> tuple[bool, str]:
        return True, "pure torch BF16 chain; runs on any device"

    def supports(self, op: str, case: Case) -> tuple[bool, str]:
        if op != "wo_a":
            return False, f"bf16 runs only the whole wo_a chain, not {op}"
        return True, "the BF16 chain runs any validated wo_a call"

    def wo_a_bf16(self, o, positions, cos_cache, sin_cache, w_bf16, num_groups: int):
        """``o [S, H, Dh]``, ``w_bf16 [G, N, K]`` -> ``[S, G, N]`` bf16.

        ``w_bf16`` holds bf16 values; on CPU it may already be their fp32 copy (no upcast then).
        """
        s = o.shape[0]
        x = rotate_inverse(o, positions, cos_cache, sin_cache).to(torch.bfloat16)
        x = x.reshape(s, num_groups, -1).transpose(0, 1)  # [G, S, K]
        if x.device.type == "cpu":
            y = torch.bmm(x.to(torch.float32), w_bf16.to(torch.float32).transpose(1, 2))
        else:
            y = torch.bmm(x, w_bf16.transpose(1, 2))
        return y.transpose(0, 1).to(torch.bfloat16)


BACKEND = Bf16Backend()
