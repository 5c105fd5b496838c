"""The Triton backend (``WOA_BACKEND=triton``): NVIDIA sm_89+ (Hopper tuned) and AMD gfx942/gfx950.

Kernel bodies live in ``kernels.py``, ``bf16_kernels.py`` (the BF16 chain's GEMM) and
``wgmma_kernels.py`` (the Hopper GEMM, written in Triton's Gluon dialect; its warp-specialized
variant, which runs its persistent tiles, in ``wgmma_ws_kernels.py``), with no torch import
so that ``torch_bridge.jax_ops`` launches the same kernels (``jax_launch.py``). ``configs.py``
holds the launch rules both launchers share (the BF16 chain's in ``bf16_configs.py``);
``launch.py`` is the torch face, one function per op, each a ``torch.library`` custom op.
With ``TRITON_INTERPRET=1`` the kernels run on CPU tensors through Triton's interpreter (CI).
Importing this package touches no GPU and does not import Triton.
"""

from __future__ import annotations

import functools
import re
import sys

from ... import _capability
from ..._capability import interpreter_on
from ..._dispatch import Case

_ROPE_DTYPES = ("bfloat16", "float16", "float32")
_GEMM_BLOCKS = (32, 64, 128)


def _fp8_arch_reason(arch: str | None) -> str | None:
    """``None`` when the GPU arch has fp8 MMA Triton can use; else why not."""
    if arch is None:
        return "no GPU (torch.cuda.is_available() is False) and TRITON_INTERPRET is not set"
    if arch.startswith("sm_"):
        major_minor = int(arch[3:])
        if major_minor >= 89:
            return None
        return f"{arch} has no fp8 (e4m3) tensor cores; needs sm_89 or newer"
    if arch in ("gfx942", "gfx950"):
        return None
    return f"{arch} is not a Triton fp8 target here; needs gfx942 or gfx950"


