"""The BF16 chain (``WOA_BACKEND=bf16``): the fallback of the whole ``wo_a`` path.

Inverse RoPE in fp32 rounded to bf16, the exact BF16 dequantized weight (built and cached by the
caller, ``WoAProjection``), bf16 GEMM with fp32 accumulation, bf16 out (``docs/NUMERICS.md``
section 7).

* Where the triton backend runs (CUDA, or its CPU interpreter) and ``o`` is bf16 with packed
  ``[H, Dh]`` dims and a power-of-two rope width, the chain is the Triton backend's
  ``launch.wo_a_bf16``. Its Triton rotation has the bits of the torch rotation. Where
  ``bf16_configs.bf16_gemm_chosen`` says so, its BF16 GEMM (fp32 accumulation) reads A from
  ``o``: at decode sizes in one launch that rotates the rope tiles itself, at prefill sizes after
  the rope tails are rotated into a small buffer. Elsewhere, and with ``overwrite_o``, the
  rotation writes a copy of ``o`` (or ``o`` itself) and torch's bf16 batched GEMM multiplies
  it, accumulating in fp32 except where torch allows reduced-precision split-K reductions
  (``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``, on by default).
* Elsewhere the rotation is pure torch (``torch_ref.inverse_rope``); on CPU the bf16 operands
  are then upcast to fp32 (exact), so the product is an fp32 contraction with one final rounding,
  like ``woa_jax.wo_a_bf16``.

``o`` is never written unless the caller passes ``overwrite_o=True``; then the Triton rotation
works in place (no copy of ``o``) and ``o``'s contents afterwards are unspecified. The Triton
routes sum the same products in different orders: they agree within ``gemm_bf16``, not bit for
bit.
"""

from __future__ import annotations

import torch

from .. import _dispatch
from .._dispatch import Case
from .torch_ref import inverse_rope


def _triton_rotation(o: torch.Tensor, cos_cache: torch.Tensor) -> bool:
    """Whether the Triton in-place rotation can take this call (see the module docstring)."""
    rd = 2 * cos_cache.shape[1]
    if (o.dtype != torch.bfloat16 or rd & (rd - 1) or rd > o.shape[2]
            or o.stride(2) != 1 or o.stride(1) != o.shape[2]):
        return False
    key = (o.device.type, cos_cache.dtype, o.shape[2], rd)
    if key not in _TRITON_ROTATION:
        triton = _dispatch.get_backend("triton")
        case = _dispatch.rope_case(o, cos_cache, None, None, num_groups=None,
                                   amax_floor=None, device_type=o.device.type)
        _TRITON_ROTATION[key] = (triton.is_available()[0]
                                 and triton.supports("inverse_rope_group_quant", case)[0])
    return _TRITON_ROTATION[key]


#: ``_triton_rotation``'s answer per (device type, rope dtype, head_dim, rope_dim).
_TRITON_ROTATION: dict[tuple, bool] = {}


class Bf16Backend:
    """Runs the ``wo_a`` op only (no FP8 ops); always available."""

    name = "bf16"
    ops = frozenset({"wo_a_bf16"})
    eager_ops = frozenset({"wo_a_bf16"})
    rope_in_activation_dtype = False

    def is_available(self) -> tuple[bool, str]:
        return True, "pure torch BF16 chain; runs on any device"

    def cache_clear(self) -> None:
        _TRITON_ROTATION.clear()

    def supports(self, op: str, case: Case) -> tuple[bool, str]:
        if op != "wo_a":
            return False, f"bf16 runs only the whole wo_a chain, not {op}"
        return True, "the BF16 chain runs any validated wo_a call"

    def eager_launcher(self, op: str, o, positions, cos_cache, sin_cache, w_bf16,
                       num_groups: int):
        """Where the Triton rotation runs this call: its direct eager launcher of the chain
        (``triton.chain_eager.eager_wo_a_bf16``: one native call where it binds), else
        ``None``."""
        if op != "wo_a_bf16" or not _triton_rotation(o, cos_cache):
            return None
        from .triton import chain_eager

        return chain_eager.eager_wo_a_bf16(o, positions, cos_cache, sin_cache,
                                           w_bf16.to(torch.bfloat16), num_groups)

    def wo_a_bf16(self, o, positions, cos_cache, sin_cache, w_bf16, num_groups: int, *,
                  overwrite_o: bool = False):
        """``o [S, H, Dh]``, ``w_bf16 [G, N, K]`` -> ``[S, G, N]`` bf16.

        ``w_bf16`` holds bf16 values; on CPU it may already be their fp32 copy (no upcast then).
        ``overwrite_o`` lets the rotation run in place on ``o`` (module docstring).
        """
        if _triton_rotation(o, cos_cache):
            from .triton import launch

            return launch.wo_a_bf16(o, positions, cos_cache, sin_cache,
                                    w_bf16.to(torch.bfloat16), num_groups, overwrite_o=overwrite_o)
        s = o.shape[0]
        x = inverse_rope(o, positions, cos_cache, sin_cache).to(torch.bfloat16)
        x = x.reshape(s, num_groups, -1).transpose(0, 1)  # [G, S, K]
        if x.device.type == "cpu":
            y = torch.bmm(x.to(torch.float32), w_bf16.to(torch.float32).transpose(1, 2))
        else:
            y = torch.bmm(x, w_bf16.transpose(1, 2))
        return y.transpose(0, 1).to(torch.bfloat16)


BACKEND = Bf16Backend()
