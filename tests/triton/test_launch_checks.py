"""Launcher checks that must refuse before any kernel runs (CPU; no kernel is launched)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from torch_bridge.backends.triton import launch  # noqa: E402


def _fp8(*shape):
    return torch.zeros(shape, dtype=torch.float8_e4m3fn)


def test_explicit_wgmma_config_refuses_operands_it_cannot_tile(monkeypatch):
    """The default shape falls back to the Triton kernels; an explicit Gluon config must not
    quietly run (and be timed as) the pointer kernel instead."""
    monkeypatch.setattr(launch, "wgmma_available", lambda index: (True, "ok"))
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
        launch.inverse_rope_(o, pos, cos, cos)
