"""Peer implementations timed beside ours: DeepGEMM's FP8 einsum and vLLM's inverse RoPE + FP8
quant, the two halves of the ``wo_a`` chain vLLM runs on Hopper.

Neither is a dependency, and each raises ``Skip`` with the reason where it is absent.

* DeepGEMM is the ``deep_gemm`` package, built for the device's torch and CUDA.
* vLLM's quant is one file of the vLLM wheel (``VLLM_QUANT_FILE`` under ``peers_dir()``),
  loaded against small stand-ins for the few vLLM modules it imports, so that vLLM itself need
  not be installed. The stand-ins launch its Triton kernel as vLLM's launcher does (kernel
  arguments bound by name, PDL on sm_90 and later) and register its custom op under
  ``torch.ops.vllm``.

``benchmarks/README.md`` (Peers) says how to get both.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import pathlib
import sys
import types
from typing import Generic, TypeVar

from .problem import Skip

#: vLLM 0.33's ``vllm/models/deepseek_v4/common/ops/fused_inv_rope_fp8_quant.py``, as extracted.
VLLM_QUANT_FILE = pathlib.Path("vllm") / "fused_inv_rope_fp8_quant.py"
#: The module name the file is loaded under (not ``vllm.*``: it is not vLLM's package).
VLLM_QUANT_MODULE = "woa_peer_vllm_fused_inv_rope_fp8_quant"
_ROOT = pathlib.Path(__file__).resolve().parents[2]
_K = TypeVar("_K")


def peers_dir() -> pathlib.Path:
    """``$WOA_PEERS_DIR``, else the checkout's ``out/peers`` (git-ignored)."""
    return pathlib.Path(os.environ.get("WOA_PEERS_DIR") or _ROOT / "out" / "peers")


def deep_gemm(*, pdl: bool):
    """The ``deep_gemm`` module with programmatic dependent launch set to ``pdl``.

    The setting is global in DeepGEMM and read at each launch; each provider sets it in its
    setup, which the sweep runs right before timing that provider alone.

    Raises:
      Skip: no GPU of compute capability 9.0 (the scale layout prepared here is sm_90's), or
        ``deep_gemm`` does not import or lacks what the peer rows call.
    """
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise Skip("the DeepGEMM rows use its sm_90 recipe (fp32 scales): sm_90 GPUs only")
    try:
        import deep_gemm as dg
    except ImportError as e:
        raise Skip(f"deep_gemm does not import ({e}); see benchmarks/README.md, Peers") from None
    missing = [name for name in ("fp8_einsum", "get_mn_major_tma_aligned_tensor", "set_pdl")
               if not hasattr(dg, name)]
    if missing:
        raise Skip(f"deep_gemm {getattr(dg, '__version__', '?')} lacks {', '.join(missing)}")
    dg.set_pdl(pdl)
    return dg


def vllm_quant(path: str | os.PathLike | None = None):
    """vLLM's ``fused_inv_rope_fp8_quant(o, positions, cos_sin_cache, n_groups,
    heads_per_group, nope_dim, rope_dim, quant_group_size, tma_aligned_scales, quantize)``.

    ``path``: the extracted file (default ``peers_dir() / VLLM_QUANT_FILE``). Loaded once per
    process: loading registers its custom op, which a second load could not.

    Raises:
      Skip: the file is not there (the message names the path and where to get it), or a
        module named ``vllm`` that is not these stand-ins is already imported.
    """
    file = pathlib.Path(path) if path is not None else peers_dir() / VLLM_QUANT_FILE
    if not file.is_file():
        raise Skip(f"vLLM's quant file is not at {file} (extract "
                   "vllm/models/deepseek_v4/common/ops/fused_inv_rope_fp8_quant.py from the "
                   "vllm 0.33.0 wheel there, or set WOA_PEERS_DIR; benchmarks/README.md, Peers)")
    return _load_vllm_quant(file.resolve())


