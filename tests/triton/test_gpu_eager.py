"""The direct eager launches (``pytest -m gpu``): after a signature's first call, the public
ops, the function forms and the decode layers launch the compiled kernels directly, with the
op path's bytes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from inputs import (  # noqa: E402, F401
    DH,
    HPG,
    N,
    capture,
    checkpoint,
    gemm_inputs,
    new_seed,
    rope_inputs,
    xla_memory,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("g", [16, 2])
def test_quant_op_direct_launch_gives_the_op_paths_bytes(g):
    import torch_bridge as tb
    from torch_bridge import ops
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    o, pos, cos, sin = rope_inputs(3, g, seed)
    ops._PLANS.clear()
    first = tb.inverse_rope_group_quant(o, pos, cos, sin, g, 128)
    assert any(p.eager for p in ops._PLANS.values()), "nothing bound"
    for trial in range(3):  # fresh inputs of the same signature take the bound launch
        o2, pos2, cos2, sin2 = rope_inputs(3, g, seed + trial + 1)
        q, sc = tb.inverse_rope_group_quant(o2, pos2, cos2, sin2, g, 128)
        want_q, want_sc = launch.inverse_rope_group_quant(o2, pos2, cos2, sin2, g, 128)
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), f"seed {seed}"
        assert torch.equal(sc.view(torch.uint8), want_sc.view(torch.uint8)), f"seed {seed}"
        assert sc.dtype == first[1].dtype == torch.float8_e8m0fnu
    # A misaligned o (a view one element in) needs another specialization: the op's path.
    base = torch.empty((3 * g * 8 * 512 + 1,), dtype=torch.bfloat16, device="cuda")
    shifted = base[1:].view(3, g * 8, 512)
    shifted.copy_(o)
    q1, s1 = tb.inverse_rope_group_quant(shifted, pos, cos, sin, g, 128)
    assert torch.equal(q1.view(torch.uint8), first[0].view(torch.uint8))
    assert torch.equal(s1.view(torch.uint8), first[1].view(torch.uint8))


@pytest.mark.parametrize("g", [16, 8, 2])
def test_decode_layer_direct_launch_gives_the_op_paths_output(g):
    """G 16 runs the fused chain unsplit, G 8 with split-K (scratch taken per call); G 2 the
    quant and its dependent split GEMM where the GEMM can be one (Hopper), else fused too."""
    import torch_bridge as tb
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    w, ws = checkpoint(g, seed)
    o, pos, cos, sin = rope_inputs(1, g, seed, rope_dtype=torch.float32)
    layer = tb.WoAProjection(w, ws, g, cos, sin)
    first = layer(o, pos)
    assert any(p.eager for p in layer._plans.values()), "nothing bound"
    for trial in range(3):
        o2, pos2, _, _ = rope_inputs(1, g, seed + trial + 1)
        y = layer(o2, pos2)
        want = launch.wo_a_fp8(o2, pos2, cos, sin, w.view(g, -1, w.shape[1]),
                               ws.view(g, -1, ws.shape[1]), g)
        assert torch.equal(y, want), f"seed {seed}"
    assert first.shape == (1, g, 1024)


@pytest.mark.parametrize("g,s", [(16, 1), (2, 16), (16, 64), (2, 64), (8, 128)])
def test_bf16_layer_direct_launch_gives_the_op_paths_output(g, s):
    """The BF16 fallback where it is host-bound: the bound one-launch chain (decode sizes) or
    the bound rotation and the same cuBLAS call give the op path's bits; ``o`` stays
    unchanged; ``overwrite_o`` calls take the op path."""
    import torch_bridge as tb
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    w, ws = checkpoint(g, seed)
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=torch.float32)
    layer = tb.WoAProjection(w, ws, g, cos, sin, backend="bf16")
    layer(o, pos)
    assert any(p.eager for p in layer._plans.values()), "nothing bound"
    w_bf16 = layer.weight_bf16.cuda()
    for trial in range(3):
        o2, pos2, _, _ = rope_inputs(s, g, seed + trial + 1)
        before = o2.clone()
        y = layer(o2, pos2)
        assert torch.equal(o2, before), "o was written"
        want = launch.wo_a_bf16(o2, pos2, cos, sin, w_bf16, g)
        assert torch.equal(y, want), f"seed {seed}"
    x = o.clone()
    assert torch.equal(layer(x, pos, overwrite_o=True),
                       launch.wo_a_bf16(o.clone(), pos, cos, sin, w_bf16, g, overwrite_o=True))


def _gemm_key(x, w, xs, ws):
    from torch_bridge import ops

    return ops.gemm_key(x, w, xs, ws, torch.bfloat16, "auto", None)


@pytest.mark.parametrize("g,m", [(16, 1), (2, 1), (16, 64), (2, 40)])
def test_gemm_op_direct_launch_gives_the_op_paths_bits(g, m):
    """G 16 runs the wgmma kernel (descriptors kept per base address), G 2 the pointer kernel
    with split-K (the stream's scratch): the bound launch gives the op path's bits (``out``
    given), for new data and for the weight at another address; a misaligned x takes the
    op's path."""
    import torch_bridge as tb
    from torch_bridge import ops
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, g, N, HPG * DH, seed)
    first = tb.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    bound = ops.bound_launcher(_gemm_key(x, w, xs, ws))
    assert bound is not None, "nothing bound"
    for trial in range(3):
        x2, w2, xs2, ws2 = gemm_inputs(m, g, N, HPG * DH, seed + trial + 1)
        for y in (bound(x2, w2, xs2, ws2), tb.batched_gemm_a8w8_mxscale(x2, w2, xs2, ws2)):
            want = launch.batched_gemm_a8w8_mxscale(x2, w2, xs2, ws2, out=torch.empty_like(y))
            assert torch.equal(y.view(torch.int16), want.view(torch.int16)), f"seed {seed}"
    flat = torch.empty(x.numel() + 16, dtype=torch.uint8, device="cuda")
    shifted = flat[1:x.numel() + 1].view(torch.float8_e4m3fn).view(x.shape)
    shifted.copy_(x)
    assert bound(shifted, w, xs, ws) is None
    # The op's path: a kernel that reads x by pointer (at G 2 with its own K split, so the
    # aligned call's bits are not its contract).
    again = tb.batched_gemm_a8w8_mxscale(shifted, w, xs, ws)
    want = launch.batched_gemm_a8w8_mxscale(shifted, w, xs, ws, out=torch.empty_like(again))
    assert torch.equal(again.view(torch.int16), want.view(torch.int16)), f"seed {seed}"
    if g == 16:  # unsplit: the same bits as the aligned call
        assert torch.equal(again.view(torch.int16), first.view(torch.int16)), f"seed {seed}"


