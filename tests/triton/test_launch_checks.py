"""Launcher checks that must refuse before any kernel runs (CPU; no kernel is launched)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch_bridge.backends.triton import _common, gemm, launch  # noqa: E402


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


def test_wgmma_relaunch_passes_every_argument_in_kernel_order(monkeypatch):
    """The direct relaunch of a compiled wgmma GEMM (no GPU here: the kernel and the stream are
    stand-ins) assembles the launcher's arguments by the kernel's own parameter names, passes
    Triton's launch metadata and profiler hooks as Triton's own path does, reuses the compiled
    kernel only for the same specialization, and leaves Triton's path to the first launch of
    each."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from torch_bridge.backends.triton import wgmma_kernels

    real = wgmma_kernels.batched_gemm_a8w8_mxscale_wgmma_kernel
    first_launches, relaunches = [], []

    Compiled = _stand_in_compiled(relaunches)

    class Kernel:
        arg_names = real.arg_names

        def __getitem__(self, grid):
            def launch_(**kwargs):
                first_launches.append((grid, kwargs))
                return Compiled()
            return launch_

    from triton import knobs

    monkeypatch.setattr(wgmma_kernels, "batched_gemm_a8w8_mxscale_wgmma_kernel", Kernel())
    monkeypatch.setattr(_common, "current_stream", lambda: 1234)
    # A profiler's hook: the launch metadata is built for it, as on Triton's own path.
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    monkeypatch.setattr(gemm, "COMPILED_WGMMA", {})
    g, n, k = 2, 256, 512
    w, ws = _fp8(g, n, k), torch.full((g, n // 128, k // 128), 127, dtype=torch.uint8)
    for m in (64, 128, 80, 72):
        x, xs = _fp8(m, g, k), torch.full((m, g, k // 128), 127, dtype=torch.uint8)
        out = torch.empty((m, g, n), dtype=torch.bfloat16)
        gemm._launch_wgmma(x, w, xs, ws, out, 64, 128, 128, 4, 4, 1, False)
        if m == 80:
            xs_80 = xs
    # M 64, 128 and 80 share a specialization (M % 16 == 0; 4 programs, one per interpreter
    # "SM"); M 72 (M % 16 == 8) is a new one.
    assert [kw["M"] for _, kw in first_launches] == [64, 72] and len(relaunches) == 2
    grid, kwargs = first_launches[0]
    assert grid == (4,) and list(kwargs) == list(real.arg_names)
    args = relaunches[-1]
    assert args[:9] == (4, 1, 1, 1234, "function", "metadata",
                        ("launch metadata", (4,), 1234, len(real.arg_names)),
                        knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    values = dict(zip(real.arg_names, args[9:], strict=True))
    assert isinstance(values["x_desc"], TensorDescriptor)
    assert values["x_desc"].shape == [80, g * k] and values["x_desc"].block_shape == [64, 128]
    assert values["w_desc"].shape == [g * n, k] and values["y_desc"].shape == [80, g * n]
    assert values["xs_ptr"].data_ptr() == xs_80.data_ptr() and values["M"] == 80
    assert values["STAGES"] == 4 and values["num_warps"] == 4 and values["G"] == g
    assert values["SWAP_AB"] is False


def test_relaunch_goes_straight_to_the_compiled_kernel_per_specialization(monkeypatch):
    """``_common.launch`` (no GPU here: the kernel and the stream are stand-ins) compiles through
    Triton's path once per specialization (plan key, argument dtypes, 16-byte alignment, integer
    value classes), then relaunches the compiled kernel with the runtime arguments followed by
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
    monkeypatch.setattr(_common, "current_stream", lambda: 99)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    monkeypatch.setattr(_common, "COMPILED", {})
    kernel = Kernel()
    x, y = torch.zeros(64), torch.zeros(64)
    calls = [((x, 32, y), "k"), ((x, 48, y), "k"),  # 32 and 48: both multiples of 16
             ((x, 1, y), "k"),  # == 1: a new specialization
             ((x[1:], 32, y), "k"),  # misaligned pointer: new
             ((x.double(), 32, y), "k"),  # dtype: new
             ((x, 32, y), "other plan")]  # another plan key: new
    for args, key in calls:
        _common.launch(kernel, (3, 2), args, {"BLOCK": 16}, key)
    assert len(first_launches) == 5 and len(relaunches) == 1
    assert first_launches[0] == ((3, 2), (x, 32, y), {"BLOCK": 16})
    assert relaunches[0] == (3, 2, 1, 99, "function", "metadata",
                             ("launch metadata", (3, 2), 99, 5), knobs.runtime.launch_enter_hook,
                             knobs.runtime.launch_exit_hook, x, 48, y, 16, True)


def test_bound_launch_fills_its_tensor_slots_and_refuses_other_specializations(monkeypatch):
    """``_common.bind`` (stand-in compiled kernel, no GPU): the bound launch passes the new
    tensors in their slots and the bound ints and constexprs; a misaligned tensor, another
    current device or a dispatch mode make it refuse (the caller then takes the op's path)."""
    from triton import knobs

    runs = []
    Compiled = _stand_in_compiled(runs)

    monkeypatch.setattr(_common, "current_stream", lambda: 7)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    monkeypatch.setattr(_common.torch.cuda, "current_device", lambda: None)  # CPU: index None
    x, y = torch.zeros(64), torch.zeros(64)
    args = (x, 5, y)
    monkeypatch.setattr(_common, "COMPILED", {
        ("plan", *map(_common._specialization, args)): (Compiled(), (16, True))})
    monkeypatch.setattr(_common, "BOUND_GRIDS", {"plan": (4, 2)})
    assert _common.bind("other plan", args, (0, 2)) is None
    bound = _common.bind("plan", args, (0, 2))
    x2, y2 = torch.ones(64), torch.ones(64)
    assert bound((x2, y2)) is True
    assert runs == [(4, 2, 1, 7, "function", "metadata", None, None,
                     knobs.runtime.launch_exit_hook, x2, 5, y2, 16, True)]
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
    assert len(runs) == 1