@functools.cache
def _load_vllm_quant(file: pathlib.Path):
    loaded = sys.modules.get(VLLM_QUANT_MODULE)
    if loaded is not None:
        raise Skip(f"vLLM's quant is already loaded from {loaded.__file__}; one file per "
                   "process (its custom op is registered once)")
    _install_stand_ins()
    spec = importlib.util.spec_from_file_location(VLLM_QUANT_MODULE, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[VLLM_QUANT_MODULE] = module
    return module.fused_inv_rope_fp8_quant


# ----------------------------------------------------------------------------------------------
# Stand-ins for the vLLM modules the quant file imports
# ----------------------------------------------------------------------------------------------


class _Platform:
    """``vllm.platforms.current_platform``: what the quant file asks of it."""

    @property
    def dispatch_key(self) -> str:
        import torch

        return "CUDA" if torch.cuda.is_available() else "CPU"

    @staticmethod
    def get_device_capability():
        import torch

        return torch.cuda.get_device_capability() if torch.cuda.is_available() else None

    @staticmethod
    def is_arch_support_pdl() -> bool:
        import torch

        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


class _TritonJitKernel(Generic[_K]):
    """``VllmTritonJitKernel`` at run time (no warmup registry): ``__call__`` returns
    ``(grid, kwargs)``; each call input not already in ``kwargs`` goes to the kernel argument
    of its name, its ``_ptr`` name or either upper-cased."""

    kernel = None

    def launch(self, spec, inputs: dict):
        grid, kwargs = spec[0], dict(spec[1])
        names = set(self.kernel.arg_names)
        for name, value in inputs.items():
            target = next((t for t in (name, f"{name}_ptr", name.upper(), f"{name}_PTR".upper())
                           if t in names), None)
            if target is not None:
                kwargs.setdefault(target, value)
        self.kernel[grid](**kwargs)


def _kernel_launcher(call):
    signature = inspect.signature(call)

    @functools.wraps(call)
    def wrapper(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        inputs = {k: v for k, v in bound.arguments.items() if k != "self"}
        return self.launch(call(self, *args, **kwargs), inputs)

    return wrapper


_LIBRARIES: list = []  # a torch.library.Library's ops live as long as the object


def _register_custom_op(op_name: str, op_func, mutates_args=None, fake_impl=None):
    import torch

    lib = torch.library.Library("vllm", "FRAGMENT")
    lib.define(op_name + torch.library.infer_schema(op_func, mutates_args=mutates_args or []))
    lib.impl(op_name, op_func, dispatch_key=_Platform().dispatch_key)
    if fake_impl is not None:
        lib._register_fake(op_name, fake_impl)
    _LIBRARIES.append(lib)


def _tma_aligned_size(x: int, element_size: int) -> int:
    align = 16 // element_size
    return -(-x // align) * align


def _install_stand_ins() -> None:
    """Put the stand-in ``vllm`` modules into ``sys.modules`` (the file imports one of them
    at each call, so they stay)."""
    import triton
    import triton.language as tl

    present = sys.modules.get("vllm")
    if present is not None and not getattr(present, "__woa_stand_in__", False):
        raise Skip("a vllm package is imported in this process; the peer loads vLLM's quant "
                   "file against stand-ins instead")
    attrs = {
        "vllm": {"__woa_stand_in__": True},
        "vllm.model_executor": {},
        "vllm.model_executor.warmup": {},
        "vllm.model_executor.warmup.jit_warmup": {"kernel_launcher": _kernel_launcher},
        "vllm.model_executor.warmup.jit_warmup_triton_helper": {
            "LaunchSpec": tuple, "TritonWarmupTensor": object,
            "VllmTritonJitKernel": _TritonJitKernel},
        "vllm.platforms": {"current_platform": _Platform()},
        "vllm.triton_utils": {"tl": tl, "triton": triton},
        "vllm.utils": {},
        "vllm.utils.torch_utils": {"direct_register_custom_op": _register_custom_op},
        "vllm.utils.deep_gemm": {"get_tma_aligned_size": _tma_aligned_size},
    }
    for name, values in attrs.items():
        module = sys.modules.get(name) or types.ModuleType(name)
        module.__dict__.update(values)
        sys.modules[name] = module
