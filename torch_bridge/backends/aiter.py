"""Thin adapter over AITER's ``inverse_rope_group_quant`` and ``batched_gemm_a8w8_mxscale``.

Availability is probed without side effects, cheapest first: ``WOA_USE_AITER`` (default 1), the
``aiter`` module's presence (``find_spec``), its version (``amd-aiter`` >= 0.1.20, the first
release with both ops, or a source tree's ``_version.py``), a ROCm build of torch, and the GPU arch
``gfx950``. Only when all pass is ``aiter`` imported, once, to find both ops and which keyword the
quant op takes: released AITER (v0.1.19.post1 .. v0.1.20.post1) has ``scale_shuffle: bool``, main
has ``scale_layout: str``. The adapter always asks for the row layout (``torch_bridge.ops`` builds
tiled layouts from it).

Argument mapping: positions become int64 (AITER's host check), cos/sin become contiguous tensors
of ``o``'s dtype (AITER's "cos/sin dtype must match o"), scales are uint8. AITER does not validate
the GEMM's scale dtypes or shapes (a wrong one gives silently wrong output), so this adapter checks
them before every call.
"""

from __future__ import annotations

import importlib
import inspect

import torch
from packaging.version import InvalidVersion, Version

from woa_jax import AITER_AMAX_FLOOR

from .. import _capability
from .._dispatch import Case

MIN_VERSION = Version("0.1.20")
ARCH = "gfx950"


