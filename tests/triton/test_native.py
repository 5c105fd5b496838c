"""The native eager launcher (``native``), on CPU: building it, its availability reason, the
parameter map of a call's arguments, the check of the map against a kernel's own parameters,
and the library's answers without a driver. The GPU tests are in ``test_gpu_native.py``."""

from __future__ import annotations

import ctypes
import logging
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_bridge.backends.triton import native, native_build, xla_ffi  # noqa: E402

needs_compiler = pytest.mark.skipif(native_build.compiler() is None,
                                    reason="no C++ compiler to build the launcher")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WOA_CACHE_DIR", str(tmp_path / "cache"))
    native._library.cache_clear()
    native.available.cache_clear()
    yield tmp_path / "cache"
    native._library.cache_clear()
    native.available.cache_clear()


@needs_compiler
def test_launcher_builds_once_into_the_cache(cache):
    path = native.build()
    assert path.parent == cache and path.name.startswith("native_launch-")
    lib = ctypes.CDLL(str(path))
    for symbol in ("woa_native_launch", "woa_native_param_sizes", "woa_native_error",
                   "woa_native_missing"):
        assert hasattr(lib, symbol)
    stamp = path.stat().st_mtime_ns
    assert native.build() == path and path.stat().st_mtime_ns == stamp
    assert list(cache.iterdir()) == [path]


def test_build_errors_are_reported(cache, monkeypatch):
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(RuntimeError, match=r"building native_launch.cc failed \(false -O2"):
        native.build()


def test_both_libraries_are_named_by_the_shared_header(tmp_path, monkeypatch):
    """Each library's name digests its source and the shared header: a change to the header
    rebuilds both."""
    for source in (xla_ffi._SOURCE, native._SOURCE):
        assert f'#include "{native_build.SHARED_HEADER.name}"' in source.read_text()
    before = [native_build.library_path(s, "c++", ()) for s in (xla_ffi._SOURCE, native._SOURCE)]
    assert before[0].name.startswith("xla_launch-") and before[1].name.startswith("native_launch-")
    header = tmp_path / "launch_params.h"
    header.write_text(native_build.SHARED_HEADER.read_text() + "// changed\n")
    monkeypatch.setattr(native_build, "SHARED_HEADER", header)
    after = [native_build.library_path(s, "c++", ()) for s in (xla_ffi._SOURCE, native._SOURCE)]
    assert all(a != b for a, b in zip(after, before, strict=True))