@pytest.mark.parametrize("g,m", [(16, 1), (2, 1), (16, 64)])
def test_gemm_op_with_out_launches_directly_into_it(g, m):
    """Calls with ``out`` bind a launch of their own (wgmma at G 16, split-K at G 2): it
    writes the given buffer (the launcher's bits, the version bumped); a misaligned ``out``
    takes the op's path."""
    import torch_bridge as tb
    from torch_bridge import ops
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, g, N, HPG * DH, seed)
    out = torch.empty((m, g, N), dtype=torch.bfloat16, device="cuda")
    assert tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=out) is out
    assert ops.bound_launcher(ops.gemm_key(x, w, xs, ws, torch.bfloat16, "auto", out)), \
        "nothing bound"
    for trial in range(3):
        x2, w2, xs2, ws2 = gemm_inputs(m, g, N, HPG * DH, seed + trial + 1)
        target = out if trial % 2 else torch.empty_like(out)
        version = target._version
        assert tb.batched_gemm_a8w8_mxscale(x2, w2, xs2, ws2, out=target) is target
        assert target._version > version
        want = launch.batched_gemm_a8w8_mxscale(x2, w2, xs2, ws2, out=torch.empty_like(out))
        assert torch.equal(target.view(torch.int16), want.view(torch.int16)), f"seed {seed}"
    flat = torch.empty(out.numel() + 8, dtype=torch.bfloat16, device="cuda")
    shifted = flat[1:out.numel() + 1].view(out.shape)
    tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=shifted)
    want = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=torch.empty_like(out))
    assert torch.equal(shifted.view(torch.int16), want.view(torch.int16)), f"seed {seed}"


