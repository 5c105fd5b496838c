"""Launcher checks that must refuse before any kernel runs (CPU; no kernel is launched)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch_bridge.backends.triton import _common, configs, gemm, launch  # noqa: E402


def _stand_in_compiled(runs: list):
    """A class standing in for a compiled Triton kernel: ``run`` records its arguments."""
    class Compiled:
        function, packed_metadata = "function", "metadata"

        def launch_metadata(self, grid, stream, *args):
            return ("launch metadata", grid, stream, len(args))

        def run(self, *args):
            runs.append(args)
    return Compiled


def _fp8(*shape):
    return torch.zeros(shape, dtype=torch.float8_e4m3fn)


def test_explicit_wgmma_config_refuses_operands_it_cannot_tile(monkeypatch):
    """The default shape falls back to the Triton kernels; an explicit wgmma config must not
    quietly run (and be timed as) the pointer kernel instead."""
    monkeypatch.setattr(gemm, "wgmma_available", lambda index: (True, "ok"))
    cfg = launch.GemmConfig(64, 128, num_warps=4, wgmma=True)
    x = _fp8(2, 65, 256).transpose(0, 1)  # [M, G, K] view of [G, M, K]: not TMA-viewable
    w, ws = _fp8(2, 128, 256), torch.full((2, 1, 2), 127, dtype=torch.uint8)
    xs = torch.full((65, 2, 2), 127, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"GemmConfig\(wgmma=True\) needs .* x strides"):
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, config=cfg)
    xs32 = torch.full((65, 2, 8), 127, dtype=torch.uint8)  # 32-wide blocks: block_n 128 > 32
    with pytest.raises(ValueError, match=r"block_n dividing the scale block \(32\)"):
        launch.batched_gemm_a8w8_mxscale(x.contiguous(), w, xs32,
                                         torch.full((2, 4, 8), 127, dtype=torch.uint8),
                                         config=cfg)


@pytest.mark.parametrize("half", [24, 512])
def test_inplace_rope_rejects_rd_that_is_no_tile(half):
    o = torch.zeros((2, 4, 512), dtype=torch.bfloat16)
    pos = torch.zeros(2, dtype=torch.int64)
    cos = torch.ones((8, half), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"rd = 2 \\* cos_cache.shape\\[1\\] = {2 * half}"):
        launch.inverse_rope(o, pos, cos, cos)


@pytest.mark.parametrize("persistent", [False, True], ids=["plain", "warp_specialized"])
def test_wgmma_relaunch_passes_every_argument_in_kernel_order(monkeypatch, persistent):
    """The direct relaunch of a compiled wgmma GEMM, the plain kernel or (persistent tiles) the
    warp-specialized one (no GPU here: the kernel and the stream are stand-ins), assembles the
    launcher's arguments by the kernel's own parameter names, passes Triton's launch metadata
    and profiler hooks as Triton's own path does, reuses the compiled kernel only for the same
    specialization, and leaves Triton's path to the first launch of each."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from torch_bridge.backends.triton import wgmma_kernels, wgmma_ws_kernels

    module, name = ((wgmma_ws_kernels, "batched_gemm_a8w8_mxscale_wgmma_ws_kernel") if persistent
                    else (wgmma_kernels, "batched_gemm_a8w8_mxscale_wgmma_kernel"))
    real = getattr(module, name)
    first_launches, relaunches = [], []

    Compiled = _stand_in_compiled(relaunches)

    class Kernel:
        arg_names, params = real.arg_names, real.params

        def __getitem__(self, grid):
            def launch_(*args, **kwargs):
                named = dict(zip(real.arg_names, args, strict=False))
                first_launches.append((grid, {**named, **kwargs}))
                return Compiled()
            return launch_

    from triton import knobs

    monkeypatch.setattr(module, name, Kernel())
    monkeypatch.setattr(_common, "interpreter_on", lambda: False)
    monkeypatch.setattr(_common, "current_stream", lambda *device: 1234)
    # A profiler's hook: the launch metadata is built for it, as on Triton's own path.
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    monkeypatch.setattr(_common, "LAUNCHES", {})
    monkeypatch.setattr(gemm, "sm_count", lambda index: 4)  # the interpreter's, on a GPU too
    g, n, k = 2, 256, 512
    w, ws = _fp8(g, n, k), torch.full((g, n // 128, k // 128), 127, dtype=torch.uint8)
    for m in (64, 64, 80, 80):
        x, xs = _fp8(m, g, k), torch.full((m, g, k // 128), 127, dtype=torch.uint8)
        out = torch.empty((m, g, n), dtype=torch.bfloat16)
        gemm._batched_gemm_a8w8_mxscale_op.launch_fn(x, w, xs, ws, out, *_WGMMA_FIELDS[:7],
                                                     int(persistent), *_WGMMA_FIELDS[8:])
    # Each signature's first launch goes through Triton, its repeat straight to the kernel.
    assert [kw["M"] for _, kw in first_launches] == [64, 80] and len(relaunches) == 2
    grid, kwargs = first_launches[0]
    assert grid == (4,) and sorted(kwargs) == sorted(real.arg_names)
    args = relaunches[-1]
    gx = 4 if persistent else 8  # M 80: 8 tiles, or one program per SM (4 here)
    assert args[:9] == (gx, 1, 1, 1234, "function", "metadata",
                        ("launch metadata", (gx, 1, 1), 1234, len(real.arg_names)),
                        knobs.runtime.launch_enter_hook, None)
    values = dict(zip(real.arg_names, args[9:], strict=True))
    assert isinstance(values["x_desc"], TensorDescriptor)
    assert values["x_desc"].shape == [80, g * k] and values["x_desc"].block_shape == [64, 128]
    assert values["w_desc"].shape == [g * n, k] and values["y_desc"].shape == [80, g * n]
    assert values["xs_ptr"].data_ptr() == xs.data_ptr() and values["M"] == 80
    assert values["STAGES"] == 4 and values["num_warps"] == 4 and values["G"] == g
    assert values["SWAP_AB"] is False
    if persistent:
        assert values["PRODUCER_NUM_REGS"] == configs.WS_PRODUCER_REGS


#: ``GemmConfig``'s fields of a wgmma launch: 64 x 128 tiles, 4 warps, 4 stages, one program
#: per SM (the warp-specialized kernel).
_WGMMA_FIELDS = (64, 128, 1, False, 4, 4, False, 1, True, False)


def _stand_in_plan(kernel, grid, constexprs):
    from torch_bridge.backends.triton import plans

    return plans.Plan(kernel, grid, constexprs, num_warps=4)


def test_relaunch_goes_straight_to_the_compiled_kernel_per_specialization(monkeypatch):
    """``_common.Launch`` (no GPU here: the kernel and the stream are stand-ins) compiles through
    Triton's path once per specialization (argument dtypes, 16-byte alignment, integer value
    classes), then relaunches the compiled kernel with the runtime arguments followed by
    every constexpr in parameter order (defaults included) and Triton's metadata and hooks."""
    import inspect

    from triton import knobs

    first_launches, relaunches = [], []

    Compiled = _stand_in_compiled(relaunches)

    def fake(x_ptr, n, y_ptr, BLOCK, FLAG=True):  # a kernel's signature, not run
        raise AssertionError

    class Kernel:
        params = [type("P", (), {"name": p.name, "default": p.default})()
                  for p in inspect.signature(fake).parameters.values()]

        def __getitem__(self, grid):
            def launch_(*args, **constexprs):
                first_launches.append((grid, args, constexprs))
                return Compiled()
            return launch_

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(_common, "current_stream", lambda *device: 99)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    kernel = Kernel()
    one, other = (_common.Launch(_stand_in_plan(kernel, (3, 2), {"BLOCK": 16}))
                  for _ in range(2))
    x, y = torch.zeros(64), torch.zeros(64)
    calls = [((x, 32, y), one), ((x, 48, y), one),  # 32 and 48: both multiples of 16
             ((x, 1, y), one),  # == 1: a new specialization
             ((x[1:], 32, y), one),  # misaligned pointer: new
             ((x.double(), 32, y), one),  # dtype: new
             ((x, 32, y), other)]  # another launch signature: new
    for args, run in calls:
        run(args)
    assert len(first_launches) == 5 and len(relaunches) == 1
    assert first_launches[0] == ((3, 2), (x, 32, y), {"BLOCK": 16, "num_warps": 4})
    assert relaunches[0] == (3, 2, 1, 99, "function", "metadata",
                             ("launch metadata", (3, 2, 1), 99, 5), knobs.runtime.launch_enter_hook,
                             None, x, 48, y, 16, True)


def test_bound_launch_fills_its_tensor_slots_and_refuses_other_specializations(monkeypatch):
    """``Launch.bind`` (stand-in compiled kernel, no GPU): the bound launch passes the new
    tensors' addresses in their slots and the bound ints and constexprs; a misaligned tensor,
    another current device or a dispatch mode make it refuse (the caller then takes the op's
    path)."""
    from triton import knobs

    runs = []
    Compiled = _stand_in_compiled(runs)

    monkeypatch.setattr(_common, "current_stream", lambda *device: 7)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(_common.torch.cuda, "current_device", lambda: None)  # CPU: index None
    contexts = []
    monkeypatch.setattr(_common, "context_current", contexts.append)
    x, y = torch.zeros(64), torch.zeros(64)
    args = (x, 5, y)
    run = _compiled_launch((4, 2), args, Compiled(), (16, True))
    assert _common.Launch(run.plan).bind(args, (0, 2)) is None  # not launched yet
    bound = run.bind(args, (0, 2))
    x2, y2 = torch.ones(64), torch.ones(64)
    assert bound((x2, y2)) is True
    assert runs == [(4, 2, 1, 7, "function", "metadata", None, None,
                     None, x2.data_ptr(), 5, y2.data_ptr(), 16, True)]
    assert contexts == [None], "the launch did not make its device's context current first"
    import gc
    import weakref

    first = weakref.ref(x)
    del x, args
    gc.collect()
    assert first() is None, "the binding call's tensors must not be kept"
    assert bound((x2[1:], y2)) is False  # 4 bytes in: not 16-byte aligned
    monkeypatch.setattr(_common.torch.cuda, "current_device", lambda: 1)
    assert bound((x2, y2)) is False
    monkeypatch.setattr(_common.torch.cuda, "current_device", lambda: None)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert bound((x2, y2)) is False

    class Sub(torch.Tensor):
        pass

    assert bound((x2.as_subclass(Sub), y2)) is False
    assert len(runs) == 1
    # Only the call's inputs (the leading ``checked``) are checked: the rest are the caller's.
    inputs_only = run.bind((x2, 5, y2), (0, 2), checked=1)
    assert inputs_only((x2, y2[1:])) is True and inputs_only((x2[1:], y2)) is False


def test_pinned_bound_launch_refuses_other_streams_and_captures(monkeypatch):
    """A bound launch whose scratch belongs to one stream runs only on that stream, and never
    into a CUDA-graph capture (the graph would share the scratch with eager launches)."""
    from triton import knobs

    runs = []
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(_common.torch.cuda, "current_device", lambda: None)
    monkeypatch.setattr(_common.torch.cuda, "is_current_stream_capturing", lambda: False)
    stream = [7]
    monkeypatch.setattr(_common, "current_stream", lambda *device: stream[0])
    x = torch.zeros(64)
    run = _compiled_launch((1,), (x,), _stand_in_compiled(runs)(), ())
    bound = run.bind((x,), (0,), stream=7)
    assert bound((x,)) is True and len(runs) == 1
    stream[0] = 8
    assert bound((x,)) is False
    stream[0] = 7
    monkeypatch.setattr(_common.torch.cuda, "is_current_stream_capturing", lambda: True)
    assert bound((x,)) is False
    assert run.bind((x,), (0,))((x,)) is True  # unpinned: any stream, captures too
    assert len(runs) == 2


def _compiled_launch(grid, args, compiled, tail) -> _common.Launch:
    """A launch whose kernel was compiled for ``args``' specialization (a stand-in)."""
    run = _common.Launch(_stand_in_plan(None, grid, {}))
    run._compiled[tuple(map(_common._specialization, args))] = (compiled, tail)
    return run


def _descriptor_kernel(raw_launches: list, metas=({"m": 0}, {"m": 1}, {"m": 2})):
    """A stand-in compiled kernel whose launcher wraps the raw launch in a descriptor step, as
    Triton's (3.6 to 3.9) does."""
    class Launcher:
        def __init__(self):
            def launcher(*args):  # the raw C launch: records what it was given
                raw_launches.append(args)

            def inner(*args):  # Triton's descriptor step: expands, then launches
                return launcher(*args, "expanded by the step")
            self.launch = inner

        def __call__(self, grid0, grid1, grid2, stream, function, *args):
            self.launch(grid0, grid1, grid2, stream, function, "coop", "pdl", *args)

    class Compiled:
        function, packed_metadata = "function", "metadata"
        metadata = type("Metadata", (), {"tensordesc_meta": list(metas)})()
        run = Launcher()
    return Compiled()


def test_descriptor_launcher_takes_the_raw_launch_out_of_tritons_wrapper(monkeypatch):
    from triton.backends.nvidia import driver as nvidia

    made = []
    monkeypatch.setattr(nvidia, "make_tensordesc_arg",
                        lambda desc, meta, *rest: made.append((desc, meta, rest)) or ["map"])
    raw = []
    compiled = _descriptor_kernel(raw)
    run, expand = _common.descriptor_launcher(compiled)
    assert run is not compiled.run and compiled.run.launch.__name__ == "inner"
    run(1, 1, 1, 5, "function", "metadata", None, None, None, "map", 3)
    assert raw == [(1, 1, 1, 5, "function", "coop", "pdl", "metadata", None, None, None, "map",
                    3)]
    assert expand(2, "desc") == ["map"] and made[0][:2] == ("desc", {"m": 2})
    assert _common.descriptor_launcher(_descriptor_kernel([], metas=())) is None
    no_wrapper = _descriptor_kernel([])
    no_wrapper.run.launch = print  # a launcher without Triton's descriptor step
    assert _common.descriptor_launcher(no_wrapper) is None


def test_bound_wgmma_gemm_keeps_descriptor_expansions_per_base_address(monkeypatch):
    """``gemm.WgmmaBound`` (stand-in kernel, no GPU): arguments in kernel order with each
    descriptor expanded, CUtensorMaps made once per base address and descriptor, and the op's
    path for a misaligned x, a launch hook that wants metadata or a dispatch mode."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton import knobs
    from triton.backends.nvidia import driver as nvidia

    from torch_bridge.backends.triton import wgmma_kernels

    raw = []
    made = []

    def make(desc, meta, *rest):
        made.append((desc.base.data_ptr(), meta["m"]))
        return [f"map{meta['m']}", *desc.shape, *desc.strides]

    real = wgmma_kernels.batched_gemm_a8w8_mxscale_wgmma_kernel

    class Kernel:
        arg_names, params = real.arg_names, real.params

        def __getitem__(self, grid):
            return lambda *args, **kwargs: _descriptor_kernel(raw)

    monkeypatch.setattr(wgmma_kernels, "batched_gemm_a8w8_mxscale_wgmma_kernel", Kernel())
    monkeypatch.setattr(nvidia, "make_tensordesc_arg", make)
    monkeypatch.setattr(_common, "LAUNCHES", {})
    monkeypatch.setattr(_common, "interpreter_on", lambda: False)
    monkeypatch.setattr(gemm, "sm_count", lambda index: 4)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(_common.torch.cuda, "current_device", lambda: None)
    monkeypatch.setattr(_common, "context_current", lambda device: None)  # CPU: no context
    monkeypatch.setattr(_common, "current_stream", lambda *device: 3)
    g, n, k, m = 2, 256, 512, 8
    w, ws = _fp8(g, n, k), torch.full((g, n // 128, k // 128), 127, dtype=torch.uint8)
    x, xs = _fp8(m, g, k), torch.full((m, g, k // 128), 127, dtype=torch.uint8)
    out = torch.empty((m, g, n), dtype=torch.bfloat16)
    run, launch_args = gemm._gemm_launch(x, w, xs, ws, out, (8, 64, 1, True, 4, 8, False, 0,
                                                             True))
    assert gemm.WgmmaBound.of(run, launch_args, out) is None  # nothing compiled yet
    run(launch_args)
    bound = gemm.WgmmaBound.of(run, launch_args, out)
    y = bound(x, w, xs, ws)
    assert y.shape == (m, g, n) and y.dtype == torch.bfloat16
    (args,) = raw
    assert args[:11] == (8, 1, 1, 3, "function", "coop", "pdl", "metadata", None, None,
                         None)
    assert args[11:16] == ("map0", m, g * k, k * g, 1)
    assert args[16:21] == ("map1", g * n, k, k, 1) and args[21:26] == ("map2", m, g * n, g * n, 1)
    assert args[26:30] == (xs.data_ptr(), ws.data_ptr(), m, 8)  # scale addresses, M, programs
    assert args[30] == args[31] == y.data_ptr()  # unsplit: the output stands in for the scratch
    assert len(args) == 30 + len(Kernel.arg_names) - 7
    again = bound(x, w, xs, ws)  # y is alive: a new output address, x and w the same
    assert len(raw) == 2 and again.data_ptr() != y.data_ptr()
    assert [meta for _, meta in made] == [0, 1, 2, 2], "x's and w's maps are made once"
    assert raw[1][11:21] == args[11:21] and raw[1][21] == "map2"
    flat = _fp8(m * g * k + 16)
    assert bound(flat[1:m * g * k + 1].view(m, g, k), w, xs, ws) is None  # misaligned x
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    assert bound(x, w, xs, ws) is None  # a hook reads Triton's metadata: the op's path
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert bound(x, w, xs, ws) is None
    assert len(raw) == 2
    # A given output is written (its map kept per address, its version bumped); a misaligned
    # one takes the op's path.
    version = out._version
    for _ in range(2):
        assert bound(x, w, xs, ws, out) is out
    assert out._version == version + 2 and len(raw) == 4 and made.count((out.data_ptr(), 2)) == 1
    outs = torch.empty((m * g * n + 8,), dtype=torch.bfloat16)
    assert bound(x, w, xs, ws, outs[1:m * g * n + 1].view(m, g, n)) is None


def test_split_k_parts_are_the_streams_when_eager_and_the_launchs_own_when_captured(
        monkeypatch):
    """Eager split launches on one stream never overlap: they share one parts buffer (grown
    when a launch needs more), as they share their counters; a captured launch gets its own."""
    from torch_bridge.backends.triton import split_k

    monkeypatch.setattr(split_k, "COUNTER_POOLS", {})
    split, parts, _ = split_k.split_scratch(torch.empty((1, 2, 64)), 4, 2)
    assert split == 4 and parts.shape == (4, 1, 2, 64) and parts.dtype == torch.float32
    again = split_k.split_scratch(torch.empty((1, 2, 32)), 2, 2)[1]
    assert again.shape == (2, 1, 2, 32) and again.data_ptr() == parts.data_ptr()
    grown = split_k.split_scratch(torch.empty((4, 2, 64)), 4, 2)[1]
    assert grown.numel() == 4 * 4 * 2 * 64
    assert split_k.split_scratch(torch.empty((1, 2, 64)), 4, 2)[1].data_ptr() == \
        grown.data_ptr()
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    captured = [split_k.split_scratch(torch.empty((1, 2, 64)), 4, 2)[1] for _ in range(2)]
    assert len({t.data_ptr() for t in (grown, *captured)}) == 3


def test_launch_hooks_pass_empty_chains_as_none_and_want_metadata_only_for_a_hook(monkeypatch):
    """Triton keeps an empty ``HookChain`` in each knob: passed as ``None`` (it does nothing);
    the launch metadata is built when a hook would read it, as Triton builds it (only while
    the enter knob is not ``None``)."""
    from triton import knobs
    from triton.knobs import HookChain

    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", HookChain())
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", HookChain(reversed=True))
    assert _common.launch_hooks() == (None, None, False)
    leave = HookChain(reversed=True)
    leave.add(print)
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", leave)
    assert _common.launch_hooks() == (None, leave, True)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    assert _common.launch_hooks() == (None, leave, False)


def _cuda_launcher(layout: str, raw: list, **fields):
    """A stand-in for Triton's ``CudaLauncher`` of one C-launch layout: ``"3.6"`` (the
    arguments spread out) or ``"3.7"`` (annotations, signature, then one tuple)."""
    if layout == "3.6":
        class CudaLauncher:
            def __call__(self, gridX, gridY, gridZ, stream, function, *args):
                raise AssertionError("the Python step must be skipped")
    else:
        class CudaLauncher:
            arg_annotations, kernel_signature = "annotations", "signature"

            def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata,
                         launch_metadata, launch_enter_hook, launch_exit_hook, *args):
                raise AssertionError("the Python step must be skipped")
    run = CudaLauncher()
    run.launch = lambda *args: raw.append(args)
    run.launch_cooperative_grid, run.launch_pdl = "coop", "pdl"
    run.global_scratch_size = run.profile_scratch_size = 0
    for name, value in fields.items():
        setattr(run, name, value)

    class Compiled:
        function, packed_metadata = "function", "metadata"

        def launch_metadata(self, grid, stream, *args):
            return ("launch metadata", grid, stream, len(args))
    compiled = Compiled()
    compiled.run = run
    return compiled


@pytest.mark.parametrize("layout", ["3.6", "3.7"])
def test_raw_launch_calls_the_c_launch_in_its_layout(layout):
    """``_common.raw_launch`` passes what Triton's step would (no scratch: ``None`` twice) in
    the C launch's order, with launch metadata only when a hook wants it."""
    raw = []
    go = _common.raw_launch(_cuda_launcher(layout, raw))
    go(3, 2, 1, 7, [1, 2], "enter", "leave", False)
    go(3, 2, 1, 7, [1, 2], "enter", "leave", True)
    meta = ("launch metadata", (3, 2, 1), 7, 2)
    if layout == "3.6":
        assert raw == [(3, 2, 1, 7, "function", "coop", "pdl", None, None, "metadata", None,
                        "enter", "leave", 1, 2),
                       (3, 2, 1, 7, "function", "coop", "pdl", None, None, "metadata", meta,
                        "enter", "leave", 1, 2)]
    else:
        assert raw == [(3, 2, 1, 7, "function", "coop", "pdl", "metadata", None, "enter",
                        "leave", None, None, "annotations", "signature", (1, 2)),
                       (3, 2, 1, 7, "function", "coop", "pdl", "metadata", meta, "enter",
                        "leave", None, None, "annotations", "signature", (1, 2))]


def test_raw_launch_leaves_kernels_with_scratch_and_unknown_launchers_to_triton():
    assert _common.raw_launch(_cuda_launcher("3.7", [], global_scratch_size=64)) is None
    assert _common.raw_launch(_cuda_launcher("3.7", [], profile_scratch_size=8)) is None
    assert _common.raw_launch(_cuda_launcher("3.7", [], gsan_enabled=True)) is None
    odd = _cuda_launcher("3.6", [], arg_annotations="a layout of neither kind")
    assert _common.raw_launch(odd) is None
    assert _common.raw_launch(_stand_in_compiled([])()) is None  # not a CudaLauncher


@pytest.mark.parametrize("version,ok", [("3.6.0", True), ("3.9.1+git0a1b2c", True),
                                        ("3.5.1", False), ("3.10.0", False), ("4.0.0", False),
                                        ("nightly", False)])
def test_direct_launches_only_on_the_triton_releases_of_a_known_layout(monkeypatch, version,
                                                                       ok):
    import triton

    monkeypatch.setattr(triton, "__version__", version)
    _common.direct_launches.cache_clear()
    try:
        got, why = _common.direct_launches()
    finally:
        _common.direct_launches.cache_clear()
    assert got is ok
    assert version in why


def test_woa_direct_launch_0_turns_them_off(monkeypatch):
    from torch_bridge import _dispatch

    monkeypatch.setenv("WOA_DIRECT_LAUNCH", "0")
    _dispatch.reset_caches()
    try:
        assert _common.direct_launches() == (False, "disabled by WOA_DIRECT_LAUNCH=0")
    finally:
        monkeypatch.delenv("WOA_DIRECT_LAUNCH")
        _dispatch.reset_caches()
    assert _common.direct_launches()[0]


def test_an_unknown_launch_layout_takes_tritons_public_launch_on_every_call(monkeypatch):
    """Outside the known releases a repeat is launched as the first call was, through
    ``kernel[grid](...)``: nothing compiled is kept, nothing is bound."""
    monkeypatch.setattr(_common, "interpreter_on", lambda: False)
    monkeypatch.setattr(_common, "direct_launches", lambda: (False, "an unknown layout"))
    calls = []

    class Kernel:
        params = ()

        def __getitem__(self, grid):
            def run(*args, **constexprs):
                calls.append((grid, args, constexprs))
                return _stand_in_compiled([])()
            return run

    run = _common.Launch(_stand_in_plan(Kernel(), (4, 2), {"BLOCK": 16}))
    for _ in range(3):
        run((1, 2))
    assert calls == [((4, 2), (1, 2), {"BLOCK": 16, "num_warps": 4})] * 3
    assert run.compiled((1, 2)) is None and run.bind((1, 2), ()) is None


@pytest.mark.parametrize("env,m,g,dependent", [
    (None, 64, 2, True), (None, 256, 2, True), ("0", 64, 2, False), ("1", 64, 2, True),
    (None, 16, 2, True),  # the swapped wgmma tile, split
    (None, 16, 4, False),  # the pointer GEMM waits before its first load: nothing to overlap
])
def test_chain_launches_its_wgmma_gemm_as_the_quants_dependent(monkeypatch, env, m, g,
                                                               dependent):
    """The unfused chain makes its GEMM a programmatic dependent of its quant where the GEMM is
    the wgmma kernel (it streams weight before waiting) and the device takes one, unless
    ``WOA_PDL=0``; the quant then launches as one too, and the GEMM's default shape says so."""
    from torch_bridge.backends.triton import configs

    if env is None:
        monkeypatch.delenv("WOA_PDL", raising=False)
    else:
        monkeypatch.setenv("WOA_PDL", env)
    monkeypatch.setattr(_common, "_PDL", {("capable", 0): True})  # a Hopper, as far as PDL goes
    monkeypatch.setattr(gemm, "wgmma_available", lambda index: (True, "wgmma"))
    cuda = torch.device("cuda", 0)
    n, k, block = 1024, 4096, 128
    assert gemm.chain_dependent(m, g, n, k, block, cuda) is dependent
    # The chain's quant before a dependent GEMM is one at any size (alone, up to 1024 rows).
    heads = 8 * g
    assert configs.quant_config(m, heads=heads, dependent=dependent).pdl is (
        dependent or m * heads <= 1024)
    assert gemm.default_config(m, g, n, k, block, cuda, dependent).pdl is dependent
    plain = gemm.default_config(m, g, n, k, block, cuda, False)
    # Asked for (the chain decides), the launch differs, never the shape: the chain's bits
    # are the GEMM's alone.
    assert gemm.default_config(m, g, n, k, block, cuda, True) == dataclasses.replace(
        plain, pdl=plain.wgmma)
    # Nowhere else: not on CPU, not where the device takes no programmatic launch.
    assert not gemm.chain_dependent(m, g, n, k, block, torch.device("cpu"))
    monkeypatch.setattr(_common, "_PDL", {("capable", 0): False})
    assert not gemm.chain_dependent(m, g, n, k, block, cuda)
    assert not gemm.default_config(m, g, n, k, block, cuda, True).pdl
    # A shape that asks for it launches as a dependent on such a device only.
    assert not _common.pdl(0, True)
    monkeypatch.setattr(_common, "_PDL", {("capable", 0): True})
    assert _common.pdl(0, True) is (env != "0") and _common.pdl(0, False) == (env == "1")


def test_woa_pdl_1_makes_every_quant_and_pointer_gemm_a_dependent(monkeypatch):
    """``WOA_PDL=1`` makes every quant and pointer GEMM launch a programmatic dependent (each
    waits before its first load, so any kernel may precede it); unset, those whose shape asks
    (small quants, the chain's quant and wgmma GEMM); ``0``, none."""
    for env, every, chain in ((None, False, True), ("0", False, False), ("1", True, True)):
        monkeypatch.setattr(_common, "_PDL", {("capable", 0): True})  # WOA_PDL read anew
        if env is None:
            monkeypatch.delenv("WOA_PDL", raising=False)
        else:
            monkeypatch.setenv("WOA_PDL", env)
        assert (_common.pdl(0), _common.chain_pdl(0)) == (every, chain), env
        assert _common.pdl(0, True) is chain, env
    monkeypatch.setattr(_common, "_PDL", {("capable", 0): True})
    monkeypatch.setenv("WOA_PDL", "yes")
    with pytest.raises(ValueError, match="WOA_PDL='yes' is not a valid switch"):
        _common.chain_pdl(0)