def test_unavailable_under_the_interpreter_or_without_a_driver(cache, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert native.available() == (False, "native launches are for CUDA devices")
    native.available.cache_clear()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("WOA_DIRECT_LAUNCH", "0")
    from torch_bridge.backends.triton import _common

    _common.direct_launches.cache_clear()
    try:
        assert native.available() == (False, "disabled by WOA_DIRECT_LAUNCH=0")
    finally:
        _common.direct_launches.cache_clear()


@needs_compiler
def test_without_a_driver_the_library_says_so(cache, monkeypatch, caplog):
    """This machine has no libcuda: the reason names it, and a launch or a parameter query
    returns the library's own error instead of touching a driver."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    lib = native._library()
    if lib.woa_native_missing() is None:
        pytest.skip("this machine has a CUDA driver")
    with caplog.at_level(logging.INFO, logger="woa"):
        assert native.available() == (False, "cannot open libcuda.so.1")
        assert native.available() == (False, "cannot open libcuda.so.1")
    assert [r.getMessage() for r in caplog.records] == [
        "eager layers keep one Triton launch per kernel: cannot open libcuda.so.1"]
    assert native._param_sizes(1, 4) is None
    bound = native.Native([], [], [])
    with pytest.raises(RuntimeError, match="woa native launch failed: the CUDA driver lacks"):
        bound(0, 0)


@needs_compiler
def test_packing_errors_have_text(cache):
    lib = native._library()
    texts = [lib.woa_native_error(-100 - code).decode() for code in range(1, 7)]
    assert texts == ["too many kernel parameters", "too few scalars", "too few tensor maps",
                     "TMA rank", "operand", "cuTensorMapEncodeTiled"]


def _descriptor(base, shape, strides, block, padding="zero"):
    return types.SimpleNamespace(base=base, shape=shape, strides=strides, block_shape=block,
                                 padding=padding)


def test_arguments_map_to_operands_by_identity():
    o, pos, out, w = (torch.zeros(4) for _ in range(4))
    table = [o, pos, out, None]
    args = (o, pos, 3, _descriptor(w, [8, 16], [16, 1], [8, 16]), out, out, w, 1)
    mapped = native._as_map_args(args, table)
    assert mapped == (xla_ffi.Ref(0), xla_ffi.Ref(1), 3, xla_ffi.Desc(4, (8, 16), 16, (8, 16),
                                                                        None),
                      xla_ffi.Ref(2), xla_ffi.Ref(2), xla_ffi.Ref(4), 1)
    assert table[4] is w and len(table) == 5


@pytest.mark.parametrize("arg", [0.5, _descriptor(torch.zeros(4), [8, 16], [16, 2], [8, 16]),
                                 _descriptor(torch.zeros(4), [8, 16], [16, 1], [8, 16], "nan"),
                                 _descriptor(torch.zeros(4), [2, 8, 16], [128, 16, 1],
                                             [1, 8, 16])])
def test_arguments_the_map_cannot_hold_bind_nothing(arg):
    assert native._as_map_args((torch.zeros(1), arg), [None] * 4) is None


def _compiled(**metadata):
    md = dict(num_ctas=1, global_scratch_size=0, profile_scratch_size=0,
              launch_cooperative_grid=False, launch_pdl=True, num_warps=4, shared=1024,
              tensordesc_meta=None)
    md.update(metadata)
    return types.SimpleNamespace(metadata=types.SimpleNamespace(**md), function=1234)


# A pointer, an i32, an i64 and a pointer, then Triton's two scratch pointers.
_ARGS = (xla_ffi.Ref(0), 7, 2**40, xla_ffi.Ref(5))
_SIZES = [8, 4, 8, 8, 8, 8]


def test_a_kernel_whose_parameters_match_the_map_is_bound(monkeypatch):
    monkeypatch.setattr(native, "_param_sizes", lambda function, count: list(_SIZES))
    keep = []
    step = native._step(_compiled(), (3, 2), _ARGS, keep)
    assert step is not None and step.function == 1234 and list(step.grid) == [3, 2, 1]
    assert (step.threads, step.shared, step.pdl) == (128, 1024, 1)
    params, scalars, _ = keep
    assert params.tolist() == [0, -1, -1, 5] and scalars.tolist() == [7, 2**40]
    assert step.params == params.ctypes.data and step.n_params == 4


@pytest.mark.parametrize("sizes", [
    _SIZES[:-1],                 # one parameter fewer than the map and the scratch
    _SIZES + [8],                # one more
    [4, 4, 8, 8, 8, 8],          # a pointer in a 4-byte parameter
    [8, 4, 4, 8, 8, 8],          # an i64 value in an i32 parameter
    [8, 4, 8, 8, 8, 4],          # a scratch slot that is not a pointer
    None,                        # the driver could not say
])
def test_a_kernel_that_disagrees_with_the_map_keeps_tritons_launch(monkeypatch, sizes):
    monkeypatch.setattr(native, "_param_sizes", lambda function, count: sizes)
    assert native._step(_compiled(), (1,), _ARGS, []) is None


@pytest.mark.parametrize("metadata", [dict(num_ctas=2), dict(global_scratch_size=64),
                                      dict(profile_scratch_size=8),
                                      dict(launch_cooperative_grid=True)])
def test_kernels_the_launcher_does_not_set_up_keep_tritons_launch(monkeypatch, metadata):
    monkeypatch.setattr(native, "_param_sizes", lambda function, count: list(_SIZES))
    assert native._step(_compiled(**metadata), (1,), _ARGS, []) is None


def test_bind_needs_the_launcher_and_a_launched_kernel(monkeypatch):
    o = torch.zeros(4)
    run = types.SimpleNamespace(compiled=lambda args: None, grid=(1,))
    monkeypatch.setattr(native, "available", lambda: (False, "no"))
    assert native.bind([(run, (o,))], (o,)) is None
    monkeypatch.setattr(native, "available", lambda: (True, "yes"))
    assert native.bind([(run, (o,))], (o,)) is None  # not launched yet
    assert native.bind([], tuple(torch.zeros(1) for _ in range(native.OPEN + 1))) is None


def test_bound_steps_keep_their_fixed_tensors(monkeypatch):
    """A fixed operand (a kept buffer, a weight) lives as long as the binding."""
    monkeypatch.setattr(native, "available", lambda: (True, "yes"))
    monkeypatch.setattr(native, "_param_sizes", lambda function, count: list(_SIZES))
    monkeypatch.setattr(native, "_library", lambda: types.SimpleNamespace(
        woa_native_launch=lambda *a: 0))
    o, fixed = torch.zeros(4), torch.zeros(4)
    run = types.SimpleNamespace(compiled=lambda args: _compiled(), grid=(2,))
    bound = native.bind([(run, (o, 7, 2**40, fixed))], (o,))
    assert bound is not None
    kept = bound._keep[-1]
    assert len(kept) == 1 and kept[0] is fixed
    assert np.frombuffer(ctypes.string_at(bound._fixed, 8), np.uint64)[0] == fixed.data_ptr()


class _Launches:
    """A stand-in for a bound ``Native``: records each call's stream and addresses."""

    def __init__(self):
        self.calls = []

    def __call__(self, stream, *addresses):
        self.calls.append((stream, addresses))


def test_a_runner_launches_with_the_buffers_it_makes_and_returns_the_last(monkeypatch):
    """Open operands in order: ``o``, positions, then each new buffer; the result is the last
    buffer (the output); every call gets its own buffers."""
    monkeypatch.setattr(native, "eager_stream", lambda tensors, device, pinned: 5)
    o, pos = torch.zeros(8, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int64)
    launches = _Launches()
    made = []

    def new():
        made.append((torch.zeros(2), torch.zeros(3)))
        return made[-1]
    run = native.runner(launches, o, pos, None, new)
    assert run.native
    first, second = run(o, pos), run(o, pos)
    assert first is made[0][1] and second is made[1][1] and first is not second
    tails, out = made[1]
    assert launches.calls[1] == (5, (o.data_ptr(), pos.data_ptr(), tails.data_ptr(),
                                     out.data_ptr()))
    one = native.runner(launches, o, pos, None, lambda: (out,))
    assert one(o, pos) is out and launches.calls[-1] == (5, (o.data_ptr(), pos.data_ptr(),
                                                             out.data_ptr()))


def test_a_runner_refuses_what_its_launches_cannot_take(monkeypatch):
    """``None`` (the op's path) for a stream ``eager_stream`` refuses, an ``o`` of another
    16-byte alignment than the bound one, or an installed launch hook; nothing launches."""
    stream = {"now": 5}
    monkeypatch.setattr(native, "eager_stream", lambda tensors, device, pinned: stream["now"])
    base = torch.zeros(64, dtype=torch.bfloat16)
    o, pos = base[:16], torch.zeros(4, dtype=torch.int64)
    launches = _Launches()
    run = native.runner(launches, o, pos, 5, lambda: (torch.zeros(1),))
    assert run(base[1:17], pos) is None  # 2 bytes off
    stream["now"] = None
    assert run(o, pos) is None
    stream["now"] = 5
    monkeypatch.setattr(native, "hooks_wanted", lambda: True)
    assert run(o, pos) is None
    assert launches.calls == []
