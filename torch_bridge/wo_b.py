"""``WoBProjection``: DeepSeek V4's ``wo_b`` (``z [T, G*N] -> [T, hidden]``) on one rank, in torch.

``wo_b`` is the row-parallel projection after ``wo_a``; a tensor-parallel rank holds the input
columns of its own ``wo_a`` groups and produces a partial sum (``torch_bridge.tp`` reduces it).

* FP8 path (the checkpoint's own format): 1 x B E8M0 activation quant of ``z`` (bit-identical to
  ``woa_jax.group_quant_e8m0``), then ``ops.batched_gemm_a8w8_mxscale`` with one group,
  ``x [T, 1, K']`` against ``w [1, hidden, K']`` with B x B weight scales.
* BF16 path (the fallback): the exact BF16 dequantized weight, a bf16 GEMM with fp32 accumulation.

Both return fp32 by default: a partial must not be rounded before the reduction.
"""

from __future__ import annotations

import torch

from woa_jax import AITER_AMAX_FLOOR, checks
from woa_jax.checks import as_enum
from woa_jax.wo_b import ProjectionPath, check_wo_b_weight

from . import _dispatch, _weights, interop, ops
from ._dispatch import BackendName

_WO_B = _weights.Projection("wo_b", "wo_b weight", "wo_b weight_scale", "[hidden, G * N]",
                            "[1, hidden, K']", "WoBProjection")