@pytest.mark.parametrize("scale_dtype", [torch.uint8, torch.float8_e8m0fnu])
def test_quant_op_with_buffers_launches_directly_into_them(scale_dtype):
    import torch_bridge as tb
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    o, pos, cos, sin = rope_inputs(3, 2, seed)
    q = torch.empty((3, 2, 4096), dtype=torch.float8_e4m3fn, device="cuda")
    sc = torch.empty((3, 2, 32), dtype=scale_dtype, device="cuda")
    for trial in range(3):
        o2, pos2, cos2, sin2 = rope_inputs(3, 2, seed + trial)
        versions = q._version, sc._version
        got = tb.inverse_rope_group_quant(o2, pos2, cos2, sin2, 2, 128, x_fp8=q, x_scale=sc)
        assert got[0] is q and got[1] is sc
        assert q._version > versions[0] and sc._version > versions[1]
        want_q, want_sc = launch.inverse_rope_group_quant(o2, pos2, cos2, sin2, 2, 128)
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), f"seed {seed}"
        assert torch.equal(sc.view(torch.uint8), want_sc.view(torch.uint8)), f"seed {seed}"


def test_split_k_direct_launch_stays_on_its_stream_and_out_of_captures():
    """The split GEMM's bound launch keeps the scratch of the stream it was bound on: another
    stream, or a CUDA-graph capture on that stream, takes the op's path (bits unchanged)."""
    import torch_bridge as tb
    from torch_bridge import ops

    seed = new_seed()
    x, w, xs, ws = gemm_inputs(1, 2, N, HPG * DH, seed)
    ops._PLANS.clear()  # bind on the side stream, whatever ran this signature before
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        want = tb.batched_gemm_a8w8_mxscale(x, w, xs, ws)
        bound = ops.bound_launcher(_gemm_key(x, w, xs, ws))
        assert bound is not None and bound(x, w, xs, ws) is not None
    torch.cuda.current_stream().wait_stream(side)
    assert bound(x, w, xs, ws) is None  # the default stream is not the bound one
    y = tb.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    assert torch.equal(y.view(torch.int16), want.view(torch.int16)), f"seed {seed}"
    graph = torch.cuda.CUDAGraph()
    side.wait_stream(torch.cuda.current_stream())
    with capture(graph, stream=side):
        captured = tb.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    for _ in range(2):
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured.view(torch.int16), want.view(torch.int16)), f"seed {seed}"


@pytest.mark.parametrize("g,s", [(16, 1), (2, 1), (16, 64), (2, 40)])
def test_wo_a_fp8_function_runs_the_chain_and_launches_it_directly(g, s):
    """The function form runs the triton chain as the layer does (fused at decode, else quant
    then GEMM): its first call and the bound repeats give the chain's bits."""
    import torch_bridge as tb
    from torch_bridge import projection
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    w, ws = checkpoint(g, seed)
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=torch.float32)
    w3, ws3 = w.view(g, -1, w.shape[1]), ws.view(g, -1, ws.shape[1])
    first = tb.wo_a_fp8(o, pos, cos, sin, w, ws, g)
    assert torch.equal(first, launch.wo_a_fp8(o, pos, cos, sin, w3, ws3, g)), f"seed {seed}"
    (proj,) = [p for p in projection._PREPARED.values() if p._weight2d is w]
    assert any(p.eager for p in proj._plans.values()), "nothing bound"
    for trial in range(3):
        o2, pos2, _, _ = rope_inputs(s, g, seed + trial + 1)
        y = tb.wo_a_fp8(o2, pos2, cos, sin, w, ws, g)
        want = launch.wo_a_fp8(o2, pos2, cos, sin, w3, ws3, g)
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), f"seed {seed}"


