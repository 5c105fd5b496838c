"""The whole ``wo_a`` chain on a GPU (``pytest -m gpu``): public API, fused decode kernel,
CUDA graphs, ``torch.compile`` and the JAX path against the ``woa_jax`` oracle.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _gpu import (  # noqa: E402, F401
    DH,
    GROUPS,
    HPG,
    N,
    assert_bytes_equal,
    chain_oracle,
    checkpoint,
    jx,
    new_seed,
    oracle,
    poisoned,
    relerr,
    rope_inputs,
    xla_memory,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("s", (1, 128, 4096))
def test_whole_chain_public_api_and_bf16_chain(s):

    import woa_jax
    from torch_bridge.backends.triton import launch
    from woa_jax.testing import TOLERANCES

    seed, g = new_seed(), 16
    o, pos, cos, sin = rope_inputs(s, g, seed)
    weight, scale = checkpoint(g, seed)
    ref = chain_oracle(o, pos, cos, sin, weight, scale, g)
    from torch_bridge import WoAProjection

    proj = WoAProjection(weight, scale.view(torch.float8_e8m0fnu), g, cos, sin, backend="triton")
    y = proj(o, pos)
    assert proj.path == "triton"
    assert relerr(y, ref) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}"
    cos32, sin32 = cos.float(), sin.float()
    ref16 = oracle("wo_a_bf16")(jx(o), jx(pos), jx(cos32), jx(sin32), jx(weight), jx(scale), g)
    w_bf16 = woa_jax.dequant_wo_a_weight(jx(weight), jx(scale), g)
    from torch_bridge import interop

    y16 = launch.wo_a_bf16(o, pos, cos32, sin32, interop.to_torch(w_bf16), g)
    assert relerr(y16, ref16) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}"


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("s", (1, 7, 16, 64))
def test_fused_decode_chain(s, g):
    """The one-kernel chain at its default shape against the oracle, and bit for bit against
    the two-kernel chain with the same tiles (without split-K, whose atomics reorder sums)."""
    import dataclasses

    from torch_bridge.backends.triton import launch
    from woa_jax.testing import TOLERANCES

    seed = new_seed()
    o, pos, cos, sin = rope_inputs(s, g, seed, pos_dtype=torch.int32 if s % 2 else torch.int64)
    weight, scale = checkpoint(g, seed)
    w, ws = weight.view(g, N, -1), scale.view(g, N // 128, -1)
    ref = chain_oracle(o, pos, cos, sin, weight, scale, g)
    y = torch.full((s, g, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, out=y, fused=True)
    err = relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"
    cfg = dataclasses.replace(launch.wo_a_fp8_config(s, g, N, HPG * DH, 128), split_k=1)
    one = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, fused=True, config=cfg)
    two = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, fused=False, config=cfg)
    bad = int((one.view(torch.int16) != two.view(torch.int16)).sum())
    assert bad == 0, f"seed {seed}: {bad} of {one.numel()} outputs differ from the two kernels"


@pytest.mark.parametrize("s,g", ((1, 2), (1, 16)))  # (1, 2): split-K, its buffer in the pool
def test_fused_chain_cuda_graph_and_torch_compile(s, g):
    from torch_bridge.backends.triton import launch

    assert launch.wo_a_fp8_chosen(s, g, N, HPG * DH, 128)

    o, pos, cos, sin = rope_inputs(s, g, new_seed(), pos_dtype=torch.int32)
    weight, scale = checkpoint(g, new_seed())
    w, ws = weight.view(g, N, -1), scale.view(g, N // 128, -1)
    y = torch.empty((s, g, N), dtype=torch.bfloat16, device="cuda")
    launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, out=y)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()  # split-K (G = 2): the fp32 parts come from the pool
    with torch.cuda.graph(graph):
        launch.wo_a_fp8(o, pos, cos, sin, w, ws, g, out=y)
    o2, pos2, _, _ = rope_inputs(s, g, new_seed(), pos_dtype=torch.int32)
    o.copy_(o2)
    pos.copy_(pos2)
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    got = y.clone()
    want = launch.wo_a_fp8(o, pos, cos, sin, w, ws, g)
    assert torch.equal(got, want)  # split-K too: its parts are added in K order
    compiled = torch.compile(lambda o, pos: launch.wo_a_fp8(o, pos, cos, sin, w, ws, g),
                             fullgraph=True)
    assert torch.equal(compiled(o, pos), want)
    from woa_jax.testing import TOLERANCES

    ref = chain_oracle(o, pos, cos, sin, weight, scale, g)
    assert relerr(got, ref) <= TOLERANCES["gemm_bf16"].rel


@pytest.mark.parametrize("s", (1, 64, 8192))
def test_jax_jit_path(s):
    import jax
    import jax.numpy as jnp

    import woa_jax
    from torch_bridge import jax_ops
    from woa_jax.testing import TOLERANCES

    seed, g = new_seed(), 16
    o, pos, cos, sin = rope_inputs(s, g, seed)
    weight, scale = checkpoint(g, seed)
    args = [jx(t) for t in (o, pos, cos, sin)]
    w, ws = woa_jax.wo_a_weight_e8m0(jx(weight), jx(scale), g)
    q, sc = jax.jit(lambda *a: jax_ops.inverse_rope_group_quant(*a, g, 128))(*args)
    rq, rs = oracle("inverse_rope_group_quant")(*args, g, 128)
    assert_bytes_equal(q, rq, "fp8", seed)
    assert_bytes_equal(sc, rs, "scale", seed)
    ref = chain_oracle(o, pos, cos, sin, weight, scale, g)
    for cb in (None, False, True):  # None: on for the wgmma GEMM (s = 8192), else off
        fn = jax.jit(lambda *a, cb=cb: jax_ops.wo_a_fp8(*a, g, command_buffer=cb))
        y = fn(*args, w, ws)
        assert y.dtype == jnp.bfloat16
        assert relerr(y, ref) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}, command_buffer={cb}"
        # a second input through the same executable (a command-buffer replay must see it)
        o2, pos2, _, _ = rope_inputs(s, g, seed + 1)
        args2 = [jx(o2), jx(pos2), *args[2:]]
        ref2 = chain_oracle(o2, pos2, cos, sin, weight, scale, g)
        y2 = fn(*args2, w, ws)
        assert relerr(y2, ref2) <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}, replay cb={cb}"


# On Hopper every GEMM here the wgmma kernel's: the swapped tile at 4, 64- and 128-row tiles above.
@pytest.mark.parametrize("s", (4, 64, 256))
def test_cuda_graph_and_torch_compile(s):
    from torch_bridge.backends.triton import launch

    g = 16
    o, pos, cos, sin = rope_inputs(s, g, new_seed(), pos_dtype=torch.int32)
    weight, scale = checkpoint(g, new_seed())
    w, ws = weight.view(g, N, -1), scale.view(g, N // 128, -1)
    xq, xs = poisoned(s, g, HPG * DH)
    y = torch.empty((s, g, N), dtype=torch.bfloat16, device="cuda")

    def chain():
        launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128, x_fp8=xq, x_scale=xs)
        launch.batched_gemm_a8w8_mxscale(xq, w, xs, ws, out=y)

    chain()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    o2, pos2, _, _ = rope_inputs(s, g, new_seed(), pos_dtype=torch.int32)
    o.copy_(o2)
    pos.copy_(pos2)
    graph.replay()
    torch.cuda.synchronize()
    got = (xq.view(torch.uint8).clone(), xs.clone(), y.clone())
    chain()
    torch.cuda.synchronize()
    assert torch.equal(got[0], xq.view(torch.uint8)) and torch.equal(got[1], xs)
    assert torch.equal(got[2], y)

    @torch.compile(fullgraph=True)
    def compiled(o, pos):
        q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128)
        return launch.batched_gemm_a8w8_mxscale(q, w, sc, ws)

    assert torch.equal(compiled(o, pos), y)
