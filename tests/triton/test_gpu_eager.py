"""The direct eager launches (``pytest -m gpu``): after a signature's first call, the quant op
and the decode FP8 layer launch the compiled kernel directly, with the op path's bytes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _gpu import checkpoint, new_seed, rope_inputs, xla_memory  # noqa: E402, F401

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("g", [16, 2])
def test_quant_op_direct_launch_gives_the_op_paths_bytes(g):
    import torch_bridge as tb
    from torch_bridge import ops

    seed = new_seed()
    o, pos, cos, sin = rope_inputs(3, g, seed)
    ops._EAGER.clear()
    first = tb.inverse_rope_group_quant(o, pos, cos, sin, g, 128)
    assert any(fn is not None for fn in ops._EAGER.values()), "nothing bound"
    for trial in range(3):  # fresh inputs of the same signature take the bound launch
        o2, pos2, cos2, sin2 = rope_inputs(3, g, seed + trial + 1)
        q, sc = tb.inverse_rope_group_quant(o2, pos2, cos2, sin2, g, 128)
        want_q, want_sc = tb.inverse_rope_group_quant(o2, pos2, cos2, sin2, g, 128,
                                                      x_scale=torch.empty_like(sc))
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
    """G 16 runs the fused chain unsplit, G 8 and 2 with split-K (scratch taken per call)."""
    import torch_bridge as tb
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    w, ws = checkpoint(g, seed)
    o, pos, cos, sin = rope_inputs(1, g, seed, rope_dtype=torch.float32)
    layer = tb.WoAProjection(w, ws, g, cos, sin)
    first = layer(o, pos)
    assert any(fn is not None for fn in layer._eager.values()), "nothing bound"
    for trial in range(3):
        o2, pos2, _, _ = rope_inputs(1, g, seed + trial + 1)
        y = layer(o2, pos2)
        want = launch.wo_a_fp8(o2, pos2, cos, sin, w.view(g, -1, w.shape[1]),
                               ws.view(g, -1, ws.shape[1]), g)
        assert torch.equal(y, want), f"seed {seed}"
    assert first.shape == (1, g, 1024)


@pytest.mark.parametrize("g,s", [(16, 1), (2, 64)])
def test_bf16_layer_direct_launch_gives_the_op_paths_output(g, s):
    """The BF16 fallback at decode sizes (rotated copy + cuBLAS): the bound rotation and the
    same cuBLAS call give the op path's bits; ``o`` stays unchanged; ``overwrite_o`` calls
    take the op path."""
    import torch_bridge as tb
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    w, ws = checkpoint(g, seed)
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=torch.float32)
    layer = tb.WoAProjection(w, ws, g, cos, sin, backend="bf16")
    layer(o, pos)
    assert any(fn is not None for fn in layer._eager.values()), "nothing bound"
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
                       launch.wo_a_bf16(o.clone(), pos, cos, sin, w_bf16, g, inplace=True))
