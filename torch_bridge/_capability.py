"""Lazy, cached capability probes and the ``WOA_*`` environment switches.

Nothing here touches a GPU or imports a vendor package at import time. Backends call the probes
through this module's attributes (``_capability.gpu_arch()``), so tests can replace them with
``monkeypatch.setattr``; ``cache_clear()`` forgets every cached answer.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import pathlib
import re

#: Environment variables read by ``torch_bridge`` (name -> meaning), for documentation and errors.
ENV_VARS: dict[str, str] = {
    "WOA_BACKEND": "auto (default), aiter, triton, deepgemm, torch or bf16: the backend every op "
                   "uses unless the call passes backend=",
    "WOA_USE_AITER": "1 (default) or 0: 0 keeps backend='auto' off AITER and makes an explicit "
                     "aiter request fail with that reason",
    "WOA_USE_TRITON": "1 (default) or 0: the same switch for the Triton backend",
    "WOA_CHECK_FINITE": "0 (default) or 1: check activations for NaN/Inf (and E8M0 NaN bytes) in "
                        "every entry point, at a device sync per call; read when torch_bridge's "
                        "modules are imported and when a WoAProjection is built",
    "WOA_JAX_COMMAND_BUFFER": "1 (default) or 0: let XLA record the buffer_callback route's "
                              "kernel launches into its command buffers where that is safe "
                              "(torch_bridge.jax_ops.command_buffer_blocker)",
    "WOA_JAX_NATIVE": "1 (default) or 0: 0 sends torch_bridge.jax_ops' Triton launches through "
                      "buffer_callback instead of the native woa_triton_launch custom call",
    "WOA_CACHE_DIR": "where the eager native launcher and the native JAX route's custom-call "
                     "handler are built (default: ~/.cache/woa)",
    "WOA_COMMIT": "commit id recorded in benchmark rows when git cannot tell (default: "
                  "git rev-parse HEAD)",
    "WOA_DIRECT_LAUNCH": "1 (default) or 0: 0 launches every call through Triton's public "
                         "kernel[grid], without the eager layers' native launcher",
    "WOA_PDL": "unset (default), 0 or 1: programmatic dependent launch on Hopper; unset: small "
               "quants and the unfused FP8 chain's GEMM, 0: none, 1: also every quant and "
               "pointer GEMM",
    "WOA_PEERS_DIR": "where the benchmark's peer rows find vLLM's quant file (default: the "
                     "checkout's out/peers/)",
}


def interpreter_on() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def jax_gpu_platform() -> str:
    """``cpu``, ``cuda``, ``rocm`` (or another platform name) of JAX's default backend."""
    import jax

    if jax.default_backend() == "cpu":
        return "cpu"
    version = jax.devices()[0].client.platform_version.lower()
    return next((p for p in ("cuda", "rocm") if p in version), jax.default_backend())


def env_flag(name: str, default: bool) -> bool:
    """A ``0``/``1`` switch; unset or empty means ``default``; anything else is a ``ValueError``."""
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    if raw in ("0", "1"):
        return raw == "1"
    raise ValueError(f"{name}={raw!r} is not a valid switch; expected 0 or 1")


@functools.cache
def is_rocm_build() -> bool:
    """Whether the installed torch is a ROCm (HIP) build; does not initialise a device."""
    import torch

    return getattr(torch.version, "hip", None) is not None


@functools.cache
def gpu_arch(device_index: int = 0) -> str | None:
    """The GPU architecture name (``"gfx950"``, ``"sm_90"``) of one device, or ``None`` without one.

    On ROCm this is ``gcnArchName`` without its feature suffixes (``:sramecc+:xnack-``). This
    initialises the device, so it is only called once a backend is otherwise eligible.
    """
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device_index)
    if is_rocm_build():
        return str(getattr(props, "gcnArchName", "")).split(":")[0] or None
    return f"sm_{props.major}{props.minor}"


def device_missing(device_type: str) -> str | None:
    """Why this process has no ``device_type`` device (``"no such device here: ..."``), else
    ``None``: judging backends for a device that is not there would answer for another machine."""
    if device_type in ("cpu", "meta"):
        return None
    import torch

    if device_type == "cuda":
        if torch.cuda.is_available():
            return None
        return "no such device here: torch sees no CUDA or ROCm GPU"
    available = getattr(getattr(torch, device_type, None), "is_available", None)
    if callable(available) and available():
        return None
    return f"no such device here: torch has no {device_type!r} device"


def accelerator_device_type() -> str:
    """The torch device type of a GPU tensor (ROCm builds report ``"cuda"`` too)."""
    return "cuda"


@functools.cache
def module_found(name: str) -> bool:
    """Whether ``import name`` would find a module, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def aiter_version() -> str | None:
    """AITER's version without importing it: the ``amd-aiter`` distribution, else the source tree.

    A source checkout on ``PYTHONPATH`` has no distribution metadata; its generated
    ``aiter/_version.py`` is read as text, because importing it would run ``aiter/__init__``.
    """
    return _package_version("amd-aiter", "aiter", "_version.py")


@functools.cache
def deep_gemm_version() -> str | None:
    """DeepGEMM's version without importing it (its import sets up CUDA compilation): the
    ``deep_gemm`` distribution, else the ``__version__`` line of the package's ``__init__.py``
    (a package folder on ``PYTHONPATH``)."""
    return _package_version("deep_gemm", "deep_gemm", "__init__.py")


def _package_version(dist: str, module: str, version_file: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec(module) if module_found(module) else None
    if spec is None or not spec.origin:
        return None
    path = pathlib.Path(spec.origin).parent / version_file
    if not path.is_file():
        return None
    match = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?["']([^"']+)["']""",
                      path.read_text(errors="replace"))
    return match.group(1) if match else None


def cache_clear() -> None:
    """Forget every cached probe (tests, or after changing the environment)."""
    for probe in (is_rocm_build, gpu_arch, module_found, aiter_version, deep_gemm_version):
        clear = getattr(probe, "cache_clear", None)  # tests may have swapped a probe out
        if clear is not None:
            clear()
