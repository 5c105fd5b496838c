"""One weight intake (``torch_bridge._weights``): ``WoAProjection`` and ``WoBProjection`` refuse a
bad checkpoint weight with the same message, and a valid one the FP8 path cannot take with the
same reason; only the names of the projection, the weight, its scale and the view differ."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from inputs import np_to_torch, rope_case, wo_a_checkpoint

from torch_bridge import WoAProjection
from torch_bridge.wo_b import WoBProjection

G, N, K = 2, 128, 128  # one [256, 128] weight: wo_a's G x [N, K], or wo_b's [hidden, K']


def _wo_a(weight, scale):
    c = rope_case(np.random.default_rng(1), s=1, h=2, dh=K, rd=64, num_groups=G)
    return WoAProjection(weight, scale, G, *c.torch()[2:])


#: Per layer: its constructor on ``(weight, weight_scale)`` and the names its messages use.
LAYERS = {
    "WoAProjection": (_wo_a, dict(proj="wo_a", weight="weight", scale="weight_scale",
                                  view="[G, N, K]")),
    "WoBProjection": (WoBProjection, dict(proj="wo_b", weight="wo_b weight",
                                          scale="wo_b weight_scale", view="[1, hidden, K']")),
}


def _checkpoint() -> tuple[torch.Tensor, torch.Tensor]:
    w, sc = wo_a_checkpoint(np.random.default_rng(0), g=G, n=N, k=K)
    return np_to_torch(w), np_to_torch(sc)


def _float_scales(sc: torch.Tensor) -> torch.Tensor:
    return torch.exp2(sc.view(torch.uint8).float() - 127)


def _nan_weight_byte(w, sc):
    w = w.clone()
    w.view(torch.uint8)[3, 5] = 0x7F
    return w, sc


def _nan_scale_byte(w, sc):
    sc = sc.clone()
    sc.view(torch.uint8)[0, 0] = 0xFF
    return w, sc


def _negative_scale(w, sc):
    sc = _float_scales(sc)
    sc[1, 0] = -0.25
    return w, sc


def _strided(w, sc):
    return w.view(torch.uint8).t().contiguous().t().view(w.dtype), sc


#: ``(make bad (weight, scale) from good ones, error type, message with the layer's names)``.
BAD = {
    "unquantized with a scale": (
        lambda w, sc: (torch.zeros(w.shape, dtype=torch.bfloat16), sc), ValueError,
        "a bfloat16 {proj} weight is unquantized and takes no scale; got a weight_scale of "
        "shape (2, 1)"),
    "fp8 without a scale": (
        lambda w, sc: (w, None), ValueError,
        "an FP8 (float8_e4m3fn) {proj} weight needs its block scale (checkpoint '.scale' / "
        "'weight_scale_inv'), got None"),
    "int8 weight": (
        lambda w, sc: (w.view(torch.int8), None), TypeError,
        "{weight} must be float8_e4m3fn, float8_e4m3fnuz or an unquantized "
        "bfloat16/float16/float32 tensor, got int8"),
    "on meta": (
        lambda w, sc: (w.to("meta"), sc.to("meta")), ValueError,
        "weight, weight_scale are on the meta device, which holds no data; checkpoint tensors "
        "are checked for corrupt values at load, so pass them on the CPU or a GPU"),
    "not contiguous": (
        _strided, ValueError,
        "{weight} must be contiguous to be viewed as {view}; pass weight.contiguous()"),
    "NaN fp8 byte": (
        _nan_weight_byte, ValueError,
        "{weight}: element [3, 5] is NaN (fp8 byte 0x7f); expected finite fp8 values, so the "
        "checkpoint is corrupt"),
    "E8M0 NaN byte": (
        _nan_scale_byte, ValueError,
        "{scale}: element [0, 0] is the E8M0 NaN byte 255; expected bytes 0..254, so the "
        "checkpoint is corrupt"),
    "negative float scale": (
        _negative_scale, ValueError,
        "{scale}: element [1, 0] = -0.25; expected finite scales > 0, so the checkpoint is "
        "corrupt"),
}


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("case", BAD)
def test_both_layers_refuse_a_bad_weight_with_the_same_message(layer, case):
    build, names = LAYERS[layer]
    make, error, message = BAD[case]
    with pytest.raises(error) as e:
        build(*make(*_checkpoint()))
    assert str(e.value) == message.format(**names)


@pytest.mark.parametrize("layer", LAYERS)
def test_both_layers_give_the_same_reason_when_fp8_cannot_take_the_weight(layer):
    build, names = LAYERS[layer]
    w, sc = _checkpoint()
    odd = _float_scales(sc)
    odd[0, 0] *= 1.5
    assert build(w, odd).fp8_unavailable == (
        f"weight scale unusable by the FP8 path: {names['scale']} is not losslessly "
        f"representable as E8M0: element [0, 0] = {float(odd[0, 0])!r} is not a power of two")
    plain = build(torch.zeros(w.shape, dtype=torch.bfloat16), None)
    assert plain.fp8_unavailable == "bfloat16 checkpoint has no scale"
    assert plain.weight_fp8 is None and plain.weight_bf16.dtype == torch.bfloat16
