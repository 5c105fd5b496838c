"""The native eager launcher on the GPU (``pytest -m gpu``): the FP8 decode layers bind it (the
fused kernel, or the quant and the GEMM in one native call), as does the BF16 layer on each of
its routes, and every repeat gives the op path's bits; a launch hook or a misaligned input
takes the op's path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from inputs import checkpoint, new_seed, rope_inputs, xla_memory  # noqa: E402, F401

pytestmark = pytest.mark.gpu


def test_the_launcher_builds_and_finds_the_driver():
    from torch_bridge.backends.triton import native

    assert native.available() == (True, "native launcher built")


def _layer(g: int, s: int, seed: int):
    import torch_bridge as tb

    w, ws = checkpoint(g, seed)
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=torch.float32)
    return tb.WoAProjection(w, ws, g, cos, sin), w, ws, o, pos, cos, sin


def _want(o, pos, cos, sin, w, ws, g):
    from torch_bridge.backends.triton import launch

    return launch.wo_a_fp8(o, pos, cos, sin, w.view(g, -1, w.shape[1]),
                           ws.view(g, -1, ws.shape[1]), g)


# Fused (G 16 and 4 at one token, split at G 4), then quant and GEMM: the split swapped GEMM
# as the quant's dependent (G 2, 1 and 16 tokens), wgmma tiles (64 to 256 tokens) and G 16 at
# the kept buffers' bound.
@pytest.mark.parametrize("g,s", [(16, 1), (4, 1), (2, 1), (2, 16), (8, 16), (2, 64), (4, 128),
                                 (2, 256), (16, 64), (16, 256)])
def test_decode_layer_binds_the_native_launcher_with_the_op_paths_bits(g, s):
    seed = new_seed()
    layer, w, ws, o, pos, cos, sin = _layer(g, s, seed)
    assert torch.equal(layer(o, pos), _want(o, pos, cos, sin, w, ws, g)), f"seed {seed}"
    (bound,) = [p.eager for p in layer._plans.values() if p.eager]
    assert getattr(bound, "native", False), "the native launcher was not bound"
    for trial in range(3):  # new values (and addresses) each call
        o2, pos2, _, _ = rope_inputs(s, g, seed + trial + 1)
        y = layer(o2, pos2)
        want = _want(o2, pos2, cos, sin, w, ws, g)
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), f"seed {seed}"


# The BF16 layer's routes: one launch (G 16 at 1 token, G 2 at 16), a rotated copy and cuBLAS
# (G 2 at 64 and 256), the rotated tails and the BF16 GEMM (G 16 from 128 tokens, G 2 at 1024).
@pytest.mark.parametrize("g,s", [(16, 1), (2, 16), (2, 64), (2, 256), (16, 128), (16, 256),
                                 (2, 1024)])
def test_bf16_layer_binds_the_native_launcher_with_the_op_paths_bits(g, s):
    import torch_bridge as tb
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    w, ws = checkpoint(g, seed)
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=torch.float32)
    layer = tb.WoAProjection(w, ws, g, cos, sin, backend="bf16")
    layer(o, pos)
    (bound,) = [p.eager for p in layer._plans.values() if p.eager]
    assert getattr(bound, "native", False), "the native launcher was not bound"
    w_bf16 = layer.weight_bf16.cuda()
    for trial in range(3):  # new values (and addresses) each call
        o2, pos2, _, _ = rope_inputs(s, g, seed + trial + 1)
        before = o2.clone()
        y = layer(o2, pos2)
        assert torch.equal(o2, before), "o was written"
        want = launch.wo_a_bf16(o2, pos2, cos, sin, w_bf16, g)
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), f"seed {seed}"


def test_native_calls_back_to_back_on_one_layer_keep_each_calls_bits():
    """Many calls queued before any finishes: each output is its own call's."""
    seed = new_seed()
    layer, w, ws, o, pos, cos, sin = _layer(2, 64, seed)
    layer(o, pos)
    inputs = [rope_inputs(64, 2, seed + i + 1)[:2] for i in range(32)]
    outs = [layer(o2, p2) for o2, p2 in inputs]
    for (o2, p2), y in zip(inputs, outs, strict=True):
        assert torch.equal(y, _want(o2, p2, cos, sin, w, ws, 2)), f"seed {seed}"


def test_a_launch_hook_takes_the_op_path(monkeypatch):
    """A profiler's hook sees every launch (another stream and a capture: the bound-launch
    tests of ``test_gpu_eager``, which now run this launcher)."""
    from triton import knobs

    seed = new_seed()
    layer, w, ws, o, pos, cos, sin = _layer(2, 64, seed)
    want = layer(o, pos)
    (bound,) = [p.eager for p in layer._plans.values() if p.eager]
    assert torch.equal(bound(o, pos), want)
    seen = []
    with monkeypatch.context() as m:
        m.setattr(knobs.runtime, "launch_enter_hook", seen.append)
        assert bound(o, pos) is None
        assert torch.equal(layer(o, pos), want), f"seed {seed}"
    assert seen, "the hook saw no launch"


def test_a_misaligned_o_takes_the_op_path():
    seed = new_seed()
    layer, w, ws, o, pos, cos, sin = _layer(2, 16, seed)
    want = layer(o, pos)
    base = torch.empty((o.numel() + 1,), dtype=o.dtype, device=o.device)
    shifted = base[1:].view(o.shape)
    shifted.copy_(o)
    (bound,) = [p.eager for p in layer._plans.values() if p.eager]
    assert bound(shifted, pos) is None
    assert torch.equal(layer(shifted, pos), want), f"seed {seed}"


@pytest.mark.parametrize("backend,g,s", [("auto", 2, 16), ("bf16", 2, 1), ("bf16", 2, 64),
                                         ("bf16", 16, 256)])
def test_a_threads_first_cuda_work_may_be_a_bound_call(backend, g, s):
    """A thread that has made no CUDA call has no current context for the driver's launches
    and descriptor encodings; a bound layer call as its first CUDA work still runs and gives
    the same bits, as does a GEMM with an output buffer."""
    import threading

    import torch_bridge as tb

    seed = new_seed()
    w, ws = checkpoint(g, seed)
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=torch.float32)
    layer = tb.WoAProjection(w, ws, g, cos, sin, backend=backend)
    want = layer(o, pos)
    x, xs = tb.inverse_rope_group_quant(o, pos, cos, sin, g)
    w3, ws3 = w.view(g, -1, w.shape[1]), ws.view(g, -1, ws.shape[1])
    out = torch.empty_like(want)
    gemm_want = tb.batched_gemm_a8w8_mxscale(x, w3, xs, ws3, out=torch.empty_like(want)).clone()
    torch.cuda.synchronize()
    got, errors = {}, []

    def first_work():
        try:
            got["layer"] = layer(o, pos)
            tb.batched_gemm_a8w8_mxscale(x, w3, xs, ws3, out=out)
            torch.cuda.current_stream().synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    for _ in range(2):  # a second new thread after the first one's calls
        worker = threading.Thread(target=first_work)
        worker.start()
        worker.join()
        assert not errors, f"seed {seed}: {errors[0]!r}"
        assert torch.equal(got["layer"], want) and torch.equal(out, gemm_want), f"seed {seed}"
