"""A user's mistakes in building a layer: a config or group count that does not tile the stored
weight, a layer or rank of the wrong type, a missing path or layer, a device that is not here.
Each is refused where the layer is built, with the documented type and a message naming what
was stored and what was asked."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_bridge as tb
import woa_jax
from torch_bridge import TPOutputProjection, WoAProjection, checkpoint

FLASH = woa_jax.get_config("v4-flash")


def _fp8(rng: np.random.Generator, rows: int, k: int) -> torch.Tensor:
    raw = rng.integers(0, 256, size=(rows, k), dtype=np.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0x38  # no NaN encodings
    return torch.from_numpy(raw).view(torch.float8_e4m3fn)


def _e8m0(rng: np.random.Generator, rows: int, cols: int) -> torch.Tensor:
    return torch.from_numpy(rng.integers(112, 120, size=(rows, cols), dtype=np.uint8)).view(
        torch.float8_e8m0fnu)


@pytest.fixture(scope="module")
def flash_ckpt(tmp_path_factory) -> pathlib.Path:
    """A full-size V4-Flash layer 0: [8192, 4096] fp8 in 128x128 E8M0 blocks."""
    d = tmp_path_factory.mktemp("flash")
    rng = np.random.default_rng(0)
    checkpoint.save_wo_a_layer(d, 0, _fp8(rng, 8192, 4096), _e8m0(rng, 64, 32))
    return d


def _tables(rows: int = 8):
    cos, sin = woa_jax.rope_cos_sin("v4-flash", "window", rows)
    return tb.to_torch(cos), tb.to_torch(sin)


# --- a config or num_groups against the stored weight -------------------------------------------


def test_v4_pro_config_on_a_v4_flash_checkpoint_is_refused_naming_both(flash_ckpt):
    with pytest.raises(ValueError, match=(
            r"layers\.0\.attn\.wo_a\.weight is \[8192, 4096\] in 128x128 scale blocks \(that is "
            r"v4-flash's shape\), but config v4-pro with num_groups=16 expects \[16384, 4096\] in "
            r"128x128 scale blocks \(16 group\(s\) of N=1024, K=4096\)")):
        WoAProjection.from_checkpoint(flash_ckpt, 0, config="v4-pro", layer_kind="window",
                                      max_positions=8)
    with pytest.raises(ValueError, match=r"config v4-pro with num_groups=2 of its 16 expects "
                                         r"\[2048, 4096\]"):
        checkpoint.read_wo_a(flash_ckpt, 0, config="v4-pro", num_groups=2)
    # V4.1's 32x32 blocks are not V4-Flash's: the block size is part of the config.
    with pytest.raises(ValueError, match=r"config v4.1-flash .* in 32x32 scale blocks"):
        checkpoint.read_wo_a(flash_ckpt, 0, config="v4.1-flash")
    # The right config, or none (inferred), reads it.
    proj = WoAProjection.from_checkpoint(flash_ckpt, 0, config="v4-flash", layer_kind="window",
                                         max_positions=8, tp_size=8, tp_rank=3)
    assert (proj.num_groups, proj.n, proj.k) == (1, 1024, 4096)


def test_one_ranks_slice_read_as_the_whole_layer_says_how_to_read_it(tmp_path):
    rng = np.random.default_rng(4)
    checkpoint.save_wo_a_layer(tmp_path, 0, _fp8(rng, 2048, 4096), _e8m0(rng, 16, 32))
    with pytest.raises(ValueError, match=r"config v4-flash with num_groups=8 expects \[8192, "
                                         r"4096\] .*; pass the checkpoint's config, or "
                                         r"num_groups=2 for one rank's slice of 2 group\(s\)"):
        checkpoint.read_wo_a(tmp_path, 0, config="v4-flash")
    assert checkpoint.read_wo_a(tmp_path, 0, config="v4-flash", num_groups=2).local_groups == 2


def test_config_json_that_disagrees_with_the_weight_is_refused(tmp_path, flash_ckpt):
    for f in flash_ckpt.iterdir():
        (tmp_path / f.name).symlink_to(f)
    (tmp_path / "config.json").write_text(json.dumps({"o_groups": 16}))
    with pytest.raises(ValueError, match=r"num_groups=16 would make N=512, but every released "
                                         r"DeepSeek V4 config with K=4096 has N=1024, so it "
                                         r"holds 8 group\(s\)"):
        WoAProjection.from_checkpoint(tmp_path, 0, layer_kind="window", max_positions=8)


def test_constructor_refuses_a_num_groups_that_makes_another_n():
    """One V4-Flash TP8 rank's weight (one group of N = 1024) is not two groups of 512."""
    rng = np.random.default_rng(1)
    w, ws = _fp8(rng, 1024, 4096), _e8m0(rng, 8, 32)
    with pytest.raises(ValueError, match=r"weight is \[1024, 4096\] in 128x128 scale blocks: "
                                         r"num_groups=2 would make N=512, .* so it holds "
                                         r"1 group\(s\); pass that num_groups, or config="):
        WoAProjection(w, ws, 2, *_tables())
    assert WoAProjection(w, ws, 1, *_tables()).n == 1024
    # A config says which N the weight holds: other shapes build with one that describes them.
    half = dataclasses.replace(FLASH, name="half-n", o_lora_rank=512)
    assert WoAProjection(w, ws, 2, *_tables(), config=half).n == 512
    with pytest.raises(ValueError, match=r"config v4-flash with num_groups=2 of its 8 expects "
                                         r"\[2048, 4096\]"):
        WoAProjection(w, ws, 2, *_tables(), config="v4-flash")
    with pytest.raises(ValueError, match="num_groups=3 of its 8"):
        WoAProjection(_fp8(rng, 3072, 4096), _e8m0(rng, 24, 32), 3, *_tables(),
                      config="v4-flash")


