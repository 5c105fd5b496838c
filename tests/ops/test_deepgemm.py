"""The ``deepgemm`` backend on an sm_90 GPU with ``deep_gemm`` installed (``pytest -m gpu``):
the GEMM op and the FP8 layer against the oracle; the GEMM bit for bit against the Triton
backend's where that one does not split K (split-K sums in another order), the layer against
the public quant and the GEMM op. Where ``deep_gemm`` does not
import the module is skipped with the import's reason; the backend's rules and what it hands
DeepGEMM are tested on CPU in ``tests/torch_bridge/test_deepgemm_backend.py``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from inputs import (  # noqa: E402
    DH,
    HPG,
    N,
    capture,
    chain_oracle,
    checkpoint,
    gemm_inputs,
    gemm_oracle,
    new_seed,
    relerr,
    rope_inputs,
)

import torch_bridge as tb  # noqa: E402
from torch_bridge.backends import deepgemm  # noqa: E402
from torch_bridge.backends.triton import launch  # noqa: E402
from woa_jax.testing import TOLERANCES  # noqa: E402

pytestmark = pytest.mark.gpu
K = HPG * DH


@pytest.fixture(autouse=True, scope="module")
def _deep_gemm_here():
    ok, why = deepgemm.BACKEND.is_available()
    if not ok:
        pytest.skip(f"the deepgemm backend cannot run here: {why}")


@pytest.mark.parametrize("g", (2, 4, 16))
@pytest.mark.parametrize("m", (1, 16, 64, 256, 1024))
def test_gpu_deepgemm_gemm_op(m, g):
    """Within the oracle's tolerance, and the Triton GEMM's bits wherever that one does not
    split K."""
    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, g, N, K, seed)
    y = tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="deepgemm")
    err = relerr(y, gemm_oracle(x, w, xs, ws))
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: {err}"
    cfg = launch.gemm_config(m, g, N, K, 128, wgmma=launch.wgmma_available(None)[0])
    if cfg.split_k == 1:
        ours = tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="triton")
        assert torch.equal(y, ours), f"seed {seed}: bits differ from the Triton GEMM's ({cfg})"


@pytest.mark.parametrize("g", (2, 4, 16))
@pytest.mark.parametrize("s", (1, 13, 64, 256, 1024))
def test_gpu_deepgemm_layer_eager_and_graph(s, g):
    """The layer on the backend (its quant writes DeepGEMM's fp32 scales) against the oracle,
    bit for bit the public quant followed by the backend's GEMM op (E8M0 scales converted),
    and the same bits replayed from a CUDA graph on new values at the same addresses."""
    seed = new_seed()
    o, pos, cos, sin = rope_inputs(s, g, seed)
    cos, sin = cos.float(), sin.float()
    weight, scale = checkpoint(g, seed)
    layer = tb.WoAProjection(weight, scale, g, cos, sin, backend="deepgemm")
    y = layer(o, pos)
    assert layer.path == "deepgemm"
    err = relerr(y, chain_oracle(o, pos, cos, sin, weight, scale, g))
    assert err <= TOLERANCES["gemm_bf16"].rel, f"seed {seed}: {err}"
    x, xs = tb.inverse_rope_group_quant(o, pos, cos, sin, g, 128, backend="triton")
    two_ops = tb.batched_gemm_a8w8_mxscale(x, weight.view(g, N, K), xs,
                                           scale.view(g, N // 128, K // 128),
                                           backend="deepgemm")
    assert torch.equal(y, two_ops), f"seed {seed}: bits differ from quant + GEMM op"
    # The quant's scales and the op's converted ones are already in DeepGEMM's layout: its
    # helper would not move them.
    _, xs_dg = launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128,
                                               scale_mn_align=deepgemm.scale_align())
    for scales in (xs_dg, deepgemm.activation_scales(xs)):
        by_group = scales.transpose(0, 1)
        assert deepgemm.deep_gemm().get_mn_major_tma_aligned_tensor(by_group).data_ptr() == \
            by_group.data_ptr()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        replayed = layer(o, pos)
    o2, pos2, _, _ = rope_inputs(s, g, seed + 1)
    o.copy_(o2)
    pos.copy_(pos2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(replayed, layer(o, pos)), f"seed {seed}: the replay's bits differ"


def test_gpu_deepgemm_one_group_in_odd_size_one_strides():
    """One group (V4-Flash at TP8) in views whose size-1 dims carry strides DeepGEMM rejects:
    the op gives the bits of the same tensors laid out row-major."""
    seed = new_seed()
    x, w, xs, ws = gemm_inputs(16, 1, N, K, seed)
    odd_x = x.as_strided(x.shape, (x.stride(0), 7, 1))
    odd_w, odd_ws = (t.as_strided(t.shape, (7, *t.stride()[1:])) for t in (w, ws))
    y = tb.batched_gemm_a8w8_mxscale(odd_x, odd_w, xs, odd_ws, backend="deepgemm")
    assert torch.equal(y, tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="deepgemm")), \
        f"seed {seed}"