def test_bound_launches_call_tritons_c_launch_directly():
    """On this Triton the bound launches skip the Python step of Triton's launcher
    (``_common.raw_launch`` knows its layout) for the kernels launched here."""
    import torch_bridge as tb
    from torch_bridge.backends.triton import _common

    o, pos, cos, sin = rope_inputs(2, 2, new_seed())
    tb.inverse_rope_group_quant(o, pos, cos, sin, 2, 128)
    compiled = [c for run in _common.LAUNCHES.values() for c, _ in run._compiled.values()]
    assert compiled and all(_common.raw_launch(c) is not None for c in compiled)


def test_split_fused_layer_direct_launch_leaves_other_streams_and_captures_to_the_op():
    """G 4 decode: the fused kernel splits K; its bound launch keeps the prologue's and the
    split's scratch for its stream. Another stream and a capture take the op's path."""
    import torch_bridge as tb

    seed = new_seed()
    w, ws = checkpoint(4, seed)
    o, pos, cos, sin = rope_inputs(1, 4, seed, rope_dtype=torch.float32)
    layer = tb.WoAProjection(w, ws, 4, cos, sin)
    want = layer(o, pos)
    (bound,) = [p.eager for p in layer._plans.values() if p.eager]
    assert bound(o, pos) is not None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        assert bound(o, pos) is None
        y = layer(o, pos)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(y, want), f"seed {seed}"
    graph = torch.cuda.CUDAGraph()
    with capture(graph, stream=side):
        captured = layer(o, pos)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, want), f"seed {seed}"
    assert torch.equal(layer(o, pos), want), f"seed {seed}"


@pytest.mark.parametrize("g,s", [(16, 1), (2, 1), (16, 64), (2, 1024)])
def test_tritons_public_launch_gives_the_direct_launches_bits(monkeypatch, g, s):
    """Without direct launches (a Triton of unknown launch layout, or WOA_DIRECT_LAUNCH=0)
    every call takes ``kernel[grid](...)``: the layers and the ops give the same bits and
    bind nothing."""
    import torch_bridge as tb
    from torch_bridge import _dispatch
    from torch_bridge.backends.triton import _common

    seed = new_seed()
    w, ws = checkpoint(g, seed)
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=torch.float32)
    wg, wsg = w.view(g, -1, w.shape[1]), ws.view(g, -1, ws.shape[1])

    def run():
        fp8 = tb.WoAProjection(w, ws, g, cos, sin)
        bf16 = tb.WoAProjection(w, ws, g, cos, sin, backend="bf16")
        x, xs = tb.inverse_rope_group_quant(o, pos, cos, sin, g)
        got = [fp8(o, pos), fp8(o, pos), bf16(o, pos), bf16(o, pos), x.view(torch.uint8), xs,
               tb.batched_gemm_a8w8_mxscale(x, wg, xs, wsg),
               tb.batched_gemm_a8w8_mxscale(x, wg, xs, wsg)]
        return got, fp8, bf16

    direct, _, _ = run()
    monkeypatch.setenv("WOA_DIRECT_LAUNCH", "0")
    _dispatch.reset_caches()
    try:
        assert not _common.direct_launches()[0]
        public, fp8, bf16 = run()
        bound = any(p.eager for p in fp8._plans.values()) or any(
            p.eager for p in bf16._plans.values())
    finally:
        monkeypatch.delenv("WOA_DIRECT_LAUNCH")
        _dispatch.reset_caches()  # no plan of this test's unbound launches stays behind
    for a, b in zip(public, direct, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"seed {seed}"
    assert not bound


def _check_kept_per_stream(layers, o, pos, want, kept: bool, mine, seed) -> list:
    """Two layers bound on the current stream give ``want`` eagerly and through their bound
    launch, and share one kept set where ``kept`` (none else; ``mine(key, stream)`` picks the
    sets' registry keys); on another stream the bound launch refuses where buffers are kept,
    and the layer, like a captured one, takes the op's path with the same bits. Returns the
    kept sets."""
    from torch_bridge.backends.triton import _common

    _common._KEPT.clear()  # bound launches hold their own; new binds make new sets
    stream = torch.cuda.current_stream().cuda_stream
    for layer in layers:
        assert torch.equal(layer(o, pos), want), f"seed {seed}"
        (bound,) = [p.eager for p in layer._plans.values() if p.eager]
        assert torch.equal(bound(o, pos), want), f"seed {seed}"
    found = [v for key, v in _common._KEPT.items() if mine(key, stream)]
    assert len(_common._KEPT) == len(found) == kept, "one set per stream and problem, or none"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        assert (bound(o, pos) is None) == kept  # kept buffers stay on their stream
        y = layers[0](o, pos)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(y, want), f"seed {seed}"
    graph = torch.cuda.CUDAGraph()
    with capture(graph, stream=side):
        captured = layers[1](o, pos)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, want), f"seed {seed}"
    return found


