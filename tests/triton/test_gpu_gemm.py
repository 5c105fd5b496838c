"""Triton GEMM on a GPU (``pytest -m gpu``): the built-in launch shapes, split-K,
fp32 output and V4.1's 32 x 32 blocks against the ``woa_jax`` oracle.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _gpu import (  # noqa: E402, F401
    DH,
    FP32_OUT_ON_GPU,
    GROUPS,
    HPG,
    TOKENS,
    N,
    gemm_inputs,
    jx,
    new_seed,
    oracle,
    relerr,
    xla_memory,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("m", TOKENS)
def test_gemm_against_oracle(m, g):
    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch
    from woa_jax.testing import TOLERANCES

    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, g, N, HPG * DH, seed)
    y = torch.full((m, g, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y)
    ref = oracle("batched_gemm_a8w8_mxscale")(jx(x), jx(w), jx(xs), jx(ws), dtype=jnp.float32)
    err = relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"


@pytest.mark.parametrize("m", (1, 16, 64, 128))
def test_split_k_gemm_bits_never_depend_on_timing(m):
    """G = 2 decode splits K over up to 8 parts per tile. Whatever order the parts arrive in,
    the kernel adds them in K order: 20 eager launches, a launch on another stream and a CUDA
    graph replay all give the same bits, and every tile counter is back at zero after each."""
    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch, split_k
    from woa_jax.testing import TOLERANCES

    g = 2
    assert launch.gemm_config(m, g, N, HPG * DH, 128).split_k > 1
    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, g, N, HPG * DH, seed)
    ref = oracle("batched_gemm_a8w8_mxscale")(jx(x), jx(w), jx(xs), jx(ws), dtype=jnp.float32)
    first = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    err = relerr(first, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"
    runs = [launch.batched_gemm_a8w8_mxscale(x, w, xs, ws) for _ in range(20)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        runs.append(launch.batched_gemm_a8w8_mxscale(x, w, xs, ws))
    torch.cuda.current_stream().wait_stream(side)
    y = torch.empty_like(first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y)
    for _ in range(3):
        y.fill_(float("nan"))
        graph.replay()
        runs.append(y.clone())
    torch.cuda.synchronize()
    for i, r in enumerate(runs):
        assert torch.equal(r.view(torch.int16), first.view(torch.int16)), f"seed {seed}: run {i}"
    assert int(split_k.COUNTER_POOLS[x.device].counters.count_nonzero()) == 0


def test_split_k_captured_before_any_eager_launch_runs_unsplit(monkeypatch, caplog):
    """A split GEMM first met inside a CUDA-graph capture has no counters yet: it runs unsplit
    (correct, logged once) rather than allocating and zeroing them inside the graph."""
    import logging

    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch, split_k
    from woa_jax.testing import TOLERANCES

    monkeypatch.setattr(split_k, "COUNTER_POOLS", {})
    monkeypatch.setattr(split_k, "_FALLBACK_LOGGED", set())
    seed = new_seed()
    x, w, xs, ws = gemm_inputs(16, 2, N, HPG * DH, seed)
    y = torch.full((16, 2, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y,
                                     config=launch.GemmConfig(16, 64, swap_ab=True))  # compile
    monkeypatch.setattr(split_k, "COUNTER_POOLS", {})
    graph = torch.cuda.CUDAGraph()
    with caplog.at_level(logging.WARNING, logger="woa"), torch.cuda.graph(graph):
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y,
                                         config=launch.GemmConfig(16, 64, 8, swap_ab=True))
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert any("run once before capturing" in r.getMessage() for r in caplog.records)
    ref = oracle("batched_gemm_a8w8_mxscale")(jx(x), jx(w), jx(xs), jx(ws), dtype=jnp.float32)
    err = relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"


@pytest.mark.parametrize("m", (1, 64, 1000, 8192))
def test_gemm_fp32_out_from_transposed_x(m):
    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch

    seed = new_seed()
    g, k = 8, HPG * DH
    x, w, xs, ws = gemm_inputs(m, g, N, k, seed)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # [M, G, K] view of a [G, M, K] buffer
    y = torch.full((m, g, N), float("nan"), dtype=torch.float32, device="cuda")
    launch.batched_gemm_a8w8_mxscale(xt, w, xs, ws, dtype=torch.float32, out=y)
    ref = oracle("batched_gemm_a8w8_mxscale")(jx(x), jx(w), jx(xs), jx(ws), dtype=jnp.float32)
    err = relerr(y, ref)
    assert err <= FP32_OUT_ON_GPU, f"seed {seed}: relerr {err:.3g}"


@pytest.mark.parametrize("m", (1, 64, 1000, 8192))
def test_gemm_v41_32x32_blocks(m):
    """DeepSeek V4.1: 32 x 32 weight blocks with 1 x 32 activation groups."""
    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch
    from woa_jax.testing import TOLERANCES

    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, 8, N, HPG * DH, seed, block=32)
    y = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws)
    ref = oracle("batched_gemm_a8w8_mxscale")(jx(x), jx(w), jx(xs), jx(ws), dtype=jnp.float32)
    err = relerr(y, ref)
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: relerr {err:.3g}"