def test_tp_from_tensors_checks_the_rank_slice_against_the_config():
    rng = np.random.default_rng(2)
    tiny = dataclasses.replace(FLASH, name="tiny", hidden_size=128, num_heads=4, o_groups=2,
                               head_dim=128, o_lora_rank=128)
    wa, sa = _fp8(rng, 256, 256), _e8m0(rng, 2, 2)
    wb, sb = _fp8(rng, 128, 256), _e8m0(rng, 1, 2)
    proj = TPOutputProjection.from_tensors(wa, sa, wb, sb, tiny, *_tables())
    assert (proj.wo_a.num_groups, proj.wo_a.n) == (2, 128)
    with pytest.raises(ValueError, match=r"tiny: wo_a weight has shape \(128, 256\)"):
        TPOutputProjection.from_tensors(wa[:128], sa[:1], wb, sb, tiny, *_tables())


# --- the error contract of the loaders ----------------------------------------------------------


def test_layer_given_as_a_string_is_a_type_error_not_a_missing_layer(flash_ckpt):
    with pytest.raises(TypeError, match="layer must be an integer, got str '0'"):
        WoAProjection.from_checkpoint(flash_ckpt, "0", layer_kind="window", max_positions=8)
    with pytest.raises(TypeError, match="tp_size must be an integer, got float 2.0"):
        checkpoint.read_wo_a(flash_ckpt, 0, tp_size=2.0)
    assert checkpoint.read_wo_a(flash_ckpt, np.int64(0), tp_size=8).local_groups == 1


def test_missing_layer_lists_the_layers_present(tmp_path):
    rng = np.random.default_rng(3)
    extra = {f"layers.{i}.attn.wo_a.weight": _fp8(rng, 256, 256) for i in (0, 1, 2, 7)}
    checkpoint.save_wo_a_layer(tmp_path, 5, _fp8(rng, 256, 256), _e8m0(rng, 2, 2), extra=extra)
    with pytest.raises(tb.CheckpointError, match=r"no wo_a weight for layer 3 in the "
                                                 r"checkpoint; layers with one: 0-2, 5, 7"):
        checkpoint.read_wo_a(tmp_path, 3, num_groups=2)
    with pytest.raises(ValueError, match="layer must be at least 0, got -1"):
        checkpoint.find_wo_a(checkpoint.tensor_files(tmp_path), -1)