class AiterBackend:
    """The AITER backend (gfx950 only)."""

    name = "aiter"
    ops = frozenset({"inverse_rope_group_quant", "batched_gemm_a8w8_mxscale"})
    eager_ops: frozenset[str] = frozenset()
    #: AITER's quant op wants cos/sin in ``o``'s dtype; ``WoAProjection`` converts them once.
    rope_in_activation_dtype = True

    def __init__(self):
        self._probe: tuple[bool, str] | None = None
        self._quant = None
        self._gemm = None
        self.spelling: str | None = None

    def cache_clear(self) -> None:
        self.__init__()

    def is_available(self) -> tuple[bool, str]:
        if self._probe is None:
            self._probe = self._run_probe()
        return self._probe

    def _run_probe(self) -> tuple[bool, str]:
        if not _capability.env_flag("WOA_USE_AITER", True):
            return False, "disabled by WOA_USE_AITER=0"
        if not _capability.module_found("aiter"):
            return False, "AITER is not installed (no 'aiter' module)"
        raw = _capability.aiter_version()
        if raw is None:
            return False, ("AITER's version is unknown (no amd-aiter distribution metadata and no "
                           "aiter/_version.py)")
        try:
            version = Version(raw)
        except InvalidVersion:
            return False, f"AITER version {raw!r} is not a valid version"
        if version < MIN_VERSION:
            return False, (f"AITER {raw} is older than {MIN_VERSION}, the first release with "
                           "batched_gemm_a8w8_mxscale")
        if not _capability.is_rocm_build():
            return False, "torch is not a ROCm build (torch.version.hip is None)"
        arch = _capability.gpu_arch()
        if arch != ARCH:
            return False, f"GPU arch is {arch or 'none'}; AITER's wo_a ops run on {ARCH} only"
        try:
            mod = importlib.import_module("aiter")
            quant = mod.inverse_rope_group_quant
            gemm = mod.batched_gemm_a8w8_mxscale
        except (ImportError, AttributeError) as e:
            return False, f"AITER {raw} lacks the wo_a ops: {e}"
        params = inspect.signature(quant).parameters
        if "scale_layout" in params:
            self.spelling = "scale_layout"
        elif "scale_shuffle" in params:
            self.spelling = "scale_shuffle"
        else:
            return False, (f"AITER {raw} inverse_rope_group_quant takes neither scale_layout nor "
                           "scale_shuffle")
        self._quant, self._gemm = quant, gemm
        return True, f"AITER {raw} ({self.spelling} spelling) on {arch}"

    def supports(self, op: str, case: Case) -> tuple[bool, str]:
        want = _capability.accelerator_device_type()
        if case.device_type != want:
            return False, (f"tensors are on {case.device_type}; AITER needs {want} (ROCm GPU) "
                           "tensors")
        if op == "inverse_rope_group_quant":
            if case.act_dtype not in ("bfloat16", "float16"):
                return False, f"o must be bfloat16 or float16 for AITER, got {case.act_dtype}"
            if (case.head_dim, case.rope_dim) != (512, 64):
                return False, (f"AITER's kernel is built for head_dim 512 and rope_dim 64, got "
                               f"{case.head_dim} and {case.rope_dim}")
            if case.get("amax_floor", AITER_AMAX_FLOOR) != AITER_AMAX_FLOOR:
                return False, (f"AITER's amax floor is {AITER_AMAX_FLOOR}, got "
                               f"{case.get('amax_floor')}")
        elif op == "batched_gemm_a8w8_mxscale":
            if case.quant_group_size != 128:
                return False, (f"AITER's GEMM uses 128x128 weight blocks, got "
                               f"{case.quant_group_size}")
            n, k = case.get("n"), case.get("k")
            if n is not None and (n % 128 or k % 128):
                return False, f"AITER's GEMM needs N and K multiples of 128, got N={n}, K={k}"
            if not case.get("x_k_contiguous", True):
                return False, "AITER's GEMM needs x with unit stride along K"
            if case.out_dtype not in ("bfloat16", "float32"):
                return False, f"AITER's GEMM writes bf16 or fp32, not {case.out_dtype}"
        else:
            return False, f"aiter does not implement {op}"
        if case.fp8_dtype != "float8_e4m3fn":
            return False, f"AITER on {ARCH} needs float8_e4m3fn, got {case.fp8_dtype}"
        return True, f"AITER ({self.spelling} spelling)"

    def inverse_rope_group_quant(self, o, positions, cos_cache, sin_cache, num_groups: int,
                                 quant_group_size: int, *, amax_floor: float = AITER_AMAX_FLOOR,
                                 x_fp8=None, x_scale=None):
        s, h, dh = o.shape
        d = h * dh // num_groups
        positions = positions.to(torch.int64).contiguous()  # no-ops when already so
        cos_cache = cos_cache.to(o.dtype).contiguous()
        sin_cache = sin_cache.to(o.dtype).contiguous()
        if x_fp8 is None:
            x_fp8 = torch.empty((s, num_groups, d), dtype=torch.float8_e4m3fn, device=o.device)
        if x_scale is None:
            x_scale = torch.empty((s, num_groups, d // quant_group_size), dtype=torch.uint8,
                                  device=o.device)
        _expect(x_scale, torch.uint8, (s, num_groups, d // quant_group_size), "x_scale")
        layout = {"scale_layout": "row"} if self.spelling == "scale_layout" \
            else {"scale_shuffle": False}
        q, sc = self._quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size,
                            **layout, x_fp8=x_fp8, x_scale=x_scale)
        return q, sc.view(torch.uint8)

    def batched_gemm_a8w8_mxscale(self, x, w, x_scale, w_scale, *, dtype=torch.bfloat16,
                                  out=None):
        m, g, k = x.shape
        n = w.shape[1]
        _expect(x_scale, torch.uint8, (m, g, k // 128), "x_scale")
        _expect(w_scale, torch.uint8, (g, n // 128, k // 128), "w_scale")
        # AITER reads w and the scales as packed row-major buffers.
        y = self._gemm(x, w.contiguous(), x_scale.contiguous(), w_scale.contiguous(),
                       dtype=dtype)
        if out is not None:
            # The public AITER entry has no out=; copy into the caller's buffer.
            return out.copy_(y)
        return y


def _expect(t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], what: str) -> None:
    """AITER reads these bytes unchecked: refuse anything but the exact dtype and shape."""
    if t.dtype != dtype:
        raise TypeError(f"AITER adapter: {what} must be {dtype} E8M0 bytes, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"AITER adapter: {what} must have shape {shape}, got {tuple(t.shape)}")


BACKEND = AiterBackend()
