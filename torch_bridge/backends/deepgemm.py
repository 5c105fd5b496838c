"""The DeepGEMM backend (``WOA_BACKEND=deepgemm``): the block-scaled FP8 GEMM on DeepGEMM's
sm_90 kernels (``deep_gemm.fp8_einsum``), the quant on the Triton backend's kernel.

DeepGEMM is not a dependency: the backend is available where ``deep_gemm`` imports (vLLM and
sglang installs on Hopper carry it), on an sm_90 GPU, with the Triton backend available. It
runs only when named: ``backend="auto"`` does not take it.

Numerics: DeepGEMM's sm_90 recipe ``(1, 128, 128)`` multiplies 1 x 128 activation and
128 x 128 weight blocks and accumulates in fp32, as ``batched_gemm_a8w8_mxscale`` does; it reads
its scales as fp32 values, which hold every E8M0 power of two exactly. So the activation scales
go to it as fp32 in its token-major layout: the FP8 chain's quant writes them so
(``SCALE_MN_ALIGN``), and the GEMM op converts its E8M0 bytes on each call. The weight's fp32
scales are decoded once per weight scale tensor (``weight_scales``).
"""

from __future__ import annotations

import functools
import threading

from .. import _capability, _dispatch
from .._capability import interpreter_on
from .._dispatch import Case

#: DeepGEMM's sm_90 scaling recipe: 1 x 128 activation groups, 128 x 128 weight blocks.
RECIPE = (1, 128, 128)
#: The einsum of ``x [M, G, K]`` and ``w [G, N, K]`` into ``y [M, G, N]``.
EINSUM = "bhr,hdr->bhd"
#: The ``deep_gemm`` attributes the backend calls.
NEEDED = ("fp8_einsum", "get_tma_aligned_size")


@functools.cache
def deep_gemm():
    """The ``deep_gemm`` module, or the reason it does not import (a string)."""
    try:
        import deep_gemm as dg
    except Exception as e:  # noqa: BLE001 - its import runs CUDA discovery: any failure counts
        return f"deep_gemm does not import ({type(e).__name__}: {e})"
    missing = [name for name in NEEDED if not hasattr(dg, name)]
    if missing:
        return f"deep_gemm {getattr(dg, '__version__', '?')} lacks {', '.join(missing)}"
    return dg


@functools.cache
def scale_align() -> int:
    """Tokens per padded column of the token-major fp32 scales (DeepGEMM's TMA alignment)."""
    return int(deep_gemm().get_tma_aligned_size(1, 4))


class _WeightScales:
    """fp32 weight scales, decoded once per E8M0 scale tensor.

    Keyed by the bytes' device, address, shape and strides (callers pass fresh views of one
    layer's scales) and checked against their version, so an in-place update is decoded again.
    Each entry holds its source tensor, so no other tensor can take that address while the
    entry stands. Up to ``LIMIT`` entries (a weight scale tensor is a few KiB); past that,
    calls decode for themselves rather than evict a decode a captured graph may read. Thread
    safe. A decode made under CUDA-graph capture is used for that call only (it runs at each
    replay): kept, it would hand later eager calls memory of the graph's pool.
    """

    LIMIT = 4096

    def __init__(self):
        self._lock = threading.Lock()
        self._made: dict[tuple, tuple[object, int, object]] = {}

    def __call__(self, w_scale):
        import torch

        from ..ops import ready_everywhere
        from .torch_ref import e8m0_decode

        key = (w_scale.device, w_scale.data_ptr(), tuple(w_scale.shape),
               tuple(w_scale.stride()))
        with self._lock:
            hit = self._made.get(key)
        if hit is not None and hit[1] == w_scale._version:
            return hit[2]
        decoded = _row_major(e8m0_decode(w_scale.view(torch.uint8)))
        if w_scale.is_cuda and torch.cuda.is_current_stream_capturing():
            return decoded
        decoded = ready_everywhere(decoded, "the deepgemm backend")
        with self._lock:
            if key in self._made or len(self._made) < self.LIMIT:
                self._made[key] = (w_scale, w_scale._version, decoded)
        return decoded

    def clear(self) -> None:
        with self._lock:
            self._made.clear()


weight_scales = _WeightScales()


def activation_scales(x_scale):
    """E8M0 ``[M, G, Ks]`` bytes as DeepGEMM's fp32 token-major scales, the layout the FP8
    chain's quant writes itself (``token_major_scales``), decoded in place: two small kernels
    per call."""
    import torch

    from .torch_ref import e8m0_decode
    from .triton.quant import token_major_scales

    scales = token_major_scales(tuple(x_scale.shape), scale_align(), x_scale.device)
    return e8m0_decode(x_scale.view(torch.uint8), out=scales)