def test_missing_path_is_a_checkpoint_error(tmp_path):
    for path in (tmp_path / "nope", tmp_path):  # nothing there; a directory without shards
        with pytest.raises(tb.CheckpointError, match="does not exist|no \\*.safetensors files"):
            WoAProjection.from_checkpoint(path, 0, layer_kind="window")


def test_a_device_that_cannot_be_used_is_a_value_error_with_the_reason(flash_ckpt, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device, why in (("cuda", "no such device here: torch sees no CUDA or ROCm GPU"),
                        ("meta", "meta tensors hold no data"),
                        ("nonsense", "is not a device")):
        with pytest.raises(ValueError, match=why):
            WoAProjection.from_checkpoint(flash_ckpt, 0, layer_kind="window", device=device)
    with pytest.raises(TypeError, match="device must be a torch.device"):
        WoAProjection.from_checkpoint(flash_ckpt, 0, layer_kind="window", device=[0])
    assert WoAProjection.from_checkpoint(flash_ckpt, 0, layer_kind="window", max_positions=8,
                                         device="cpu", tp_size=8).weight.device.type == "cpu"


#: Mutations of a valid ``from_checkpoint`` call: (argument, bad value, documented type).
_MUTATIONS = {
    "layer": [("0", TypeError), (0.0, TypeError), (None, TypeError), (True, TypeError),
              (1, tb.CheckpointError), (-1, ValueError)],
    "tp_rank": [("0", TypeError), (1.0, TypeError), (-1, ValueError), (8, ValueError)],
    "tp_size": [("8", TypeError), (None, TypeError), (0, ValueError), (3, ValueError)],
    "num_groups": [("8", TypeError), (8.0, TypeError), (0, ValueError), (16, ValueError),
                   (3, ValueError)],
    "config": [("v4-pro", ValueError), ("nope", ValueError), ("v4.1-flash", ValueError)],
    "device": [("cuda", ValueError), ("meta", ValueError), ("bogus", ValueError),
               ([1], TypeError), (2.5, TypeError)],
    "path": [("missing", tb.CheckpointError), ("empty dir", tb.CheckpointError),
             ("not safetensors", tb.CheckpointError), (3, TypeError)],
}


def _path(value, tmp: pathlib.Path):
    if not isinstance(value, str):
        return value
    if value == "missing":
        return tmp / "no" / "such"
    if value == "empty dir":
        (tmp / "empty").mkdir(exist_ok=True)
        return tmp / "empty"
    bad = tmp / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    return bad


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_loader_mistakes_raise_the_documented_type(flash_ckpt, tmp_path_factory, data):
    """Any one or two mistakes in ``from_checkpoint``'s arguments raise one of their documented
    types, never a ``KeyError``, ``FileNotFoundError``, ``AssertionError`` or ``RuntimeError``."""
    tmp = tmp_path_factory.mktemp("mistakes")
    args = dict(path=flash_ckpt, layer=0, tp_rank=0, tp_size=8, num_groups=None, config=None,
                device=None)
    picked = data.draw(st.lists(st.sampled_from(sorted(_MUTATIONS)), min_size=1, max_size=2,
                                unique=True), label="arguments")
    expected = set()
    for arg in picked:
        value, kind = data.draw(st.sampled_from(_MUTATIONS[arg]), label=arg)
        args[arg] = _path(value, tmp) if arg == "path" else value
        expected.add(kind)
    if args["tp_size"] == 3 and args["num_groups"] == 3:  # 3 groups do not tile 8192 rows
        expected.add(ValueError)
    with pytest.MonkeyPatch.context() as mp, pytest.raises(tuple(expected)):
        mp.setattr(torch.cuda, "is_available", lambda: False)  # "cuda" is not here on any host
        WoAProjection.from_checkpoint(args["path"], args["layer"], args["tp_rank"],
                                      args["tp_size"], config=args["config"],
                                      num_groups=args["num_groups"], device=args["device"],
                                      layer_kind="window", max_positions=8)
        pytest.fail(f"from_checkpoint returned for {picked}")
