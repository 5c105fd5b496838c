"""Threads and streams (``pytest -m gpu``): several threads, each on its own CUDA stream, call
every public entry point at shapes that reach every launch path, while one more thread captures
and replays CUDA graphs of layers; every output equals its single-threaded reference bit for
bit."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _stress import build_cases, graph_cases, stress, take_references  # noqa: E402
from inputs import capture, new_seed, xla_memory  # noqa: E402, F401

pytestmark = pytest.mark.gpu


def _clean(got, seed: int, calls: int, replays: int = 0) -> None:
    assert not got.errors, f"seed {seed}: {len(got.errors)} errors, first: {got.errors[:3]}"
    assert not got.mismatches, (f"seed {seed}: {len(got.mismatches)} of {got.calls} calls and "
                                f"{got.replays} replays wrong: {got.mismatches[:5]}")
    assert (got.calls, got.replays) == (calls, replays)


@pytest.fixture(scope="module")
def cases():
    seed = new_seed()
    found = build_cases(seed)
    take_references(found)
    return seed, found


def test_threads_on_their_own_streams_get_the_single_threaded_bits(cases):
    """Six threads call random cases; one more captures layers in CUDA graphs and replays
    them."""
    seed, found = cases
    got = stress(found, threads=6, calls=10_200, seed=seed, graphs=graph_cases(seed),
                 replays=600)
    _clean(got, seed, 10_200, 600)


def test_decode_calls_beside_prefill_calls(cases):
    """Decode calls on four streams while two more run the prefill kernels: each decode kernel
    shares its SMs with a long MMA kernel of another stream, which slows its MMAs down."""
    seed, found = cases
    prefill = [c for c in found if c.name.endswith("M1024")]
    decode = [c for c in found if not c.name.endswith("M1024")]
    got = stress([decode, decode, prefill], threads=6, calls=6_000, seed=seed + 1)
    _clean(got, seed, 6_000)


def test_threads_sharing_one_stream_get_the_single_threaded_bits(cases):
    """Six threads call random cases on the stream the cases were bound on: the FP8 layers'
    direct launches write the activations kept for it (``chain_eager.stream_activations``) and
    the BF16 layer's route of rotated tails (1024 tokens at G 16) its tails, so each chain's
    launches must reach the stream before another thread's first one."""
    from torch_bridge.backends.triton import _common

    seed, found = cases
    stream = torch.cuda.current_stream().cuda_stream
    kept = {key[0] for key in _common._KEPT if key[2] == stream}
    assert kept == {"fp8 activations", "bf16 tails"}, f"kept for the stream: {kept}"
    got = stress(found, threads=6, calls=3_000, seed=seed + 2, one_stream=True)
    _clean(got, seed, 3_000)


def test_capturing_a_layers_first_call_raises_and_leaves_it_usable():
    """The first call converts the weight on the calling stream; under capture that work
    would run only at replay, so it raises, and the layer works once called eagerly."""
    from inputs import checkpoint, rope_inputs

    import torch_bridge as tb

    seed = new_seed()
    w, ws = checkpoint(2, seed)
    o, pos, cos, sin = rope_inputs(4, 2, seed, rope_dtype=torch.float32)
    layer = tb.WoAProjection(w, ws, 2, cos, sin, backend="bf16")
    side = torch.cuda.Stream()
    with pytest.raises(RuntimeError, match="call it once outside capture"):
        with capture(torch.cuda.CUDAGraph(), stream=side):
            layer(o, pos)
    want = layer(o, pos)
    graph = torch.cuda.CUDAGraph()
    with capture(graph, stream=side):
        y = layer(o, pos)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, want), f"seed {seed}"