@pytest.mark.parametrize("g,s", [(2, 64), (16, 256), (2, 4096)])
def test_unfused_layer_keeps_its_activations_for_the_stream_it_was_bound_on(g, s):
    """Unfused decode sizes: the bound quant writes activations kept for its stream (one set
    per stream, shared by every layer); another stream or a capture takes the op's path. From
    ``SCRATCH_BYTES`` each call makes its own. Every route gives the chain's bits."""
    import torch_bridge as tb
    from torch_bridge.backends.triton import chain_eager, launch

    seed = new_seed()
    w, ws = checkpoint(g, seed)
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=torch.float32)
    want = launch.wo_a_fp8(o, pos, cos, sin, w.view(g, -1, w.shape[1]),
                           ws.view(g, -1, ws.shape[1]), g)
    layers = [tb.WoAProjection(w, ws, g, cos, sin) for _ in range(2)]
    kept = s * g * w.shape[1] <= chain_eager.SCRATCH_BYTES
    found = _check_kept_per_stream(
        layers, o, pos, want, kept,
        lambda key, stream: key[0] == "fp8 activations" and key[2] == stream and key[4] == g,
        seed)
    if kept:
        assert found[0].tensors[0].numel() == chain_eager.SCRATCH_BYTES


@pytest.mark.parametrize("g,s", [(16, 256), (16, 1040)])
def test_bf16_tails_route_keeps_its_tails_for_the_stream_it_was_bound_on(g, s):
    """The BF16 layer's route of rotated tails: up to ``SCRATCH_BYTES`` of tails the bound
    rotation writes tails kept for its stream (one buffer per stream, shared by the layers);
    another stream or a capture takes the op's path. Above, each call makes its own. Every
    route gives the chain's bits."""
    import torch_bridge as tb
    from torch_bridge.backends.triton import _common, bf16_configs, launch

    assert bf16_configs.bf16_gemm_chosen(s, g, N, HPG * DH, tma=True, dh=DH)
    seed = new_seed()
    w, ws = checkpoint(g, seed)
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=torch.float32)
    layers = [tb.WoAProjection(w, ws, g, cos, sin, backend="bf16") for _ in range(2)]
    want = launch.wo_a_bf16(o, pos, cos, sin, layers[0].weight_bf16.cuda(), g)
    heads, rd = o.shape[1], 2 * cos.shape[1]
    kept = s * heads * rd * 2 <= _common.SCRATCH_BYTES
    found = _check_kept_per_stream(
        layers, o, pos, want, kept,
        lambda key, stream: key[0] == "bf16 tails" and key[2] == stream, seed)
    if kept:
        assert found[0].tensors[0].shape[1:] == (heads, rd)
