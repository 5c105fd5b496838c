"""One native call for the kernels of an eager call that repeats its launch signature.

A chain launched through Triton's launcher pays, per kernel, the Python step of the launch and
the C launcher's parsing of every argument; at decode sizes two such launches take longer than
the GPU work. ``bind`` takes launches that have run once (``_common.Launch`` and its runtime
arguments) and writes each one's parameter map (``xla_ffi.params``, the map the JAX route's
custom call reads); a bound call then hands ``native_launch.cc`` up to four addresses (the
call's own tensors), and it packs and launches every kernel in order with ``cuLaunchKernelEx``,
as programmatic dependents where the kernels were compiled as such, in one ctypes call.

The map is checked against the kernel's own parameters (``cuFuncGetParamInfo``: their count
and sizes) when bound; a kernel that does not match, and any Triton outside the direct-launch
releases (``_common.direct_launches``), keeps Triton's launch. Built on first use with the
system C++ compiler against Triton's ``cuda.h`` (``native_build``); nothing here touches a GPU
at import.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import pathlib

import numpy as np
import torch

from . import native_build, xla_ffi
from ._common import direct_launches, eager_stream, interpreter_on, launch_hooks

log = logging.getLogger("woa")

_SOURCE = pathlib.Path(__file__).with_name("native_launch.cc")
#: Addresses a bound call takes: its own tensors (``native_launch.cc``'s open operands).
OPEN = 4
#: Parameters Triton's launcher appends to a kernel's own (global and profile scratch).
_TRITON_SCRATCH_PARAMS = 2
_MAX_PARAMS = 64
_TENSOR_MAP_BYTES = 128


class _Step(ctypes.Structure):
    """``woa::Step`` of ``launch_params.h``: one launch of a bound sequence (the arrays are
    kept with the binding)."""

    _fields_ = [("function", ctypes.c_void_p), ("grid", ctypes.c_uint * 3),
                ("threads", ctypes.c_uint), ("shared", ctypes.c_uint), ("pdl", ctypes.c_bool),
                ("params", ctypes.c_void_p), ("n_params", ctypes.c_size_t),
                ("scalars", ctypes.c_void_p), ("n_scalars", ctypes.c_size_t),
                ("tmaps", ctypes.c_void_p), ("n_tmaps", ctypes.c_size_t)]


def build() -> pathlib.Path:
    """The launcher library, compiled on first use (``native_build.build``)."""
    include = native_build.cuda_include()
    return native_build.build(_SOURCE, (str(include),), (include / "cuda.h",))


@functools.cache
def _library():
    lib = ctypes.CDLL(str(build()))
    u64, i64 = ctypes.c_uint64, ctypes.c_int64
    lib.woa_native_launch.argtypes = [u64, i64, u64, u64, u64, u64, u64, u64]
    lib.woa_native_launch.restype = ctypes.c_int
    lib.woa_native_error.argtypes = [ctypes.c_int]
    lib.woa_native_error.restype = ctypes.c_char_p
    lib.woa_native_missing.restype = ctypes.c_char_p
    lib.woa_native_param_sizes.argtypes = [u64, ctypes.c_void_p, i64]
    lib.woa_native_param_sizes.restype = i64
    return lib


@functools.cache
def available() -> tuple[bool, str]:
    """Whether eager calls may launch through the native launcher: ``(ok, reason)``; a CUDA
    process that cannot logs why, once.

    Needs CUDA (not the interpreter, not ROCm), Triton's direct launches, a C++ compiler and
    a driver with every function the launcher calls."""
    if interpreter_on() or torch.version.hip is not None:
        return False, "native launches are for CUDA devices"
    found = _probe()
    if not found[0]:
        log.info("eager layers keep one Triton launch per kernel: %s", found[1])
    return found


def _probe() -> tuple[bool, str]:
    direct, why = direct_launches()
    if not direct:
        return False, why
    try:
        missing = _library().woa_native_missing()
    except (RuntimeError, OSError) as e:
        return False, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    if missing:
        missing = missing.decode()
        return False, (f"cannot open {missing}" if missing.endswith(".so.1")
                       else f"the CUDA driver has no {missing}")
    return True, "native launcher built"


def _param_sizes(function: int, count: int) -> list[int] | None:
    sizes = np.zeros(count, np.int64)
    got = _library().woa_native_param_sizes(function, sizes.ctypes.data, count)
    return None if got < 0 else sizes[:got].tolist()


class Native:
    """Bound launches: ``__call__(stream, *addresses)`` launches every kernel in order on
    ``stream`` with ``addresses`` (up to ``OPEN``) as the call's own operands.

    Immutable once bound, so calls from several threads share it safely; callers that need
    one call's kernels to stay together on a stream (the chain's kept activations) hold their
    own lock around the call."""

    __slots__ = ("_launch", "_steps", "_count", "_fixed", "_keep")

    def __init__(self, steps: list, fixed: list[torch.Tensor], keep: list):
        array = (_Step * len(steps))(*steps)
        fixed_array = np.array([t.data_ptr() for t in fixed] or [0], np.uint64)
        # What the addresses below point into, the fixed tensors included.
        self._keep = (keep, array, fixed_array, fixed)
        self._launch = _library().woa_native_launch
        self._steps, self._count = ctypes.addressof(array), len(steps)
        self._fixed = fixed_array.ctypes.data

    def __call__(self, stream: int, a0: int, a1: int = 0, a2: int = 0, a3: int = 0) -> None:
        rc = self._launch(self._steps, self._count, self._fixed, stream, a0, a1, a2, a3)
        if rc:
            raise RuntimeError(
                f"woa native launch failed: {_library().woa_native_error(rc).decode()}")


def _as_map_args(args: tuple, table: list) -> tuple | None:
    """``args`` with each tensor a ``xla_ffi.Ref`` into ``table`` (found by identity; new ones
    appended) and each Gluon descriptor a ``xla_ffi.Desc``; ``None`` for an argument the map
    cannot hold."""
    def index(t: torch.Tensor) -> int:
        for i, known in enumerate(table):
            if known is t:
                return i
        table.append(t)
        return len(table) - 1

    mapped = []
    for a in args:
        if isinstance(a, torch.Tensor):
            mapped.append(xla_ffi.Ref(index(a)))
        elif hasattr(a, "block_shape") and isinstance(getattr(a, "base", None), torch.Tensor):
            if len(a.shape) != 2 or list(a.strides)[1:] != [1] or a.padding != "zero":
                return None
            mapped.append(xla_ffi.Desc(index(a.base), tuple(a.shape), a.strides[0],
                                       tuple(a.block_shape), None))
        elif type(a) is int:
            mapped.append(a)
        else:
            return None
    return tuple(mapped)


def _step(compiled, grid: tuple[int, ...], args: tuple, keep: list) -> _Step | None:
    """One kernel's ``_Step``, or ``None`` where its parameters disagree with the map."""
    if not xla_ffi.plain_launch(compiled):
        return None
    md = compiled.metadata
    tma = xla_ffi.tma_encodings(compiled)
    if len(tma) != sum(isinstance(a, xla_ffi.Desc) for a in args):
        return None
    params, scalars, tmaps = xla_ffi.params(args, tma)
    function = compiled.function
    sizes = _param_sizes(function, _MAX_PARAMS)
    if sizes is None or len(sizes) != len(params) + _TRITON_SCRATCH_PARAMS:
        return None
    next_scalar = iter(scalars.tolist())
    for p, size in zip(params.tolist(), sizes, strict=False):
        want = ((8,) if p >= 0 else (_TENSOR_MAP_BYTES,) if p == -2 else (4, 8))
        if size not in want:
            return None
        if p == -1 and size == 4 and not -2**31 <= next(next_scalar) < 2**31:
            return None  # an i64 value in an i32 parameter
        if p == -1 and size == 8:
            next(next_scalar)
    if any(size != 8 for size in sizes[len(params):]):
        return None
    keep += [params, scalars, tmaps]
    g = (*grid, 1, 1)[:3]
    return _Step(function, (ctypes.c_uint * 3)(*g), 32 * md.num_warps, md.shared,
                 xla_ffi.programmatic(compiled), params.ctypes.data, len(params),
                 scalars.ctypes.data, len(scalars), tmaps.ctypes.data, len(tmaps))


