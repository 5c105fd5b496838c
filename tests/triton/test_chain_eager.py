"""Eager repeats keep buffers per stream (``_common.stream_buffers``): the FP8 chain's quantized
activations (``chain_eager.stream_activations``), the BF16 chain's rotated tails; the registry's
rules, on CPU tensors."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from torch_bridge.backends.triton import _common, chain_eager  # noqa: E402


@pytest.fixture(autouse=True)
def _empty_registry():
    saved = dict(_common._KEPT)
    _common._KEPT.clear()
    yield
    _common._KEPT.clear()
    _common._KEPT.update(saved)


def test_one_set_per_stream_and_problem_sized_to_the_scratch_bound():
    cpu = torch.device("cpu")
    fp8 = torch.float8_e4m3fn
    a = chain_eager.stream_activations(cpu, 7, fp8, 2, 4096, 128)
    assert chain_eager.stream_activations(cpu, 7, fp8, 2, 4096, 128) is a
    x, scale = a.tensors
    assert x.shape == (chain_eager.SCRATCH_BYTES // (2 * 4096), 2, 4096) and x.dtype == fp8
    assert scale.shape == (x.shape[0], 2, 32) and scale.dtype == torch.uint8
    others = {chain_eager.stream_activations(cpu, 8, fp8, 2, 4096, 128),
              chain_eager.stream_activations(cpu, 7, fp8, 16, 4096, 128),
              chain_eager.stream_activations(cpu, 7, fp8, 2, 4096, 32)}
    assert len(others) == 3 and a not in others
    assert len(_common._KEPT) == 4
    assert chain_eager.stream_activations(cpu, 7, fp8, 16, 4096, 128).tensors[0].shape[0] == 256


def test_threads_asking_at_once_get_one_set():
    cpu = torch.device("cpu")
    got, start = [], threading.Barrier(8)

    def ask():
        start.wait()
        got.append(chain_eager.stream_activations(cpu, 3, torch.float8_e4m3fn, 4, 4096, 128))

    workers = [threading.Thread(target=ask) for _ in range(8)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert len(got) == 8 and all(a is got[0] for a in got)


def test_cpu_calls_bind_no_direct_launch():
    """Direct launches are CUDA's: a CPU call signature binds none (the op's path runs)."""
    o = torch.zeros((16, 8, 512), dtype=torch.bfloat16)
    pos = torch.zeros(16, dtype=torch.int32)
    cos = sin = torch.ones((64, 32))
    w = torch.zeros((2, 1024, 4096), dtype=torch.float8_e4m3fn)
    ws = torch.zeros((2, 8, 32), dtype=torch.uint8)
    assert chain_eager.eager_wo_a_fp8(o, pos, cos, sin, w, ws, 2, 1e-8) is None
    w_bf16 = torch.zeros((2, 1024, 2048), dtype=torch.bfloat16)
    assert chain_eager.eager_wo_a_bf16(o, pos, cos, sin, w_bf16, 2) is None
    assert not _common._KEPT