def _release(version: str) -> tuple[int, ...]:
    """``(major, minor)`` of a version string (``"3.6.0+git1a2b"`` -> ``(3, 6)``)."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def _interpreter_reason(triton_version: str, numpy_version: str) -> str | None:
    """``None`` where Triton's CPU interpreter runs the kernels; else why not. Before 3.7 the
    interpreter turns a loop bound it holds as a one-element array into an int with ``int()``,
    which numpy 2.4 refuses: every call would fail with a TypeError inside a kernel."""
    if _release(triton_version) < (3, 7) and _release(numpy_version) >= (2, 4):
        return (f"Triton {triton_version}'s interpreter (TRITON_INTERPRET=1) cannot run with "
                f"numpy {numpy_version}: install triton>=3.8 (pip install 'woa[triton]') or "
                f"numpy<2.4")
    return None


class _TritonBackend:
    name = "triton"
    ops = frozenset({"inverse_rope_group_quant", "batched_gemm_a8w8_mxscale", "wo_a_fp8"})
    eager_ops = frozenset({"inverse_rope_group_quant", "batched_gemm_a8w8_mxscale", "wo_a_fp8"})
    #: The kernels read cos/sin in any float dtype; no conversion to ``o``'s dtype first.
    rope_in_activation_dtype = False

    @functools.cache  # noqa: B019 - one module-level instance; cache_clear() resets it
    def is_available(self) -> tuple[bool, str]:
        if not _capability.env_flag("WOA_USE_TRITON", True):
            return False, "disabled by WOA_USE_TRITON=0"
        if not _capability.module_found("triton"):
            return False, "triton is not installed (pip install 'woa[triton]')"
        if interpreter_on():
            import numpy
            import triton

            reason = _interpreter_reason(triton.__version__, numpy.__version__)
            if reason is not None:
                return False, reason
            return True, "triton interpreter (TRITON_INTERPRET=1, CPU tensors)"
        reason = _fp8_arch_reason(_capability.gpu_arch())
        if reason is not None:
            return False, reason
        return True, f"triton on {_capability.gpu_arch()}"

    def cache_clear(self) -> None:
        self.is_available.cache_clear()
        common = sys.modules.get(f"{__name__}._common")
        if common is not None:
            common.direct_launches.cache_clear()
            common._PDL.clear()
        native = sys.modules.get(f"{__name__}.native")
        if native is not None:
            native.available.cache_clear()

    def supports(self, op: str, case: Case) -> tuple[bool, str]:
        want = "cpu" if interpreter_on() else "cuda"
        if case.device_type != want:
            return False, (f"tensors are on {case.device_type}; the triton backend runs on "
                           f"{want} here" + (" (TRITON_INTERPRET=1)" if want == "cpu" else ""))
        if case.fp8_dtype not in (None, "float8_e4m3fn", "float8_e4m3fnuz"):
            return False, f"fp8 dtype {case.fp8_dtype} is not supported (e4m3fn, e4m3fnuz)"
        if case.fp8_dtype == "float8_e4m3fnuz":
            if interpreter_on():
                import triton

                if _release(triton.__version__) < (3, 8):
                    return False, (f"Triton {triton.__version__}'s interpreter has no "
                                   f"float8_e4m3fnuz (3.8 or newer has)")
            elif _capability.gpu_arch() != "gfx942":
                return False, "float8_e4m3fnuz is native only on gfx942"
        if case.fp8_dtype == "float8_e4m3fn" and _capability.gpu_arch() == "gfx942" \
                and not interpreter_on():
            return False, "gfx942 has no OCP float8_e4m3fn; use float8_e4m3fnuz"
        if case.scale_layout != "row":
            return False, (f"scale_layout {case.scale_layout!r}: the triton backend writes "
                           "'row' only")
        if op == "inverse_rope_group_quant":
            return self._supports_quant(case)
        if op == "batched_gemm_a8w8_mxscale":
            if case.out_dtype not in (None, "bfloat16", "float32"):
                return False, f"output dtype {case.out_dtype} is not bf16 or fp32"
            if case.quant_group_size not in (None, *_GEMM_BLOCKS):
                return False, f"scale block {case.quant_group_size} not in {_GEMM_BLOCKS}"
            return True, "ok"
        return False, f"the triton backend does not implement {op}"

    @staticmethod
    def _supports_quant(case: Case) -> tuple[bool, str]:
        if case.act_dtype not in (None, *_ROPE_DTYPES):
            return False, f"o dtype {case.act_dtype} is not bf16, fp16 or fp32"
        if case.rope_dtype not in (None, *_ROPE_DTYPES):
            return False, f"cos/sin dtype {case.rope_dtype} is not bf16, fp16 or fp32"
        if case.rope_dim is not None and case.rope_dim % 2 != 0:
            return False, f"rope_dim {case.rope_dim} is odd"
        gs = case.quant_group_size
        if gs is not None and gs not in (32, 64, 128):
            return False, f"quant_group_size {gs} not in (32, 64, 128)"
        return True, "ok"

    # Op callables: imported lazily so that selecting a backend does not import triton/torch.
    def inverse_rope_group_quant(self, *args, **kwargs):
        from .launch import inverse_rope_group_quant

        return inverse_rope_group_quant(*args, **kwargs)

    def batched_gemm_a8w8_mxscale(self, *args, **kwargs):
        from .launch import batched_gemm_a8w8_mxscale

        return batched_gemm_a8w8_mxscale(*args, **kwargs)

    def eager_launcher(self, op: str, *args):
        """A direct launcher of the compiled kernel for eager calls that repeat this signature
        (``quant.eager_quant``, ``gemm.eager_gemm``, ``chain_eager.eager_wo_a_fp8``), or
        ``None``."""
        if op == "inverse_rope_group_quant":
            from .quant import eager_quant

            return eager_quant(*args)
        if op == "batched_gemm_a8w8_mxscale":
            from .gemm import eager_gemm

            return eager_gemm(*args)
        from .chain_eager import eager_wo_a_fp8

        return eager_wo_a_fp8(*args)

    def wo_a_fp8(self, *args, **kwargs):
        """The whole FP8 chain (``launch.wo_a_fp8``): one fused kernel at decode sizes."""
        from .launch import wo_a_fp8

        return wo_a_fp8(*args, **kwargs)


BACKEND = _TritonBackend()