class _DeepGemmBackend:
    name = "deepgemm"
    ops = frozenset({"inverse_rope_group_quant", "batched_gemm_a8w8_mxscale", "wo_a_fp8"})
    eager_ops: frozenset[str] = frozenset()
    #: The quant is the Triton backend's: cos/sin in any float dtype.
    rope_in_activation_dtype = False

    @functools.cache  # noqa: B019 - one module-level instance; cache_clear() resets it
    def is_available(self) -> tuple[bool, str]:
        if interpreter_on():
            return False, "DeepGEMM runs on sm_90 GPUs, not under TRITON_INTERPRET=1"
        arch = _capability.gpu_arch()
        if arch != "sm_90":
            return False, (f"DeepGEMM's fp32-scale recipe {RECIPE} runs on sm_90 here, got "
                           f"{arch or 'no GPU (torch.cuda.is_available() is False)'}")
        ok, why = _dispatch.get_backend("triton").is_available()
        if not ok:
            return False, f"its quant runs on the triton backend, which is unavailable: {why}"
        dg = deep_gemm()
        if isinstance(dg, str):
            return False, dg
        return True, f"DeepGEMM {getattr(dg, '__version__', '?')} on {arch}"

    def cache_clear(self) -> None:
        self.is_available.cache_clear()
        deep_gemm.cache_clear()
        scale_align.cache_clear()
        weight_scales.clear()

    def supports(self, op: str, case: Case) -> tuple[bool, str]:
        if case.device_type != "cuda":
            return False, f"tensors are on {case.device_type}; DeepGEMM runs on cuda"
        if case.fp8_dtype not in (None, "float8_e4m3fn"):
            return False, f"fp8 dtype {case.fp8_dtype}: DeepGEMM takes float8_e4m3fn"
        if op == "inverse_rope_group_quant":
            return _dispatch.get_backend("triton").supports(op, case)
        if op != "batched_gemm_a8w8_mxscale":
            return False, f"the deepgemm backend does not implement {op}"
        if case.quant_group_size not in (None, RECIPE[1]):
            return False, (f"scale block {case.quant_group_size}: DeepGEMM's recipe takes "
                           f"{RECIPE[1]}")
        if case.out_dtype not in (None, "bfloat16"):
            return False, f"output dtype {case.out_dtype}: DeepGEMM's einsum writes bf16"
        n = case.get("n")
        if n is not None and n % RECIPE[1]:
            return False, f"N = {n} is not a multiple of the weight block {RECIPE[1]}"
        if case.head_dim is not None and case.head_dim % RECIPE[1]:
            return False, (f"head_dim {case.head_dim}: the quant writes DeepGEMM's scales per "
                           f"head, so {RECIPE[1]} must divide it")
        return True, "ok"

    def inverse_rope_group_quant(self, *args, **kwargs):
        """The Triton backend's quant (row-layout E8M0 bytes, the op's contract)."""
        return _dispatch.get_backend("triton").inverse_rope_group_quant(*args, **kwargs)

    def batched_gemm_a8w8_mxscale(self, x, w, x_scale, w_scale, *, dtype=None, out=None):
        """``y [M, G, N] = x [M, G, K] . w [G, N, K]^T`` by ``deep_gemm.fp8_einsum``."""
        _check_bf16(dtype)
        return _einsum(x, activation_scales(x_scale), w, w_scale, out)

    def wo_a_fp8(self, o, positions, cos_cache, sin_cache, w, w_scale, num_groups: int, *,
                 amax_floor: float, dtype=None, out=None):
        """The FP8 chain: the Triton quant, writing DeepGEMM's fp32 token-major activation
        scales, then ``deep_gemm.fp8_einsum``: two launches, nothing between them."""
        import torch

        from .triton.launch import inverse_rope_group_quant

        _check_bf16(dtype)
        s, h, dh = o.shape
        x = torch.empty((s, num_groups, h * dh // num_groups), dtype=w.dtype, device=o.device)
        x, xs = inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups,
                                         RECIPE[1], amax_floor=amax_floor, x_fp8=x,
                                         scale_mn_align=scale_align())
        return _einsum(x, xs, w, w_scale, out)


def _check_bf16(dtype) -> None:
    import torch

    if dtype not in (None, torch.bfloat16):
        raise _dispatch.BackendUnavailableError(
            f"backend 'deepgemm' cannot write {dtype}: DeepGEMM's einsum writes bf16")


def _row_major(t):
    """``t`` with row-major strides, copied where they differ. ``contiguous()`` leaves the
    stride of a size-1 dim as it is, and DeepGEMM reads every dim's stride: its TMA
    descriptors need 16-byte multiples, its weight-scale check the dense batch stride."""
    import torch

    from .triton.plans import dense

    if t.stride() == dense(*t.shape):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _einsum(x, x_scale_f32, w, w_scale, out):
    import torch

    m, g, _ = x.shape
    y = out
    if y is None or not y.is_contiguous():
        y = torch.empty((m, g, w.shape[1]), dtype=torch.bfloat16, device=x.device)
    deep_gemm().fp8_einsum(EINSUM, (_row_major(x), x_scale_f32),
                           (_row_major(w), weight_scales(w_scale)), y, recipe=RECIPE)
    if out is not None and y is not out:
        out.copy_(y)
        return out
    return y


BACKEND = _DeepGemmBackend()
