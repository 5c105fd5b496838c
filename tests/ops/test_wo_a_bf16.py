"""``wo_a_bf16``, the BF16 fallback chain (inverse RoPE, then a BF16 GEMM) on the Triton kernels:
the rotation (``inverse_rope``, copying or in place), the GEMM from ``o`` (``bf16_kernels``: A's
NoPE tiles read from ``o``, its rope tiles from a buffer of the rotated tails or, in the
one-launch chain, rotated by the GEMM itself; ``o`` never written) and the chain the
dispatcher's ``bf16`` backend runs (the caller's ``o`` untouched unless it opts in, the rotated
lanes with the torch rotation's bits).

Interpreter axis: tiny shapes, CPU under ``TRITON_INTERPRET=1`` (tests/conftest.py; on a GPU
machine these run on the GPU) against ``woa_jax.wo_a_bf16`` within ``gemm_bf16``; the tails, and
the one-launch chain's rotated lanes, bit for bit against the rotation of ``inverse_rope``. GPU
axis (``pytest -m gpu``): DeepSeek V4 sizes against the cuBLAS path and the oracle's rotation.
The kernels compiled for sm_90 and AMD: ``test_codegen.py``; the launch rules:
``tests/triton/test_configs.py``.
"""

from __future__ import annotations

import ast

import jax
import numpy as np
import pytest

import woa_jax
from woa_jax.testing import assert_bitwise_equal, assert_close, to_numpy

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from inputs import (  # noqa: E402, F401
    DEVICE,
    DH,
    HPG,
    RD,
    ROPE_TABLES,
    TABLE_SHAPES,
    N,
    as_bits,
    checkpoint_tensors,
    count_differing,
    jax_view,
    jx,
    new_seed,
    np_to_torch,
    rope_case,
    rope_inputs,
    rope_tensors,
    wo_a_checkpoint,
    xla_memory,
)

import torch_bridge as tb  # noqa: E402
from torch_bridge import _dispatch  # noqa: E402
from torch_bridge.backends.torch_ref import inverse_rope  # noqa: E402
from torch_bridge.backends.triton import (  # noqa: E402
    _common,
    bf16_configs,
    bf16_kernels,
    chain,
    launch,
    plans,
)
from torch_bridge.backends.triton.bf16_configs import Bf16GemmConfig  # noqa: E402

gpu = pytest.mark.gpu
pytestmark = pytest.mark.usefixtures("clean_dispatch")  # the tests through the dispatcher

# ---------------------------------------------------------------------------------------------
# Interpreter axis: tiny shapes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rope_dtype", [torch.float32, torch.bfloat16])
def test_inverse_rope_in_place_and_copying_give_the_oracle_bits(rng, rope_dtype):
    """The BF16 chain's rotation: the copying variant (one read of ``o``, NoPE lanes copied)
    leaves ``o`` as it was, the in-place one rotates ``o``; both give the oracle's bits, and a
    head-padded ``o`` (Dh contiguous only) is copied but not rotated in place."""
    o, pos, cos, sin = rope_tensors(rng, s=37, rope_dtype=rope_dtype)
    ref = np.asarray(woa_jax.inverse_rope(*jx(o, pos, cos, sin))).view(np.uint16)
    before = o.clone()
    y = launch.inverse_rope(o, pos, cos, sin)
    assert y is not o and y.is_contiguous()
    assert torch.equal(o.view(torch.int16), before.view(torch.int16))
    np.testing.assert_array_equal(to_numpy(y).view(np.uint16), ref)
    x = o.clone()
    assert launch.inverse_rope(x, pos, cos, sin, overwrite_o=True) is x
    np.testing.assert_array_equal(to_numpy(x).view(np.uint16), ref)
    padded = torch.zeros((37, 4, 640), dtype=torch.bfloat16, device=DEVICE)[:, :, :512]
    padded.copy_(o)
    np.testing.assert_array_equal(to_numpy(launch.inverse_rope(padded, pos, cos, sin))
                                  .view(np.uint16), ref)
    with pytest.raises(ValueError, match="packed"):
        launch.inverse_rope(padded, pos, cos, sin, overwrite_o=True)
    with pytest.raises(TypeError, match="bfloat16"):
        launch.inverse_rope(o.float(), pos, cos, sin)


