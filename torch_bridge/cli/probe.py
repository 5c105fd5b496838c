"""``woa probe``: every backend per op, whether it runs here and why not, which one a call without
``backend=`` runs, with versions, and how ``torch_bridge.jax_ops`` launches the Triton kernels
from JAX. A ``--device`` this machine does not have is answered with "no such device here"."""

from __future__ import annotations

import argparse
import os
import platform
from typing import Any

from . import output
from .errors import ExitCode, UsageError, exit_codes_help

#: ``WOA_*`` variables that are 0/1 switches (``_capability.env_flag`` reads them).
_SWITCHES = ("WOA_USE_AITER", "WOA_USE_TRITON", "WOA_JAX_NATIVE", "WOA_JAX_COMMAND_BUFFER",
             "WOA_CHECK_FINITE")


def versions() -> dict[str, str | None]:
    """Python and package versions (``None`` when a package is absent); imports nothing heavy."""
    from importlib import metadata

    from .. import _capability

    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("woa", "torch", "jax", "jaxlib", "triton", "numpy", "ml_dtypes", "safetensors"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["aiter"] = _capability.aiter_version()
    out["deep_gemm"] = _capability.deep_gemm_version()
    return out


def device_info() -> dict[str, Any]:
    """The accelerator torch sees (name, arch, runtime), or the CPU."""
    import torch

    from .. import _capability

    info: dict[str, Any] = {"cpu": platform.machine(), "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        info.update(
            device="cuda",
            name=torch.cuda.get_device_name(0),
            count=torch.cuda.device_count(),
            arch=_capability.gpu_arch(),
            runtime=(f"ROCm {torch.version.hip}" if _capability.is_rocm_build()
                     else f"CUDA {torch.version.cuda}"),
        )
    else:
        info.update(device="cpu", name=f"{platform.machine()} CPU, {os.cpu_count()} cores",
                    count=0, arch=None, runtime=None)
    return info


def check_environment() -> dict[str, str]:
    """The ``WOA_*`` variables (and ``TRITON_INTERPRET``), each validated as the library would.

    Raises:
      UsageError: a variable holds a value the library rejects (``WOA_BACKEND=nope``).
    """
    from .. import _capability, _dispatch

    try:
        _dispatch.requested_backend(None)
        for name in _SWITCHES:
            _capability.env_flag(name, True)
    except ValueError as e:
        raise UsageError(str(e)) from None
    names = sorted(set(_capability.ENV_VARS) | {k for k in os.environ if k.startswith("WOA_")}
                   | {"TRITON_INTERPRET"})
    return {k: os.environ.get(k, "(unset)") for k in names}


def jax_route() -> dict[str, Any]:
    """How ``jax_ops`` launches the Triton backend here: natively (our XLA custom call; on CUDA
    this builds its handler once) or through ``buffer_callback``, and why."""
    from .. import jax_ops

    reason = jax_ops.native_route_reason("triton")
    return {"native": reason is None, "reason": reason}


def add_parser(sub) -> None:
    """Register ``woa probe`` with the subcommand parsers ``sub``."""
    p = sub.add_parser("probe", help="which backend runs here, and why not",
                       description="Each backend per op: can it run here, and the reason; "
                       "which one auto picks. " + exit_codes_help(
                           ExitCode.OK, ExitCode.USAGE,
                           usage="usage error (an unknown argument, or a WOA_* variable holding "
                           "a value the library rejects)") + ".")
    p.add_argument("--device", choices=("cpu", "cuda"), help="judge for this device type")
    p.add_argument("--json", metavar="FILE", nargs="?", const="-",
                   help="JSON to FILE, or to stdout without FILE")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``woa probe``: the report as text or JSON; returns the ``ExitCode``."""
    output.check_json_dest(args.json)
    env = check_environment()
    import torch_bridge
    from torch_bridge import _capability, _dispatch

    dev = device_info()
    device_type = args.device or dev["device"]
    table = torch_bridge.explain(device_type=device_type)
    avail = torch_bridge.available_backends()
    missing = _capability.device_missing(device_type)
    picks = {op: None if missing else _dispatch.picked(op, per) for op, per in table.items()}
    payload = {"command": "probe", "device": dev, "device_type": device_type,
               "device_missing": missing, "versions": versions(), "env": env,
               "available": {b: {"ok": ok, "reason": why} for b, (ok, why) in avail.items()},
               "picked": picks, "jax_route": jax_route(),
               "ops": {op: {b: {"ok": ok, "reason": why} for b, (ok, why) in per.items()}
                       for op, per in table.items()}}
    output.write_json(args.json, payload)
    if args.json == "-":
        return ExitCode.OK
    ver = payload["versions"]
    installed = ", ".join(f"{k} {v}" for k, v in ver.items() if v is not None)
    absent = ", ".join(k for k, v in ver.items() if v is None) or "none"
    arch = f" ({dev['arch']}, {dev['runtime']})" if dev.get("arch") else ""
    route = payload["jax_route"]
    jax_note = ("jax_ops: Triton kernels launch natively (woa_triton_launch custom call)"
                if route["native"] else f"jax_ops: Triton kernels launch through buffer_callback "
                f"({route['reason']})")
    rows = [[op, backend, "yes" if ok else "no", why]
            for op, per in table.items() for backend, (ok, why) in per.items()]
    where = f"{device_type}: {missing}" if missing else device_type
    runs = ("a call without backend= runs: " + ", ".join(
        f"{op} on {name or 'nothing (it raises)'}" for op, name in picks.items()) + ".")
    output.print_table(
        f"woa probe on {dev['name']}{arch}: backends for a DeepSeek V4 call on {where}",
        ["op", "backend", "runs", "why"], rows,
        notes=[*([] if missing else [runs]), f"versions: {installed}; not installed: {absent}",
               jax_note, "environment: " + ", ".join(f"{k}={v}" for k, v in env.items())])
    return ExitCode.OK