def group_quant_e8m0_2d(z: torch.Tensor, block: int = 128, *,
                        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
                        amax_floor: float = AITER_AMAX_FLOOR,
                        backend: BackendName = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row 1 x ``block`` E8M0 FP8 quantization of a plain ``z [T, K]`` (no RoPE).

    Bytes equal ``woa_jax.group_quant_e8m0(z, block)``'s for finite ``z`` (the scale comes from
    the fp32 value of each element). It runs a backend's ``inverse_rope_group_quant`` on
    ``z [T, 1, K]`` with zero rope lanes (empty tables), which makes the rotation the identity:
    dispatched like that op (on the Triton backend one pass over ``z``, no host sync, CUDA-graph
    capturable; AITER refuses it: its kernel is built for 64 rope lanes).

    Args:
      z: ``[T, K]`` bf16/fp16/fp32.
      block: 32, 64 or 128; must divide K.
      fp8_dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e4m3fnuz``.
      amax_floor: a finite positive float, 1e-8 (AITER) or 1e-10 (vLLM CUDA).
      backend: ``"auto"`` or a backend name, as ``torch_bridge.inverse_rope_group_quant``.

    Returns:
      ``(q [T, K] fp8_dtype, scale [T, K / block] float8_e8m0fnu)``.
    """
    t, k = checks.check_rank(z, 2, "z", "[T, K]")
    checks.check_dtype(z, _weights.PLAIN_NAMES, "z")
    if block not in (32, 64, 128) or k % block != 0:
        raise ValueError(f"block must be 32, 64 or 128 and divide K={k}, got {block}")
    if fp8_dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        raise TypeError(f"fp8_dtype must be torch.float8_e4m3fn or torch.float8_e4m3fnuz, got "
                        f"{fp8_dtype}")
    checks.check_amax_floor(amax_floor)
    z = z if z.is_contiguous() else z.contiguous()
    no_rope = torch.empty((1, 0), dtype=torch.float32, device=z.device)  # rd = 0: identity
    case = _dispatch.rope_case(z.view(t, 1, k), no_rope, block, fp8_dtype, num_groups=1,
                               amax_floor=amax_floor, device_type=z.device.type)
    be = _dispatch.select("inverse_rope_group_quant", case, backend)
    q = torch.empty((t, 1, k), dtype=fp8_dtype, device=z.device)
    byte = torch.empty((t, 1, k // block), dtype=torch.uint8, device=z.device)
    be.inverse_rope_group_quant(z.view(t, 1, k), _zero_positions(t, z.device), no_rope, no_rope,
                                1, block, amax_floor=amax_floor, x_fp8=q, x_scale=byte)
    return q.view(t, k), byte.view(t, k // block).view(torch.float8_e8m0fnu)


_POSITIONS: dict[str, torch.Tensor] = {}
#: Tables ``_POSITIONS`` outgrew: a launch on another stream may still read one.
_RETIRED: list[torch.Tensor] = []


def _zero_positions(t: int, device: torch.device) -> torch.Tensor:
    """Cached ``[>= t]`` int32 zeros (the kernel reads a position per token; none is used).

    Launches on every stream read the table, so it is complete before it is handed out, and a
    table it outgrows is kept (sizes double: a few small tensors)."""
    key = str(device)
    have = _POSITIONS.get(key)
    if have is None or have.shape[0] < t:
        grown = torch.zeros(max(t, 1024, 2 * (0 if have is None else have.shape[0])),
                            dtype=torch.int32, device=device)
        if grown.is_cuda and not torch.cuda.is_current_stream_capturing():
            torch.cuda.current_stream(device).synchronize()
        if have is not None:
            _RETIRED.append(have)
        _POSITIONS[key] = have = grown
    return have


#: Per device type: whether ``torch.mm(..., out_dtype=torch.float32)`` runs there (probed once).
#: torch 2.13 has no CPU kernel for it.
_MM_OUT_DTYPE: dict[str, bool] = {"cpu": False}


def _mm_fp32(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """``a [T, K] @ b_t.T`` for bf16 operands with fp32 accumulation and an fp32 result."""
    kind = a.device.type
    if _MM_OUT_DTYPE.get(kind, True):
        try:
            y = torch.mm(a, b_t.t(), out_dtype=torch.float32)
        except (TypeError, NotImplementedError):
            # No out_dtype overload (TypeError) or no kernel for this device (NotImplementedError);
            # anything else (out of memory included) propagates.
            _MM_OUT_DTYPE[kind] = False
        else:
            _MM_OUT_DTYPE[kind] = True
            return y
    return torch.mm(a.to(torch.float32), b_t.to(torch.float32).t())  # exact upcast


def _wo_b_block(weight: torch.Tensor, scale: torch.Tensor | None) -> int | None:
    """``wo_b``'s shape rules for ``_weights.take_weight``: an fp8 weight's scale tiles both
    dimensions in whole blocks (``woa_jax.wo_b.check_wo_b_weight``; returns B)."""
    return None if scale is None else check_wo_b_weight(weight, scale)[2]


class WoBProjection:
    """The ``wo_b`` projection of one layer (one tensor-parallel rank's input columns).

    Args:
      weight: ``[hidden, K']`` checkpoint weight (``K' = G_l * N``): float8_e4m3fn/e4m3fnuz with a
        scale, or bf16/fp16/fp32 with ``weight_scale=None`` (an unquantized checkpoint: BF16 path
        only).
      weight_scale: ``[hidden / B, K' / B]`` block scales (B = 128, or 32 for V4.1):
        float8_e8m0fnu, uint8 E8M0 bytes, or float powers of two. Float scales that are not powers
        of two keep the FP8 path off (``fp8_unavailable`` says why) and dequantize as they are.
      amax_floor: the activation quantizer's floor (1e-8, AITER's).

    Raises:
      TypeError, ValueError: as ``WoAProjection`` for its weight and scale, and a bad
        ``amax_floor``.

    Validation happens here, as for ``WoAProjection`` (``_weights.take_weight``): 2-D, dtypes,
    whole blocks in both dimensions (``woa_jax.wo_b.check_wo_b_weight``), values, and the lossless
    E8M0 conversion. The FP8 weight is kept as a zero-copy ``[1, hidden, K']`` view (the weight
    must be contiguous); the BF16 weight is built on first use and cached.
    """

    @interop.jax_io()
    def __init__(self, weight, weight_scale, *, amax_floor: float = AITER_AMAX_FLOOR):
        (self.block, self.weight_fp8, self.weight_scale_e8m0,
         self.fp8_unavailable) = _weights.take_weight(weight, weight_scale, 1, _WO_B, _wo_b_block)
        self.amax_floor = checks.check_amax_floor(amax_floor)
        self.hidden, self.in_features = weight.shape
        self._weight2d, self._scale = weight, weight_scale
        self._w_bf16: torch.Tensor | None = None

    @classmethod
    def from_tensors(cls, weight, weight_scale, **kwargs) -> WoBProjection:
        """Build from in-memory checkpoint tensors (same arguments as the constructor)."""
        return cls(weight, weight_scale, **kwargs)

    @property
    def weight_bf16(self) -> torch.Tensor:
        """The dequantized ``[hidden, K']`` bf16 weight (exact for E8M0 scales), cached."""
        if self._w_bf16 is None:
            self._w_bf16 = _weights.dequant_bf16(self._weight2d, self._scale, self.block, _WO_B)
        return self._w_bf16

    @interop.jax_io()
    def __call__(self, z, *, path: ProjectionPath | str = ProjectionPath.FP8,
                 backend: BackendName = "auto", dtype: torch.dtype = torch.float32):
        """``z [T, K']`` -> ``[T, hidden]`` in ``dtype`` (fp32 default: a TP partial).

        Args:
          z: ``[T, K']`` bf16 (``wo_a``'s output flattened), fp16 or fp32; on the weight's device.
          path: ``"fp8"`` (quant + block-scaled GEMM) or ``"bf16"`` (the fallback).
          backend: the FP8 GEMM's backend (``"auto"``, ``"aiter"``, ``"triton"``, ``"torch"``);
            the activation quant runs on the same backend when it can, else on ``auto``'s pick.
          dtype: ``torch.float32`` or ``torch.bfloat16``.

        Raises:
          TypeError: a non-tensor ``z`` or a wrong dtype.
          ValueError: a wrong shape or device, or ``path="fp8"`` for a weight that has no FP8
            path (``fp8_unavailable``).
          BackendUnavailableError: the requested backend cannot run the GEMM.
        """
        ops.require_torch(z=z)
        mode = as_enum(ProjectionPath, path, "path")
        t, k = checks.check_rank(z, 2, "z", "[T, G * N]")
        checks.check_dtype(z, _weights.PLAIN_NAMES, "z")
        if k != self.in_features:
            raise ValueError(f"z [T, G * N] = {(t, k)} does not match wo_b's {self.in_features} "
                             "input columns")
        if dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
        ops.one_device(z=z, weight=self._weight2d)
        if mode is ProjectionPath.BF16:
            return _mm_fp32(z.to(torch.bfloat16), self.weight_bf16).to(dtype)
        if self.fp8_unavailable:
            raise ValueError(f"the FP8 wo_b path cannot run: {self.fp8_unavailable}")
        gemm = self._gemm_backend(z, dtype, backend)
        q, qs = group_quant_e8m0_2d(z, self.block, fp8_dtype=self.weight_fp8.dtype,
                                    amax_floor=self.amax_floor,
                                    backend=gemm if self._quant_runs_on(gemm, z) else "auto")
        y = ops.batched_gemm_a8w8_mxscale(q[:, None], self.weight_fp8, qs[:, None],
                                          self.weight_scale_e8m0, dtype, backend=gemm)
        return y[:, 0]

    def _quant_runs_on(self, name: str, z: torch.Tensor) -> bool:
        """Whether backend ``name`` takes this layer's activation quant (zero rope lanes)."""
        o = torch.empty((z.shape[0], 1, self.in_features), dtype=z.dtype, device="meta")
        no_rope = torch.empty((1, 0), dtype=torch.float32, device="meta")
        case = _dispatch.rope_case(o, no_rope, self.block, self.weight_fp8, num_groups=1,
                                   amax_floor=self.amax_floor, device_type=z.device.type)
        return _dispatch.check(name, "inverse_rope_group_quant", case)[0]

    def _gemm_backend(self, z: torch.Tensor, dtype: torch.dtype, backend: str) -> str:
        """The backend the GEMM of this call resolves to (the activation quant runs on Triton
        exactly when the GEMM does)."""
        x = torch.empty((z.shape[0], 1, self.in_features), dtype=self.weight_fp8.dtype,
                        device="meta")
        case = _dispatch.gemm_case(x, self.weight_fp8, self.block, dtype,
                                   device_type=z.device.type, x_k_contiguous=True)
        return _dispatch.select("batched_gemm_a8w8_mxscale", case, backend).name

    def __repr__(self) -> str:
        return (f"WoBProjection(hidden={self.hidden}, K'={self.in_features}, "
                f"weight={checks.dtype_name(self._weight2d)}, block={self.block})")
