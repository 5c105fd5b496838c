"""Triton launches and JAX exchange on a host with two GPUs (``pytest -m gpu``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from inputs import DH, HPG, N, gemm_inputs, new_seed, rope_inputs, xla_memory  # noqa: E402, F401

pytestmark = pytest.mark.gpu


def test_operands_on_a_gpu_that_is_not_the_current_device():
    """Triton launches on torch's current device; the launchers switch to the operands' GPU
    (and back). Quant, the decode GEMM (split-K at G = 2 included: its counters are cuda:1's)
    and the wgmma GEMM on cuda:1 while cuda:0 is current give the bytes they give on cuda:0
    (all are deterministic)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    from torch_bridge.backends.triton import launch

    other = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    seed = new_seed()
    rope = rope_inputs(64, 16, seed)
    here = launch.inverse_rope_group_quant(*rope, 16, 128)
    there = launch.inverse_rope_group_quant(*(t.to(other) for t in rope), 16, 128)
    for a, b in zip(here, there, strict=True):
        assert b.device == other
        assert torch.equal(a.view(torch.uint8).cpu(), b.view(torch.uint8).cpu()), f"seed {seed}"
    for m, g in ((1, 16), (16, 2), (1024, 16)):
        gemm = gemm_inputs(m, g, N, HPG * DH, seed)
        y = launch.batched_gemm_a8w8_mxscale(*gemm)
        y_other = launch.batched_gemm_a8w8_mxscale(*(t.to(other) for t in gemm))
        assert torch.equal(y.cpu(), y_other.cpu()), f"M {m}, G {g}, seed {seed}"
    assert torch.cuda.current_device() == 0


def test_first_jax_export_on_a_two_gpu_host():
    """Starting JAX's GPU backend makes its last GPU current; the first ``to_jax`` of a process
    (which starts it) must still export tensors from cuda:0 and cuda:1."""
    import subprocess
    import sys

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    script = ("import torch\n"
              "from torch_bridge import interop\n"
              "for d in (0, 1, 0):\n"
              "    t = torch.arange(6, dtype=torch.bfloat16, device=f'cuda:{d}')\n"
              "    j = interop.to_jax(t)\n"
              "    assert j.tolist() == t.tolist() and j.devices().pop().id == d, (d, j)\n"
              "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