def bind(launches: list[tuple], open_tensors: tuple[torch.Tensor, ...]) -> Native | None:
    """``launches`` (``(Launch, runtime args)`` pairs, each launched once with these args) bound
    with ``open_tensors`` (up to ``OPEN``, found among the args by identity) left to each call;
    every other tensor is kept with the binding. ``None`` where the
    native launcher is unavailable (``available``), a kernel has not run yet, or its
    parameters disagree with the map."""
    if len(open_tensors) > OPEN or not available()[0]:
        return None
    table = [*open_tensors, *(None,) * (OPEN - len(open_tensors))]
    steps, keep = [], []
    for run, args in launches:
        compiled = run.compiled(args)
        mapped = compiled and _as_map_args(args, table)
        step = mapped and _step(compiled, run.grid, mapped, keep)
        if not step:
            return None
        steps.append(step)
    return Native(steps, table[OPEN:], keep)


def hooks_wanted() -> bool:
    """Whether a Triton launch hook (a profiler) is installed: its launches take Triton's path,
    which calls it."""
    enter, leave, _ = launch_hooks()
    return enter is not None or leave is not None


_NO_LOCK = contextlib.nullcontext()


def runner(bound: Native, o: torch.Tensor, positions: torch.Tensor, stream: int | None, new,
           lock=None):
    """``run(o, positions) -> tensor | None`` for launches bound with ``o``, ``positions`` and
    the buffers ``new()`` makes per call (one or two) open; it returns the last of them.

    ``stream``: the stream whose kept buffers the launches write (``None``: they keep none).
    ``None`` from ``run``: ``eager_stream`` refuses the call (with ``stream``, another stream or
    a capture), an input's 16-byte alignment differs from the bound one (another
    specialization), or a Triton launch hook is installed (``hooks_wanted``). ``lock`` keeps
    one call's kernels together on the stream."""
    index = o.device.index
    aligned = (o.data_ptr() % 16, positions.data_ptr() % 16)
    lock = lock or _NO_LOCK

    def run(o, positions):
        now = eager_stream((o, positions), index, stream)
        a, p = o.data_ptr(), positions.data_ptr()
        if now is None or (a % 16, p % 16) != aligned or hooks_wanted():
            return None
        made = new()
        with lock:
            if len(made) == 1:
                bound(now, a, p, made[0].data_ptr())
            else:
                bound(now, a, p, made[0].data_ptr(), made[1].data_ptr())
        return made[-1]
    run.native = True
    return run
