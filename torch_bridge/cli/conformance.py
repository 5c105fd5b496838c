"""``woa conformance MODULE:FUNCTION``: the ``woa_jax.conformance`` sweep on another project's
implementation with AITER's signature (torch tensors in and out). Exit 1 on a contract break.

Mistakes in what is checked are usage errors (exit 2), found before the sweep where they can be:
a function that cannot take the op's positional arguments (a chain such as ``wo_a_fp8``, or the
other op), a JAX or numpy function without ``--numpy`` (or a torch one with it), a ``--device``
this machine lacks; and during it, a backend the target asks for that cannot run here
(``BackendUnavailableError``): such a sweep compared nothing, so it is not a contract break."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import os
import pathlib
import sys
import time
from collections.abc import Callable

from . import output
from .errors import ExitCode, UsageError, exit_codes_help

_QUANT, _GEMM = "inverse_rope_group_quant", "batched_gemm_a8w8_mxscale"
#: The positional arguments the sweep passes to each op (AITER's signature).
_ARGS = {_QUANT: ("o", "positions", "cos_cache", "sin_cache", "num_groups", "quant_group_size"),
         _GEMM: ("x", "w", "x_scale", "w_scale")}
#: Top-level packages whose functions take arrays of one framework.
_FRAMEWORKS = {"jax": "jax", "jaxlib": "jax", "woa_jax": "jax", "numpy": "numpy",
               "torch": "torch", "torch_bridge": "torch"}


def framework(fn: Callable) -> str | None:
    """``"jax"``, ``"numpy"`` or ``"torch"`` when ``fn``'s package says which arrays it takes,
    else ``None`` (a project's own module: the ``--numpy`` flag is trusted)."""
    module = getattr(fn, "__module__", None) or type(fn).__module__ or ""
    if module.startswith("torch_bridge.jax_ops"):
        return "jax"
    return _FRAMEWORKS.get(module.split(".")[0]) or _FRAMEWORKS.get(
        type(fn).__module__.split(".")[0] if type(fn).__module__ != "builtins" else "")


def check_target(spec: str, fn: Callable, op: str, *, numpy: bool) -> None:
    """Raise ``UsageError`` when ``fn`` cannot be the ``op`` the sweep calls as given: it does
    not take the op's positional arguments, or it takes the other framework's arrays."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: the sweep will tell
        sig = None
    if sig is not None:
        params = ", ".join(sig.parameters)
        if {"weight", "weight_scale"} & set(sig.parameters):
            raise UsageError(f"{spec} takes ({params}): a wo_a chain, not one op; conformance "
                             f"checks {_QUANT} or {_GEMM} (e.g. torch_bridge:{_QUANT})")
        try:
            sig.bind(*_ARGS[op])
        except TypeError as e:
            raise UsageError(f"{spec} takes ({params}), not {op}'s positional arguments "
                             f"({', '.join(_ARGS[op])}): {e}; pass --op for the other op") \
                from None
    kind = framework(fn)
    if kind in ("jax", "numpy") and not numpy:
        raise UsageError(f"{spec} is a {kind} function: pass --numpy, so that it gets numpy "
                         "arrays instead of torch tensors")
    if kind == "torch" and numpy:
        raise UsageError(f"{spec} takes torch tensors: drop --numpy, which passes numpy arrays")


class _Refusals:
    """Wraps the target: a backend it asks for that cannot run here is kept, and later calls
    are not made (the sweep would only fail every case the same way)."""

    def __init__(self, impl: Callable):
        self.impl, self.first = impl, None

    def __call__(self, *args):
        from .._dispatch import BackendUnavailableError

        if self.first is not None:
            raise self.first
        try:
            return self.impl(*args)
        except BackendUnavailableError as e:
            self.first = e
            raise


def load_target(spec: str) -> Callable:
    """``module:function`` (or ``path/to/file.py:function``) to the callable it names."""
    if ":" not in spec:
        raise UsageError(f"{spec!r} is not MODULE:FUNCTION (e.g. "
                         "mypkg.ops:inverse_rope_group_quant)")
    mod_name, _, attr = spec.rpartition(":")
    if not mod_name or not attr:
        raise UsageError(f"{spec!r} is not MODULE:FUNCTION")
    if mod_name.endswith(".py") or os.sep in mod_name:
        file = pathlib.Path(mod_name)
        if not file.is_file():
            raise FileNotFoundError(f"{spec}: file {file} does not exist")
        mspec = importlib.util.spec_from_file_location(file.stem, file)
        module = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # like `python -m`: modules in the working directory
        try:
            module = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name and mod_name.startswith(e.name):
                raise UsageError(f"{spec}: no module named {e.name!r}") from None
            raise
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise UsageError(f"{spec}: module {mod_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise UsageError(f"{spec}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def torch_adapter(fn: Callable, op: str, device: str) -> Callable:
    """Wrap a torch function with AITER's signature into the sweep's numpy-in callable.

    Outputs stay torch tensors; ``woa_jax.testing.to_numpy`` reads them (GPU ones included).
    """
    import numpy as np

    from ..interop import numpy_to_torch

    def on_device(*arrays):
        return [numpy_to_torch(np.asarray(a)).to(device) for a in arrays]

    if op == _QUANT:
        def quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size):
            return fn(*on_device(o, positions, cos_cache, sin_cache), num_groups,
                      quant_group_size)
        return quant

    def gemm(x, w, x_scale, w_scale):
        return fn(*on_device(x, w, x_scale, w_scale))
    return gemm


def run(args: argparse.Namespace) -> int:
    """Run ``woa conformance``: the report as text or JSON; returns the ``ExitCode``."""
    output.check_json_dest(args.json)
    from woa_jax import AITER_AMAX_FLOOR, CUDA_AMAX_FLOOR, conformance

    floors = {"aiter": (AITER_AMAX_FLOOR,), "cuda": (CUDA_AMAX_FLOOR,),
              "any": conformance.DEFAULT_FLOORS}[args.floor]
    targets = [(spec, load_target(spec)) for spec in args.targets]
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif not args.numpy:
        from .._capability import device_missing

        if device_missing(device):
            raise UsageError(f"--device {device}: {device_missing(device)}")
    ops = []
    for spec, fn in targets:  # every target is checked before any sweep runs
        try:
            op = conformance.ConformanceOp(args.op) if args.op else conformance.detect_op(fn)
        except ValueError:
            raise UsageError(f"{spec}: cannot tell from its name or parameters which op it "
                             f"implements; pass --op {_QUANT} or --op {_GEMM}") from None
        check_target(spec, fn, op.value, numpy=args.numpy)
        ops.append(op)
    reports = []
    for (spec, fn), op in zip(targets, ops, strict=True):
        impl = _Refusals(fn if args.numpy else torch_adapter(fn, op.value, device))
        t0 = time.perf_counter()
        report = conformance.run_conformance(
            impl, op=op, floors=floors, quick=args.quick, select=args.select, seed=args.seed,
            group_sizes=tuple(args.group_size), name=spec)
        if impl.first is not None:  # nothing was compared: not run, and why
            raise impl.first
        reports.append((report, time.perf_counter() - t0))
    payload = {"command": "conformance", "passed": all(r.passed for r, _ in reports),
               "device": device, "quick": args.quick,
               "reports": [r.to_dict() | {"seconds": sec} for r, sec in reports]}
    output.write_json(args.json, payload)
    if args.json != "-":
        for report, sec in reports:
            _print_conformance(report, sec, verbose=args.verbose)
    return ExitCode.OK if payload["passed"] else ExitCode.BROKEN


def _print_conformance(report, seconds: float, *, verbose: bool) -> None:
    quant = report.op == _QUANT
    shown = report.failures if report.failures and not verbose else report.cases
    if quant:
        columns = ["case", "scale =", "fp8 =", "floor", "time", "result"]
        rows = [[c.name, output.pct(c.scale_bytes_equal), output.pct(c.fp8_bytes_equal),
                 ", ".join(f"{f:g}" for f in c.floors) or "none", output.ms(c.seconds),
                 "ok" if c.passed else "FAIL: " + c.detail] for c in shown]
        right = (1, 2, 4)
    else:
        columns = ["case", "vs fp32 ref", "time", "result"]
        rows = [[c.name, output.sci(c.rel_error), output.ms(c.seconds),
                 "ok" if c.passed else "FAIL: " + c.detail] for c in shown]
        right = (1, 2)
    floor = ""
    if quant:
        floor = " amax floor: " + (f"{report.amax_floor:g}." if report.amax_floor is not None
                                   else "not determined.")
    legend = ("scale = / fp8 =: bytes equal to the oracle's; floor: the amax floors the case's "
              "bytes match." if quant else "vs fp32 ref: relative error against the fp32 GEMM.")
    caption = (f"{len(report.cases) - len(report.failures)} of {len(report.cases)} cases "
               f"conform.{floor} {seconds:.1f} s. {legend}")
    output.print_table(f"woa conformance: {report.impl} ({report.op})", columns, rows,
                       right=right, notes=[caption, *(f"problem: {p}" for p in report.problems)])
    print()
    output.say("PASS" if report.passed else "FAIL: contract broken")


def add_parser(sub) -> None:
    """Register ``woa conformance`` with the subcommand parsers ``sub``."""
    c = sub.add_parser("conformance", help="check another implementation against the oracle",
                       description="Import MODULE:FUNCTION, an implementation with AITER's "
                       "signature of inverse_rope_group_quant or batched_gemm_a8w8_mxscale "
                       "(torch tensors in and out), and run the standard DeepSeek V4 sweep "
                       "against woa_jax. " + exit_codes_help(
                           ExitCode.OK, ExitCode.BROKEN, ExitCode.USAGE,
                           ok="every case conforms", broken="the implementation breaks the "
                           "contract", usage="usage error (a bad target, op or argument, a "
                           "function for the other framework, or a backend that cannot run "
                           "here)") + ".")
    c.add_argument("targets", nargs="+", metavar="MODULE:FUNCTION",
                   help="e.g. aiter:inverse_rope_group_quant, or path/to/file.py:fn")
    c.add_argument("--op", choices=(_QUANT, _GEMM), help="which op (default: from the name)")
    c.add_argument("--quick", action="store_true", help="each input pattern once (seconds)")
    c.add_argument("--floor", choices=("any", "aiter", "cuda"), default="any",
                   help="accepted amax floor: aiter 1e-8, cuda 1e-10, any (default: one of them,"
                        " consistently)")
    c.add_argument("--group-size", type=int, nargs="+", default=[128], choices=(32, 64, 128),
                   help="quant group sizes to sweep (default 128)")
    c.add_argument("-k", dest="select", metavar="SUBSTRING", help="only cases whose id has it")
    c.add_argument("--device", choices=("cpu", "cuda"),
                   help="where inputs go (default: GPU if any)")
    c.add_argument("--numpy", action="store_true",
                   help="pass numpy arrays (for JAX/numpy implementations) instead of torch")
    c.add_argument("--seed", type=int, default=0,
                   help="seed of the sweep's random inputs (default 0)")
    c.add_argument("--verbose", "-v", action="store_true", help="list passing cases too")
    c.add_argument("--json", metavar="FILE", nargs="?", const="-",
                   help="JSON to FILE, or to stdout without FILE")
    c.set_defaults(func=run)
