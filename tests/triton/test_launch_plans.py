"""Launches (``_common.launch_for``): a repeated call signature reuses its launch, and a changed
shape, stride, dtype or option makes a new one that gives the right answer for the new layout.

Runs through ``TRITON_INTERPRET=1`` on CPU (tests/conftest.py), at tiny shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

import woa_jax
from woa_jax.testing import assert_close

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import jax.numpy as jnp  # noqa: E402
from inputs import DEVICE, assert_quant_equal, jx, rope_tensors  # noqa: E402

from torch_bridge.backends.triton import _common, launch, plans  # noqa: E402


@pytest.fixture
def made(monkeypatch):
    """Fresh launches; the list of plans made (one entry per launch signature)."""
    monkeypatch.setattr(_common, "LAUNCHES", {})
    calls = []
    for name in ("quant", "gemm_pointer", "wo_a_fp8", "inverse_rope"):
        real = getattr(plans, name)
        monkeypatch.setattr(plans, name, lambda *a, real=real, name=name, **k: (
            calls.append(name), real(*a, **k))[1])
    return calls


def _quant_matches_oracle(o, pos, cos, sin):
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128)
    assert_quant_equal(q, sc, *woa_jax.inverse_rope_group_quant(*jx(o, pos, cos, sin), 2, 128))


def test_quant_plan_is_reused_and_keyed_on_strides_and_dtypes(rng, made):
    o, pos, cos, sin = rope_tensors(rng)
    _quant_matches_oracle(o, pos, cos, sin)
    _quant_matches_oracle(o, pos, cos, sin)
    assert made == ["quant"] and len(_common.LAUNCHES) == 1
    padded = torch.zeros((3, 4 * 512 + 64), dtype=torch.bfloat16, device=DEVICE)
    padded[:, :2048] = o.reshape(3, -1)
    o_padded = padded[:, :2048].view(3, 4, 512)  # token stride 2112
    _quant_matches_oracle(o_padded, pos, cos, sin)
    _quant_matches_oracle(o, pos, cos.float(), sin.float())  # fp32 tables
    assert made == ["quant"] * 3 and len(_common.LAUNCHES) == 3
    _quant_matches_oracle(*rope_tensors(rng, s=5))  # another token count
    assert len(made) == 4


def test_gemm_plan_is_reused_and_keyed_on_strides(rng, made):
    x = torch.from_numpy(rng.standard_normal((3, 2, 256)).astype(np.float32) * 30).to(
        torch.float8_e4m3fn).to(DEVICE)
    w = torch.from_numpy(rng.standard_normal((2, 128, 256)).astype(np.float32) * 30).to(
        torch.float8_e4m3fn).to(DEVICE)
    xs = torch.from_numpy(rng.integers(122, 131, (3, 2, 2)).astype(np.uint8)).to(DEVICE)
    ws = torch.from_numpy(rng.integers(112, 120, (2, 1, 2)).astype(np.uint8)).to(DEVICE)
    ref = woa_jax.batched_gemm_a8w8_mxscale(*jx(x, w, xs, ws), dtype=jnp.float32)
    for _ in range(2):
        assert_close(launch.batched_gemm_a8w8_mxscale(x, w, xs, ws), ref, tolerance="gemm_bf16")
    assert made == ["gemm_pointer"]
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # [M, G, K] view of [G, M, K]
    assert_close(launch.batched_gemm_a8w8_mxscale(xt, w, xs, ws), ref, tolerance="gemm_bf16")
    y32 = launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=torch.float32)
    assert_close(y32, ref, tolerance="gemm_fp32")
    assert made == ["gemm_pointer"] * 3


def test_chain_plans_are_reused(rng, made):
    o, pos, cos, sin = rope_tensors(rng, s=2, h=4)
    w = torch.from_numpy(rng.standard_normal((2, 128, 1024)).astype(np.float32)).to(
        torch.float8_e4m3fn).to(DEVICE)
    ws = torch.from_numpy(rng.integers(118, 124, (2, 1, 8)).astype(np.uint8)).to(DEVICE)
    first = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, single_kernel=True)
    again = launch.wo_a_fp8(o, pos, cos, sin, w, ws, 2, single_kernel=True)
    assert torch.equal(first, again) and made == ["wo_a_fp8"]
    y = launch.inverse_rope(o, pos, cos, sin)
    assert torch.equal(launch.inverse_rope(o, pos, cos, sin), y)
    x = o.clone()
    launch.inverse_rope(x, pos, cos, sin, overwrite_o=True)  # in place: a plan of its own
    assert torch.equal(x, y)
    assert made == ["wo_a_fp8", "inverse_rope", "inverse_rope"]


@pytest.mark.parametrize("m,g", ((16, 2), (64, 1), (64, 2), (1024, 16), (8192, 2)))
def test_wgmma_plans_name_every_constexpr_of_their_kernel(m, g):
    """A wgmma GEMM plan (the plain kernel or the warp-specialized one, plain or as a dependent
    launch) names every constexpr its kernel takes: the bound eager launch and JAX's custom call
    read them from the plan, never from the kernel's defaults."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    import dataclasses

    from torch_bridge.backends.triton import configs

    n, k, sb = 1024, 4096, 128
    cfg = configs.gemm_config(m, g, n, k, sb, wgmma=True)
    assert cfg.wgmma
    for pdl in (False, True):
        c = dataclasses.replace(cfg, pdl=pdl)
        plan, _ = plans.gemm_wgmma(m, g, n, k, sb, c, 132, x_row=g * k, y_row=g * n,
                                   x_scale=(g * k // sb, k // sb, 1),
                                   w_scale=(n // sb * k // sb, k // sb, 1), out_bytes=2)
        wanted = {p.name for p in plan.kernel.params if p.is_constexpr}
        assert wanted <= set(plan.compile_options()), wanted - set(plan.compile_options())
        assert plan.kernel.__name__.endswith("_ws_kernel") == configs.warp_specialized(c)
        assert configs.warp_specialized(c) == (m >= 1024 or (m, g) == (64, 2))


@pytest.mark.parametrize("split,pdl", ((4, False), (1, True)))
def test_fused_wgmma_plan_names_every_constexpr_of_its_kernel(split, pdl):
    """The fused wgmma chain's plan, as for the GEMM's: every constexpr of its kernel, one
    program per tile and K part, the GEMM's stages for its K part."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from torch_bridge.backends.triton import configs

    n, k, sb, g = 1024, 4096, 128, 2
    cfg = configs.GemmConfig(8, 64, split, True, 4, 8, wgmma=True, pdl=pdl)
    plan, views = plans.wo_a_fp8_wgmma(
        1, 512, 64, g, n, k, sb, cfg, o_row=g * k, cos_row=32, sin_row=32,
        w_scale=(n // sb * k // sb, k // sb, 1), y_row=g * n, out_bytes=2,
        fp8="float8_e4m3fn", amax_floor=1e-8, o_dtype="bfloat16", rope_dtype="float32",
        target="cuda")
    wanted = {p.name for p in plan.kernel.params if p.is_constexpr}
    assert wanted <= set(plan.compile_options()), wanted - set(plan.compile_options())
    assert plan.grid == (g * n // 64 * split,) and plan.split_k == split
    assert plan.compile_options().get("launch_pdl", False) == pdl
    assert plan.constexprs["ROUND_PRODUCTS"] == configs.PRODUCTS_PTX
    assert views == (((1, g * k), (g * k, 1), (8, sb)), ((g * n, k), (k, 1), (64, sb)),
                     ((1, g * n), (g * n, 1), (8, 64)))
