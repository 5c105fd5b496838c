"""The Hopper wgmma GEMM kernel on a GPU (``pytest -m gpu``) at explicit launch shapes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _gpu import (  # noqa: E402, F401
    DH,
    FP32_OUT_ON_GPU,
    HPG,
    N,
    gemm_inputs,
    jx,
    new_seed,
    oracle,
    relerr,
    xla_memory,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("cfg", ((128, 4, 1), (128, 5, 0), (64, 4, 2), (64, 6, 0)),
                         ids=lambda c: f"m{c[0]}st{c[1]}p{c[2]}")
@pytest.mark.parametrize("m,g,dtype,k", ((33, 8, torch.bfloat16, HPG * DH),
                                         (65, 16, torch.bfloat16, HPG * DH),
                                         (1000, 2, torch.float32, HPG * DH),
                                         (8192, 16, torch.bfloat16, HPG * DH),
                                         (300, 3, torch.bfloat16, 31 * 128),
                                         (200, 4, torch.bfloat16, 128)))
def test_gemm_wgmma_kernel(m, g, dtype, k, cfg):
    """The wgmma kernel itself (explicit config; ragged M tiles, and decode-size M below one
    tile, clip on the TMA store; persistent programs carry the K pipeline across tiles; an odd
    number of K blocks ends on the other register set, and one K block leaves the unrolled loop
    empty)."""
    from torch_bridge.backends.triton import launch

    _check_wgmma(m, g, dtype, k, launch.GemmConfig(
        cfg[0], 128, num_warps=cfg[0] // 16, num_stages=cfg[1], wgmma=True,
        programs_per_sm=cfg[2]))


def _check_wgmma(m, g, dtype, k, config):
    """Run the wgmma kernel at ``config`` on fresh inputs, check it against the oracle and
    return ``(inputs, output, seed)``."""
    import jax.numpy as jnp

    from torch_bridge.backends.triton import launch
    from woa_jax.testing import TOLERANCES

    ok, why = launch.wgmma_available(torch.cuda.current_device())
    if not ok:
        pytest.skip(why)
    seed = new_seed()
    x, w, xs, ws = gemm_inputs(m, g, N, k, seed)
    y = torch.full((m, g, N), float("nan"), dtype=dtype, device="cuda")
    launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=dtype, out=y, config=config)
    ref = oracle("batched_gemm_a8w8_mxscale")(jx(x), jx(w), jx(xs), jx(ws), dtype=jnp.float32)
    err = relerr(y, ref)
    tol = TOLERANCES["gemm_bf16"].rel if dtype == torch.bfloat16 else FP32_OUT_ON_GPU
    assert err <= tol, f"seed {seed}: relerr {err:.3g}"
    return (x, w, xs, ws), y, seed


@pytest.mark.parametrize("cfg", ((8, 64, 8, 0), (16, 64, 6, 0), (16, 128, 6, 1), (32, 128, 6, 0)),
                         ids=lambda c: f"t{c[0]}n{c[1]}st{c[2]}p{c[3]}")
@pytest.mark.parametrize("m,g,dtype,k", ((1, 16, torch.bfloat16, HPG * DH),
                                         (5, 8, torch.float32, HPG * DH),
                                         (16, 2, torch.bfloat16, 31 * 128),
                                         (40, 3, torch.bfloat16, 128)))
def test_gemm_wgmma_swapped_kernel(m, g, dtype, k, cfg):
    """The wgmma kernel's swapped decode tile (tokens on the MMA's N side): fewer tokens than
    the tile (the TMA load zero-fills, the store clips), several token tiles (walked by
    persistent programs too), odd and single K block counts, fp32 output. Within the oracle's
    tolerance, and bit-equal to the pointer kernel's swapped tile, which promotes the same
    K blocks in the same order."""
    from torch_bridge.backends.triton import launch

    (x, w, xs, ws), y, seed = _check_wgmma(m, g, dtype, k, launch.GemmConfig(
        cfg[0], cfg[1], swap_ab=True, num_warps=4, num_stages=cfg[2], wgmma=True,
        programs_per_sm=cfg[3]))
    pointer = launch.batched_gemm_a8w8_mxscale(
        x, w, xs, ws, dtype=dtype, config=launch.GemmConfig(16, 64, swap_ab=True))
    assert torch.equal(y, pointer), f"seed {seed}"


def test_gemm_wgmma_relaunch_goes_straight_to_the_compiled_kernel():
    """After its first launch, a specialization of the wgmma kernel launches without Triton's
    dispatch: M 1024, 2048 and 1040 share one compiled kernel (M % 16 == 0, same grid), M 1000
    gets its own, and every launch is right with fresh inputs."""
    import jax.numpy as jnp

    from torch_bridge.backends.triton import _common, launch, wgmma_kernels
    from woa_jax.testing import TOLERANCES

    ok, why = launch.wgmma_available(torch.cuda.current_device())
    if not ok:
        pytest.skip(why)
    config = launch.GemmConfig(128, 128, num_warps=8, num_stages=4, wgmma=True,
                               programs_per_sm=1)
    _common.LAUNCHES.clear()
    for m in (1024, 2048, 1040, 1000, 1000):
        seed = new_seed()
        x, w, xs, ws = gemm_inputs(m, 16, N, HPG * DH, seed)
        y = torch.full((m, 16, N), float("nan"), dtype=torch.bfloat16, device="cuda")
        launch.batched_gemm_a8w8_mxscale(x, w, xs, ws, out=y, config=config)
        ref = oracle("batched_gemm_a8w8_mxscale")(jx(x), jx(w), jx(xs), jx(ws),
                                                   dtype=jnp.float32)
        err = relerr(y, ref)
        assert err <= TOLERANCES["gemm_bf16"].rel, f"M {m}, seed {seed}: relerr {err:.3g}"
    # One launch per M; Triton compiled two specializations (M % 16 == 0 or not).
    kernel = wgmma_kernels.batched_gemm_a8w8_mxscale_wgmma_kernel
    compiled = {id(c) for run in _common.LAUNCHES.values() if run.kernel is kernel
                for c, _ in run._compiled.values()}
    assert len(compiled) == 2