@pytest.mark.parametrize("inplace", [False, True])
def test_bf16_chain_matches_the_oracle_and_keeps_o_unless_in_place(rng, inplace):
    o, pos, cos, sin = rope_tensors(rng, rope_dtype=torch.float32)
    g, n = 2, 128
    weight, scale, w_bf16 = checkpoint_tensors(rng, g, n, 1024)
    ref = woa_jax.wo_a_bf16(*jx(o, pos, cos, sin, weight, scale), g)
    rotated = np.asarray(woa_jax.inverse_rope(*jx(o, pos, cos, sin))).view(np.uint16)
    before = o.clone()
    y = launch.wo_a_bf16(o, pos, cos, sin, w_bf16, g, overwrite_o=inplace)
    assert_close(y, ref, tolerance="gemm_bf16")
    if inplace:
        np.testing.assert_array_equal(to_numpy(o).view(np.uint16), rotated)
    else:
        assert torch.equal(o.view(torch.int16), before.view(torch.int16))


#: ``(H, Dh, G, N)`` of ``_small_chain``: two groups of two 128-lane heads, 64 rope lanes.
_SMALL = (4, 128, 2, 32)


def _small_chain(rng):
    """``(o [3, H, Dh], positions, cos, sin, w [G, N, K])`` of a small BF16 chain call."""
    h, dh, g, n = _SMALL
    o, pos, cos, sin = rope_tensors(rng, s=3, h=h, dh=dh, rd=64)
    return o, pos, cos, sin, checkpoint_tensors(rng, g, n, h * dh // g)[2]


def _run(o, pos, cos, sin, w, cfg: Bf16GemmConfig):
    """The fused launch with its tails buffer exposed: ``(y [S, G, N], tails [S, H, rd])``."""
    s, h, _ = o.shape
    g, n, _ = w.shape
    tails = torch.empty((s, h, 2 * cos.shape[1]), dtype=torch.bfloat16, device=o.device)
    out = torch.empty((s, g, n), dtype=torch.bfloat16, device=o.device)
    _common.run_mutating(chain._wo_a_bf16_op, (tails, out), o, pos, cos, sin, w, tails, out,
                         cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages,
                         cfg.tma)
    return out, tails


def _unchanged(o, before, name="o"):
    assert torch.equal(o.view(torch.int16), before.view(torch.int16)), f"{name} was written"


# (H, Dh, rd, G): the real head (512 / 64), a small head, a rope dim of two K tiles, the
# backend test's 64 / 32 head, and groups that start inside a head (G > H).
HEADS = [(2, 512, 64, 2), (4, 128, 64, 1), (4, 128, 64, 2), (2, 256, 128, 2), (4, 64, 32, 2),
         (1, 256, 64, 2)]


@pytest.mark.parametrize("s", [1, 3, 17])
@pytest.mark.parametrize("h,dh,rd,g", HEADS, ids=lambda v: str(v))
def test_matches_the_oracle_and_keeps_o(rng, s, h, dh, rd, g):
    o, pos, cos, sin = rope_tensors(rng, s=s, h=h, dh=dh, rd=rd, rope_dtype=torch.float32)
    n = 48  # not a multiple of the decode tiles' 32 or 64 weight rows
    weight, scale, w = checkpoint_tensors(rng, g, n, h * dh // g)
    before = o.clone()
    y = launch.wo_a_bf16(o, pos, cos, sin, w, g)
    _unchanged(o, before)
    assert y.shape == (s, g, n) and y.dtype == torch.bfloat16
    assert_close(y, woa_jax.wo_a_bf16(*jx(o, pos, cos, sin, weight, scale), g),
                 tolerance="gemm_bf16")


CONFIGS = [Bf16GemmConfig(16, 16, 64), Bf16GemmConfig(32, 32, 32, num_stages=2),
           Bf16GemmConfig(16, 64, 16, num_warps=2), Bf16GemmConfig(16, 16, 64, tma=True),
           Bf16GemmConfig(32, 16, 32, tma=True), Bf16GemmConfig(16, 32, 64, tma=True)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.label())
@pytest.mark.parametrize("rope_dtype,pos_dtype", [(torch.float32, torch.int64),
                                                  (torch.bfloat16, torch.int32)])
def test_tails_are_the_rotation_bits_at_every_tile(rng, cfg, rope_dtype, pos_dtype):
    """The tails buffer holds exactly the rope lanes ``inverse_rope`` writes, whatever the GEMM
    tile (pointer or TMA; TMA with N = 48 and 32 weight rows falls back to pointer loads)."""
    h, dh, rd, g, n = 4, 128, 64, 2, 48
    o, pos, cos, sin = rope_tensors(rng, s=17, h=h, dh=dh, rd=rd, rope_dtype=rope_dtype,
                                    pos_dtype=pos_dtype)
    weight, scale, w = checkpoint_tensors(rng, g, n, h * dh // g)
    before = o.clone()
    y, tails = _run(o, pos, cos, sin, w, cfg)
    _unchanged(o, before)
    rotated = launch.inverse_rope(o, pos, cos, sin)
    assert_bitwise_equal(to_numpy(tails).view(np.uint16),
                         to_numpy(rotated[:, :, dh - rd:]).view(np.uint16), name="tails")
    assert_close(y, woa_jax.wo_a_bf16(*jx(o, pos, cos, sin, weight, scale), g),
                 tolerance="gemm_bf16")


#: Whole-head layouts of ``HEADS`` (the one-launch chain's).
WHOLE_HEADS = [c for c in HEADS if (c[0] * c[1] // c[3]) % c[1] == 0]


@pytest.mark.parametrize("s", [1, 17])
@pytest.mark.parametrize("h,dh,rd,g", WHOLE_HEADS, ids=lambda v: str(v))
def test_one_launch_chain_matches_the_oracle_and_rotates_with_inverse_ropes_bits(
        rng, s, h, dh, rd, g):
    """``rotate``: within ``gemm_bf16`` of the oracle, ``o`` unchanged; with one-hot weight rows
    (each output is one lane of A times 1) the outputs are ``inverse_rope``'s lanes, bit for
    bit, NoPE and rope lanes alike."""
    o, pos, cos, sin = rope_tensors(rng, s=s, h=h, dh=dh, rd=rd, rope_dtype=torch.float32)
    k = h * dh // g
    cfg = Bf16GemmConfig(16, 16, min(64, rd), num_stages=2, rotate=True)
    weight, scale, w = checkpoint_tensors(rng, g, 48, k)
    before = o.clone()
    y = launch.wo_a_bf16(o, pos, cos, sin, w, g, config=cfg)
    _unchanged(o, before)
    assert_close(y, woa_jax.wo_a_bf16(*jx(o, pos, cos, sin, weight, scale), g),
                 tolerance="gemm_bf16")
    lanes = torch.cat([torch.arange(0, k, 7), torch.arange(dh - rd, dh)]).to(DEVICE)
    one_hot = torch.zeros((g, lanes.numel(), k), dtype=torch.bfloat16, device=DEVICE)
    one_hot[:, torch.arange(lanes.numel()), lanes] = 1
    y = launch.wo_a_bf16(o, pos, cos, sin, one_hot, g, config=cfg)
    want = launch.inverse_rope(o, pos, cos, sin).reshape(s, g, k)[:, :, lanes]
    assert_bitwise_equal(to_numpy(y).view(np.uint16), to_numpy(want).view(np.uint16), name="y")


@pytest.mark.parametrize("s", [1, 17])
def test_one_launch_chain_splits_k_by_heads(rng, s):
    """``split_k``: each K part takes whole heads and the last part adds the parts in order:
    within ``gemm_bf16`` of the oracle, the one-hot outputs (one lane times 1, the other
    parts adding zeros) still ``inverse_rope``'s bits, and the counters back at zero."""
    from torch_bridge.backends.triton import split_k

    h, dh, rd, g = 8, 128, 64, 2
    o, pos, cos, sin = rope_tensors(rng, s=s, h=h, dh=dh, rd=rd, rope_dtype=torch.float32)
    k = h * dh // g
    weight, scale, w = checkpoint_tensors(rng, g, 48, k)
    want = woa_jax.wo_a_bf16(*jx(o, pos, cos, sin, weight, scale), g)
    lanes = torch.cat([torch.arange(0, k, 7), torch.arange(dh - rd, dh)]).to(DEVICE)
    one_hot = torch.zeros((g, lanes.numel(), k), dtype=torch.bfloat16, device=DEVICE)
    one_hot[:, torch.arange(lanes.numel()), lanes] = 1
    rotated = launch.inverse_rope(o, pos, cos, sin).reshape(s, g, k)[:, :, lanes]
    for split in (2, 4):
        cfg = Bf16GemmConfig(16, 16, 64, num_stages=2, rotate=True, split_k=split)
        assert_close(launch.wo_a_bf16(o, pos, cos, sin, w, g, config=cfg), want,
                     tolerance="gemm_bf16")
        y = launch.wo_a_bf16(o, pos, cos, sin, one_hot, g, config=cfg)
        assert_bitwise_equal(to_numpy(y).view(np.uint16), to_numpy(rotated).view(np.uint16),
                             name=f"y, K in {split}")
    pool = split_k.COUNTER_POOLS[o.device]
    assert not pool.counters.any(), "a split launch left a counter set"


def test_strided_o_is_read_in_place(rng):
    """Padded token and head strides: the GEMM reads ``o`` where it lies (no copy of ``o``),
    and the TMA config, which needs packed heads, falls back to pointer loads."""
    s, h, dh, rd, g, n = 5, 4, 128, 64, 2, 32
    o, pos, cos, sin = rope_tensors(rng, s=s, h=h, dh=dh, rd=rd)
    weight, scale, w = checkpoint_tensors(rng, g, n, h * dh // g)
    ref = woa_jax.wo_a_bf16(*jx(o, pos, cos, sin, weight, scale), g)
    big = torch.zeros((s, h + 1, dh + 64), dtype=torch.bfloat16, device=DEVICE)
    strided = big[:, :h, :dh]
    strided.copy_(o)
    before = big.clone()
    for cfg in (None, Bf16GemmConfig(16, 32, 64, tma=True)):
        y = launch.wo_a_bf16(strided, pos, cos, sin, w, g, config=cfg)
        assert_close(y, ref, tolerance="gemm_bf16")
        _unchanged(big, before, "the padded o")
    assert not chain.bf16_tma_ok(strided, w, 32)


def test_the_rule_picks_the_path_and_both_agree(rng, monkeypatch):
    """``bf16_configs.bf16_gemm_chosen`` alone decides between the GEMM from ``o`` (the one-launch
    chain at these 3 tokens) and the rotated copy with cuBLAS (torch's GEMM here); in place is
    always the rotation of ``o`` itself."""
    h, dh, g, n = _SMALL
    o, pos, cos, sin, w = _small_chain(rng)
    runs = []
    monkeypatch.setattr(_common, "LAUNCHES", {})
    for name in ("wo_a_bf16", "wo_a_bf16_rotating"):
        real = getattr(plans, name)
        monkeypatch.setattr(plans, name,
                            lambda *a, name=name, real=real, **k:
                            runs.append(name) or real(*a, **k))
    monkeypatch.setattr(bf16_configs, "bf16_gemm_chosen", lambda *a, **k: True)
    y = launch.wo_a_bf16(o, pos, cos, sin, w, g)
    assert runs == ["wo_a_bf16_rotating"]
    monkeypatch.setattr(bf16_configs, "bf16_gemm_chosen", lambda *a, **k: False)
    y_copy = launch.wo_a_bf16(o, pos, cos, sin, w, g)
    assert len(runs) == 1
    assert_close(y, y_copy, tolerance="gemm_bf16")
    x = o.clone()
    y_inplace = launch.wo_a_bf16(x, pos, cos, sin, w, g, overwrite_o=True)
    assert len(runs) == 1 and not torch.equal(x, o)
    assert_close(y_inplace, y_copy, tolerance="gemm_bf16")


def test_plan_is_reused_and_keyed_on_layout(rng, monkeypatch):
    """A repeated call reuses its launch plan; a padded ``o`` or another config gets its own."""
    h, dh, g, n = _SMALL
    o, pos, cos, sin, w = _small_chain(rng)
    made = []
    monkeypatch.setattr(_common, "LAUNCHES", {})
    for name in ("wo_a_bf16", "wo_a_bf16_rotating"):
        real = getattr(plans, name)
        monkeypatch.setattr(plans, name, lambda *a, real=real, **k: made.append(
            next(c for c in a if isinstance(c, Bf16GemmConfig))) or real(*a, **k))
    y = launch.wo_a_bf16(o, pos, cos, sin, w, g, from_o=True)
    assert_bitwise_equal(launch.wo_a_bf16(o, pos, cos, sin, w, g, from_o=True), y)
    assert len(made) == 1
    padded = torch.zeros((3, h, dh + 64), dtype=torch.bfloat16, device=DEVICE)[:, :, :dh]
    padded.copy_(o)
    assert_bitwise_equal(launch.wo_a_bf16(padded, pos, cos, sin, w, g, from_o=True), y)
    cfg = Bf16GemmConfig(16, 32, 32, num_warps=2, num_stages=2)
    assert_close(launch.wo_a_bf16(o, pos, cos, sin, w, g, config=cfg), y, tolerance="gemm_bf16")
    assert len(made) == 3 and made[-1] == cfg


def test_zero_tokens_and_heads_the_gemm_cannot_tile(rng):
    h, dh, g, n = _SMALL
    o, pos, cos, sin, w = _small_chain(rng)
    assert launch.wo_a_bf16(o[:0], pos[:0], cos, sin, w, g, from_o=True).shape == (0, g, n)
    # Head dim 24, rope dim 8: no K tile of 16 lanes lies on one side of the rope boundary.
    o, pos, cos, sin = rope_tensors(rng, s=3, h=4, dh=24, rd=8)
    w = torch.ones((2, 16, 48), dtype=torch.bfloat16, device=DEVICE)
    assert bf16_configs.bf16_gemm_blocker(24, 8, 48) is not None
    before = o.clone()
    y = launch.wo_a_bf16(o, pos, cos, sin, w, 2)  # the default takes the rotated copy
    _unchanged(o, before)
    assert_close(y, torch.einsum("sgk,gnk->sgn", launch.inverse_rope(o, pos, cos, sin).view(
        3, 2, 48).float(), w.float()), tolerance="gemm_bf16")
    with pytest.raises(ValueError, match="no K tile"):
        launch.wo_a_bf16(o, pos, cos, sin, w, 2, from_o=True)


def test_bad_inputs_give_clear_errors(rng):
    h, dh, g, n = _SMALL
    o, pos, cos, sin, w = _small_chain(rng)
    with pytest.raises(ValueError, match="num_groups = 4 groups of K"):
        launch.wo_a_bf16(o, pos, cos, sin, w, 4)
    with pytest.raises(ValueError, match="overwrite_o=True"):
        launch.wo_a_bf16(o, pos, cos, sin, w, g, overwrite_o=True, from_o=True)
    with pytest.raises(ValueError, match="overwrite_o=True"):
        launch.wo_a_bf16(o, pos, cos, sin, w, g, overwrite_o=True, config=Bf16GemmConfig(16, 16))
    with pytest.raises(ValueError, match="needs from_o=True or None"):
        launch.wo_a_bf16(o, pos, cos, sin, w, g, from_o=False, config=Bf16GemmConfig(16, 16))
    with pytest.raises(ValueError, match="block_k 128 must divide"):
        launch.wo_a_bf16(o, pos, cos, sin, w, g, config=Bf16GemmConfig(16, 16, 128))
    with pytest.raises(TypeError, match="w_bf16 must be bfloat16"):
        launch.wo_a_bf16(o, pos, cos, sin, w.float(), g)
    with pytest.raises(TypeError, match="o must be bfloat16"):
        launch.wo_a_bf16(o.float(), pos, cos, sin, w, g)
    with pytest.raises(ValueError, match="contiguous Dh"):
        launch.wo_a_bf16(o.transpose(1, 2).contiguous().transpose(1, 2), pos, cos, sin, w, g)
    with pytest.raises(ValueError, match="power of two >= 16"):
        Bf16GemmConfig(24, 64)
    with pytest.raises(ValueError, match="num_stages"):
        Bf16GemmConfig(16, 64, num_stages=0)
    with pytest.raises(ValueError, match="tma=True and rotate=True"):
        Bf16GemmConfig(16, 64, tma=True, rotate=True)
    with pytest.raises(ValueError, match="whole heads"):
        launch.wo_a_bf16(*rope_tensors(rng, s=3, h=1, dh=256, rd=64),
                         checkpoint_tensors(rng, 2, 16, 128)[2], 2,
                         config=Bf16GemmConfig(16, 16, 64, rotate=True))
    with pytest.raises(ValueError, match="above 1 only with rotate=True"):
        Bf16GemmConfig(16, 64, split_k=2)
    with pytest.raises(ValueError, match="split_k 4 must divide the 2 heads of a group"):
        launch.wo_a_bf16(o, pos, cos, sin, w, g,
                         config=Bf16GemmConfig(16, 16, 64, rotate=True, split_k=4))


@pytest.mark.parametrize("dh,rd", [(128, 64), (96, 32)], ids=["dh-tile", "dh-chunks"])
def test_rotated_copy_is_the_in_place_rotation(rng, dh, rd):
    """``inverse_rope`` into a copy (NoPE lanes in one load when Dh is a tile, else in rd-wide
    chunks) gives the in-place rotation's bits and leaves ``o`` untouched."""
    o, pos, cos, sin = rope_tensors(rng, s=5, h=3, dh=dh, rd=rd, rope_dtype=torch.float32,
                                    pos_dtype=torch.int64)
    before = o.clone()
    copy = launch.inverse_rope(o, pos, cos, sin)
    _unchanged(o, before)
    in_place = launch.inverse_rope(o.clone(), pos, cos, sin, overwrite_o=True)
    assert_bitwise_equal(to_numpy(copy).view(np.uint16), to_numpy(in_place).view(np.uint16),
                         name="copy vs in place")


def test_kernel_file_imports_no_framework():
    """``bf16_kernels`` and the kernels it reuses import Triton only (any launcher may use them)."""
    for module in (bf16_kernels, plans.kernels):
        tree = ast.parse(open(module.__file__).read())
        names = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for a in node.names}
        names |= {node.module.split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.level == 0}
        assert names <= {"__future__", "triton"}, (module.__name__, names)


# The BF16 chain through the dispatcher (``tb.WoAProjection``, ``tb.wo_a_bf16``): torch's
# rotation, or the Triton chain (the interpreter on CPU).


#: The dispatcher's cases: G groups of N outputs over H heads of DH lanes.
_G, _N, _H, _DH = 2, 128, 4, 64


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    c = rope_case(rng, s=5, h=_H, dh=_DH, rd=32, num_groups=_G, gs=128)
    w, sc = wo_a_checkpoint(rng, g=_G, n=_N, k=_H * _DH // _G)
    return c.torch(), np_to_torch(w), np_to_torch(sc)


def _identity(g: int, k: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A ``[G * K, K]`` fp8 checkpoint weight holding G identities, scale 1 (E8M0 byte 127)."""
    eye = torch.eye(k, device=device).repeat(g, 1).to(torch.float8_e4m3fn)
    return eye, torch.full((g * k // 128, k // 128), 127, dtype=torch.uint8, device=device)


@pytest.fixture
def rotations(monkeypatch):
    """Counts the BF16 chains run by the Triton backend."""
    calls = []
    real = launch.wo_a_bf16
    monkeypatch.setattr(launch, "wo_a_bf16", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _triton_on() -> bool:
    return _dispatch.get_backend("triton").is_available()[0]


@pytest.mark.parametrize("rotation", ["torch", "triton"])
def test_o_is_untouched_unless_overwrite_o(rotation, monkeypatch, rotations):
    if rotation == "torch":
        monkeypatch.setenv("WOA_USE_TRITON", "0")
        _dispatch.reset_caches()
    elif not _triton_on():
        pytest.skip(f"triton backend unavailable: {_dispatch.get_backend('triton').is_available()}")
    (o, pos, cos, sin), w, sc = _inputs()
    proj = tb.WoAProjection(w, sc, _G, cos, sin, rope_dim=32, backend="bf16")
    before = o.clone()
    y = proj(o, pos)
    assert_bitwise_equal(o, before, name="o after a default call")
    y_fn = tb.wo_a_bf16(o, pos, cos, sin, w, sc, _G)
    assert_bitwise_equal(o, before, name="o after wo_a_bf16")
    assert_bitwise_equal(y_fn, y)
    # At these sizes both rotate (a copy, or o itself) and then call the same torch GEMM.
    y_in_place = proj(o, pos, overwrite_o=True)
    assert_bitwise_equal(y_in_place, y, name="overwrite_o result")
    assert len(rotations) == (3 if rotation == "triton" else 0)


def test_triton_and_torch_rotations_give_the_same_bits(monkeypatch, rotations):
    if not _triton_on():
        pytest.skip("triton backend unavailable")
    (o, pos, cos, sin), _, _ = _inputs(1)
    eye, one = _identity(_G, _H * _DH // _G)
    y_triton = tb.wo_a_bf16(o, pos, cos, sin, eye, one, _G)
    assert rotations
    monkeypatch.setenv("WOA_USE_TRITON", "0")
    _dispatch.reset_caches()
    y_torch = tb.wo_a_bf16(o, pos, cos, sin, eye, one, _G)
    assert_bitwise_equal(y_triton, y_torch, name="rotated activations")
    assert_bitwise_equal(y_torch.reshape(o.shape), inverse_rope(o, pos, cos, sin).to(
        torch.bfloat16))


def test_fp8_chain_ignores_overwrite_o():
    (o, pos, cos, sin), w, sc = _inputs(2)
    proj = tb.WoAProjection(w, sc, _G, cos, sin, rope_dim=32, backend="torch")
    before = o.clone()
    y = proj(o, pos, overwrite_o=True)
    assert_bitwise_equal(o, before)
    assert_bitwise_equal(proj(o, pos), y)


def test_non_bf16_o_takes_the_torch_rotation(rotations):
    (o, pos, cos, sin), w, sc = _inputs(3)
    o32 = o.float()
    before = o32.clone()
    y = tb.wo_a_bf16(o32, pos, cos, sin, w, sc, _G, overwrite_o=True)
    assert y.dtype == torch.bfloat16 and not rotations
    assert_bitwise_equal(o32, before)


# ---------------------------------------------------------------------------------------------
# GPU axis: DeepSeek V4 sizes
# ---------------------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("rope_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("g", [16, 2])
@pytest.mark.parametrize("s", [1, 64, 1000, 4096])
def test_gpu_matches_cublas_and_keeps_o(s, g, rope_dtype):
    gen = torch.Generator(device="cuda").manual_seed(s * 31 + g)
    o, pos, cos, sin = rope_inputs(s, g, gen, rope_dtype=rope_dtype)
    w = (torch.randn((g, N, HPG * DH), generator=gen, device="cuda") / 30).to(torch.bfloat16)
    before = o.clone()
    ref = launch.wo_a_bf16(o, pos, cos, sin, w, g, from_o=False)
    for cfg in (bf16_configs.bf16_gemm_config(s, g, N, HPG * DH),
                bf16_configs.bf16_gemm_config(s, g, N, HPG * DH, tma=True),
                Bf16GemmConfig(128, 256, 64, 8, 3, tma=True),
                Bf16GemmConfig(64, 128, 64, 4, 4)):
        y, tails = _run(o, pos, cos, sin, w, cfg)
        torch.cuda.synchronize()
        assert torch.equal(o, before), "o was written"
        assert_bitwise_equal(tails, launch.inverse_rope(o, pos, cos, sin)[:, :, DH - RD:],
                             name="tails")
        assert_close(y, ref, tolerance="gemm_bf16", name=cfg.label())
    assert_close(launch.wo_a_bf16(o, pos, cos, sin, w, g), ref, tolerance="gemm_bf16")
    split = Bf16GemmConfig(max(16, min(64, 1 << (s - 1).bit_length())), 64, 64, 4, 8,
                           rotate=True, split_k=4)
    assert_close(launch.wo_a_bf16(o, pos, cos, sin, w, g, config=split), ref,
                 tolerance="gemm_bf16", name=split.label())


@gpu
@pytest.mark.parametrize("rope_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("s", [1, 64, 1024])
def test_gpu_fallback_runs_the_triton_rotation_with_the_torch_bits(rope_dtype, s, rotations):
    """On CUDA the BF16 chain rotates with the Triton kernel (``launch.wo_a_bf16``): its rotated
    lanes have the torch rotation's bits, ``o`` is untouched unless ``overwrite_o``, and the
    result agrees with the pure-torch chain."""
    rng = np.random.default_rng(s)
    g, h, dh = 16, 64, 512
    c = rope_case(rng, s=s, h=h, dh=dh, rd=64, num_groups=g, gs=128, p=4096, scale=1.0)
    w, sc = wo_a_checkpoint(rng, g=g, n=1024, k=h * dh // g)
    o, pos, cos, sin = (t.cuda() for t in c.torch())
    cos, sin = cos.to(rope_dtype), sin.to(rope_dtype)
    proj = tb.WoAProjection(np_to_torch(w).cuda(), np_to_torch(sc).cuda(), g, cos, sin,
                            backend="bf16")
    before = o.clone()
    y = proj(o, pos)
    assert rotations and torch.equal(o, before)
    want = inverse_rope(o, pos, cos, sin).to(torch.bfloat16)
    eye, one = _identity(g, h * dh // g, "cuda")
    rotated = tb.WoAProjection(eye, one, g, cos, sin, backend="bf16")(o, pos)
    assert_bitwise_equal(rotated.reshape(o.shape), want, name="Triton vs torch rotation")

    in_place = proj(o.clone(), pos, overwrite_o=True)
    if bf16_configs.bf16_gemm_chosen(s, g, 1024, h * dh // g, tma=chain._tma_loads(o), dh=dh):
        # The default ran the BF16 GEMM from o: the same products, summed in another order.
        assert_close(in_place, y, tolerance="gemm_bf16", name="overwrite_o (cuBLAS)")
    else:  # both rotate, then call the same cuBLAS GEMM
        assert_bitwise_equal(in_place, y, name="overwrite_o")
    x = want.reshape(s, g, -1).transpose(0, 1)
    ref = torch.bmm(x, proj.weight_bf16.cuda().transpose(1, 2)).transpose(0, 1)
    assert_close(y, ref, tolerance="gemm_bf16")


@gpu
@pytest.mark.parametrize("table,rope_dtype", ROPE_TABLES)
@pytest.mark.parametrize("s,g", TABLE_SHAPES)
def test_gpu_bf16_chain_rotation_is_the_oracles(s, g, table, rope_dtype):
    """The BF16 chain's rotation, copying and in place, against ``woa_jax.inverse_rope``."""
    seed = new_seed()
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=rope_dtype, table=table)
    ref = jax.jit(woa_jax.inverse_rope)(*map(jax_view, (o, pos, cos, sin)))
    before = o.clone()
    y = launch.inverse_rope(o, pos, cos, sin)
    assert torch.equal(as_bits(o), as_bits(before)), f"seed {seed}: the copying rotation wrote o"
    assert count_differing(y, ref) == 0, f"seed {seed}: the rotated copy differs from the oracle"
    launch.inverse_rope(o, pos, cos, sin, overwrite_o=True)
    assert count_differing(o, ref) == 0, (
        f"seed {seed}: the in-place rotation differs from the oracle")
