"""The functional forms reuse a prepared layer while its tensors are the same, unmodified."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_bridge as tb  # noqa: E402
import woa_jax  # noqa: E402
from torch_bridge import projection  # noqa: E402
from torch_bridge.interop import numpy_to_torch  # noqa: E402


@pytest.fixture
def inputs():
    inp = woa_jax.example_inputs(tokens=2)
    return [a if isinstance(a, int) else numpy_to_torch(np.array(a)) for a in inp]


def test_repeated_calls_reuse_the_prepared_layer(inputs, monkeypatch):
    monkeypatch.setattr(projection, "_PREPARED", type(projection._PREPARED)())
    o, pos, cos, sin, w, ws, g = inputs
    y1 = tb.wo_a_bf16(o, pos, cos, sin, w, ws, g)
    first = projection._prepared(w, ws, g, cos, sin, backend="bf16")
    y2 = tb.wo_a_bf16(o, pos, cos, sin, w, ws, g)
    assert projection._prepared(w, ws, g, cos, sin, backend="bf16") is first
    assert len(projection._PREPARED) == 1 and torch.equal(y1, y2)


def test_a_modified_or_other_weight_is_prepared_again(inputs, monkeypatch):
    monkeypatch.setattr(projection, "_PREPARED", type(projection._PREPARED)())
    _, _, cos, sin, w, ws, g = inputs
    first = projection._prepared(w, ws, g, cos, sin, backend="bf16")
    w.view(torch.uint8)[0, 0] ^= 1  # in place: a new version of the same tensor
    assert projection._prepared(w, ws, g, cos, sin, backend="bf16") is not first
    assert projection._prepared(w.clone(), ws, g, cos, sin, backend="bf16") is not first
    for _ in range(projection._PREPARED_LAYERS + 2):
        projection._prepared(w.clone(), ws, g, cos, sin, backend="bf16")
    assert len(projection._PREPARED) == projection._PREPARED_LAYERS


def test_more_weights_than_kept_warn_once(inputs, monkeypatch, caplog):
    """A model calling the functions with more weights than they keep would prepare a layer on
    every call: the first eviction says so, once, and names the fix."""
    monkeypatch.setattr(projection, "_PREPARED", type(projection._PREPARED)())
    projection._warn_evicted.cache_clear()
    _, _, cos, sin, w, ws, g = inputs
    weights = [w.clone() for _ in range(projection._PREPARED_LAYERS + 2)]
    with caplog.at_level("WARNING", logger="woa"):
        for wi in weights[:projection._PREPARED_LAYERS]:
            projection._prepared(wi, ws, g, cos, sin, backend="bf16")
        assert not caplog.records
        for wi in weights[projection._PREPARED_LAYERS:]:
            projection._prepared(wi, ws, g, cos, sin, backend="bf16")
    (record,) = caplog.records
    assert record.levelname == "WARNING" and "Hold a WoAProjection per layer" in record.message
    assert f"more than {projection._PREPARED_LAYERS} distinct weights" in record.message
    projection._warn_evicted.cache_clear()


def test_a_weight_met_first_under_graph_capture_is_a_clear_error(inputs, monkeypatch):
    """Preparing a weight checks and copies it on the host, which a CUDA-graph capture cannot
    hold: under capture an unprepared weight names the fix instead of failing deep in torch;
    a prepared one still runs."""
    monkeypatch.setattr(projection, "_PREPARED", type(projection._PREPARED)())
    o, pos, cos, sin, w, ws, g = inputs
    y = tb.wo_a_bf16(o, pos, cos, sin, w, ws, g)
    monkeypatch.setattr(projection, "_capturing", lambda: True)
    assert torch.equal(tb.wo_a_bf16(o, pos, cos, sin, w, ws, g), y)
    with pytest.raises(RuntimeError, match="not prepared while a CUDA graph.*WoAProjection per"):
        tb.wo_a_fp8(o, pos, cos, sin, w.clone(), ws, g, backend="torch")


def test_wo_a_fp8_function_gives_fp32_outputs_when_asked(inputs):
    """``dtype`` as in ``woa_jax.wo_a_fp8`` and ``jax_ops.wo_a_fp8``: float32 outputs agree
    with the oracle's; bf16 stays the default; any other dtype is a TypeError."""
    from woa_jax.testing import assert_close

    o, pos, cos, sin, w, ws, g = inputs
    ref = woa_jax.wo_a_fp8(*woa_jax.example_inputs(tokens=2), dtype=np.float32)
    y32 = tb.wo_a_fp8(o, pos, cos, sin, w, ws, g, backend="torch", dtype=torch.float32)
    assert y32.dtype == torch.float32
    assert_close(y32.numpy(), np.asarray(ref), tolerance="gemm_bf16")
    assert tb.wo_a_fp8(o, pos, cos, sin, w, ws, g, backend="torch").dtype == torch.bfloat16
    with pytest.raises(TypeError, match="dtype must be"):
        tb.wo_a_fp8(o, pos, cos, sin, w, ws, g, backend="torch", dtype=torch.float16)
