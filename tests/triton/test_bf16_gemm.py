"""The BF16 chain's GEMM from ``o`` (``bf16_kernels``): A's NoPE tiles read from ``o``, its rope
tiles from a buffer of the rotated tails or, in the one-launch chain, rotated by the GEMM
itself; ``o`` never written.

Tiny shapes under ``TRITON_INTERPRET=1`` on CPU (tests/conftest.py) against ``woa_jax.wo_a_bf16``
within ``gemm_bf16``; the tails, and the one-launch chain's rotated lanes, bit for bit against
the rotation of ``inverse_rope``; GPU-marked tests at DeepSeek V4 sizes against the cuBLAS
path. The kernels compiled for sm_90 and AMD Instinct: ``tests/ops/test_codegen.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools

import numpy as np
import pytest

import woa_jax
from woa_jax.testing import assert_bitwise_equal, assert_close, to_numpy

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _cases import DEVICE, jx, rope_case  # noqa: E402

from torch_bridge.backends.triton import (  # noqa: E402
    _common,
    bf16_kernels,
    chain,
    configs,
    launch,
)
from torch_bridge.backends.triton.configs import Bf16GemmConfig  # noqa: E402


def _checkpoint(rng, g, n, k):
    """``(weight [G*N, K] fp8, scale bytes, w_bf16 [G, N, K])``: the oracle's inputs and the
    exact bf16 weight the launcher takes."""
    weight = torch.from_numpy(rng.standard_normal((g * n, k)).astype(np.float32)).to(
        torch.float8_e4m3fn).to(DEVICE)
    scale = torch.from_numpy(rng.integers(118, 124, (-(-g * n // 128), k // 128)).astype(
        np.uint8)).to(DEVICE)
    w_bf16 = woa_jax.dequant_wo_a_weight(*jx(weight, scale), g).astype(np.float32)
    return weight, scale, torch.from_numpy(np.array(w_bf16)).to(torch.bfloat16).to(DEVICE)


#: ``(H, Dh, G, N)`` of ``_small_chain``: two groups of two 128-lane heads, 64 rope lanes.
_SMALL = (4, 128, 2, 32)


def _small_chain(rng):
    """``(o [3, H, Dh], positions, cos, sin, w [G, N, K])`` of a small BF16 chain call."""
    h, dh, g, n = _SMALL
    o, pos, cos, sin = rope_case(rng, s=3, h=h, dh=dh, rd=64)
    return o, pos, cos, sin, _checkpoint(rng, g, n, h * dh // g)[2]


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
    o, pos, cos, sin = rope_case(rng, s=s, h=h, dh=dh, rd=rd, rope_dtype=torch.float32)
    n = 48  # not a multiple of the decode tiles' 32 or 64 weight rows
    weight, scale, w = _checkpoint(rng, g, n, h * dh // g)
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
    o, pos, cos, sin = rope_case(rng, s=17, h=h, dh=dh, rd=rd, rope_dtype=rope_dtype,
                                 pos_dtype=pos_dtype)
    weight, scale, w = _checkpoint(rng, g, n, h * dh // g)
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
    o, pos, cos, sin = rope_case(rng, s=s, h=h, dh=dh, rd=rd, rope_dtype=torch.float32)
    k = h * dh // g
    cfg = Bf16GemmConfig(16, 16, min(64, rd), num_stages=2, rotate=True)
    weight, scale, w = _checkpoint(rng, g, 48, k)
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


def test_strided_o_is_read_in_place(rng):
    """Padded token and head strides: the GEMM reads ``o`` where it lies (no copy of ``o``),
    and the TMA config, which needs packed heads, falls back to pointer loads."""
    s, h, dh, rd, g, n = 5, 4, 128, 64, 2, 32
    o, pos, cos, sin = rope_case(rng, s=s, h=h, dh=dh, rd=rd)
    weight, scale, w = _checkpoint(rng, g, n, h * dh // g)
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
    """``configs.bf16_gemm_chosen`` alone decides between the GEMM from ``o`` (the one-launch
    chain at these 3 tokens) and the rotated copy with cuBLAS (torch's GEMM here); in place is
    always the rotation of ``o`` itself."""
    h, dh, g, n = _SMALL
    o, pos, cos, sin, w = _small_chain(rng)
    runs = []
    monkeypatch.setattr(_common, "PLANS", {})
    for name in ("_wo_a_bf16_plan", "_rotating_plan"):
        real = getattr(chain, name)
        monkeypatch.setattr(chain, name,
                            lambda *a, name=name, real=real: runs.append(name) or real(*a))
    monkeypatch.setattr(configs, "bf16_gemm_chosen", lambda *a, **k: True)
    y = launch.wo_a_bf16(o, pos, cos, sin, w, g)
    assert runs == ["_rotating_plan"]
    monkeypatch.setattr(configs, "bf16_gemm_chosen", lambda *a, **k: False)
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
    monkeypatch.setattr(_common, "PLANS", {})
    for name in ("_wo_a_bf16_plan", "_rotating_plan"):
        real = getattr(chain, name)
        monkeypatch.setattr(chain, name, lambda *a, real=real: made.append(a[-1]) or real(*a))
    y = launch.wo_a_bf16(o, pos, cos, sin, w, g, fused=True)
    assert_bitwise_equal(launch.wo_a_bf16(o, pos, cos, sin, w, g, fused=True), y)
    assert len(made) == 1
    padded = torch.zeros((3, h, dh + 64), dtype=torch.bfloat16, device=DEVICE)[:, :, :dh]
    padded.copy_(o)
    assert_bitwise_equal(launch.wo_a_bf16(padded, pos, cos, sin, w, g, fused=True), y)
    cfg = Bf16GemmConfig(16, 32, 32, num_warps=2, num_stages=2)
    assert_close(launch.wo_a_bf16(o, pos, cos, sin, w, g, config=cfg), y, tolerance="gemm_bf16")
    assert len(made) == 3 and made[-1] == cfg


def test_zero_tokens_and_heads_the_gemm_cannot_tile(rng):
    h, dh, g, n = _SMALL
    o, pos, cos, sin, w = _small_chain(rng)
    assert launch.wo_a_bf16(o[:0], pos[:0], cos, sin, w, g, fused=True).shape == (0, g, n)
    # Head dim 24, rope dim 8: no K tile of 16 lanes lies on one side of the rope boundary.
    o, pos, cos, sin = rope_case(rng, s=3, h=4, dh=24, rd=8)
    w = torch.ones((2, 16, 48), dtype=torch.bfloat16, device=DEVICE)
    assert configs.bf16_gemm_blocker(24, 8, 48) is not None
    before = o.clone()
    y = launch.wo_a_bf16(o, pos, cos, sin, w, 2)  # the default takes the rotated copy
    _unchanged(o, before)
    assert_close(y, torch.einsum("sgk,gnk->sgn", launch.inverse_rope(o, pos, cos, sin).view(
        3, 2, 48).float(), w.float()), tolerance="gemm_bf16")
    with pytest.raises(ValueError, match="no K tile"):
        launch.wo_a_bf16(o, pos, cos, sin, w, 2, fused=True)


def test_bad_inputs_give_clear_errors(rng):
    h, dh, g, n = _SMALL
    o, pos, cos, sin, w = _small_chain(rng)
    with pytest.raises(ValueError, match="num_groups = 4 groups of K"):
        launch.wo_a_bf16(o, pos, cos, sin, w, 4)
    with pytest.raises(ValueError, match="overwrite_o=True"):
        launch.wo_a_bf16(o, pos, cos, sin, w, g, overwrite_o=True, fused=True)
    with pytest.raises(ValueError, match="overwrite_o=True"):
        launch.wo_a_bf16(o, pos, cos, sin, w, g, overwrite_o=True, config=Bf16GemmConfig(16, 16))
    with pytest.raises(ValueError, match="needs fused=True or None"):
        launch.wo_a_bf16(o, pos, cos, sin, w, g, fused=False, config=Bf16GemmConfig(16, 16))
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
        launch.wo_a_bf16(*rope_case(rng, s=3, h=1, dh=256, rd=64),
                         _checkpoint(rng, 2, 16, 128)[2], 2,
                         config=Bf16GemmConfig(16, 16, 64, rotate=True))


# ---------------------------------------------------------------------------------------------
# Launch rules (torch-free)
# ---------------------------------------------------------------------------------------------

SS = (1, 2, 15, 16, 17, 33, 64, 65, 128, 256, 1000, 1024, 4096, 8192)


@pytest.mark.parametrize("target", ["cuda", "hip", "interpreter"])
def test_every_chosen_shape_is_a_valid_tile(target):
    for s, g, block_k in itertools.product(SS, (1, 2, 8, 16), (16, 32, 64)):
        cfg = configs.bf16_gemm_config(s, g, 1024, 4096, block_k, target)
        assert cfg.block_k <= block_k and block_k % cfg.block_k == 0, (s, g, cfg)
        assert cfg.block_m <= max(16, 1 << (s - 1).bit_length()), (s, g, cfg)
        if target == "hip":
            # Two stages of A and B tiles within half of gfx942's 64 KiB of LDS.
            assert cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * 2 <= 32768


def test_the_gemm_from_o_runs_at_decode_and_from_128_tokens_with_tma_loads():
    """On Hopper the one-launch chain up to 16 tokens (64 at G = 16), the TMA kernel from 128
    tokens and 2048 (token, group) rows, the rotated copy and cuBLAS between; without TMA loads
    always the copy. The decode tiles rotate, no other tile does; in one wave of programs they
    keep more stages in flight."""
    for (s, g), want in {(1, 16): True, (16, 2): True, (17, 8): False, (64, 16): True,
                         (64, 2): False, (65, 16): False, (127, 16): False, (128, 16): True,
                         (128, 8): False, (256, 8): True, (255, 8): False, (512, 2): False,
                         (1024, 2): True, (8192, 2): True}.items():
        assert configs.bf16_gemm_chosen(s, g, 1024, 4096, tma=True, dh=512) == want, (s, g)
        assert not configs.bf16_gemm_chosen(s, g, 1024, 4096, tma=False, dh=512)
        if want and s <= 64:  # groups inside heads, or no head dim: no one-launch chain
            assert not configs.bf16_gemm_chosen(s, g, 1024, 256, tma=True, dh=512)
            assert not configs.bf16_gemm_chosen(s, g, 1024, 4096, tma=True)
        for target in ("cuda", "hip"):
            cfg = configs.bf16_gemm_config(s, g, 1024, 4096, 64, target, target == "cuda")
            assert cfg.rotate == (s <= 64), (s, g, target)
    stages = {g: configs.bf16_gemm_config(1, g, 1024, 4096, 64, "cuda", True)
              for g in (16, 8, 2)}
    assert [(c.block_n, c.num_stages) for c in stages.values()] == [(64, 5), (64, 8), (16, 12)]


def test_hopper_tma_tiles():
    """128 x 256 tiles where they make a wave of programs, else 128 x 128, else 64 x 128."""
    big, mid, small = (Bf16GemmConfig(128, 256, 64, 8, 3, True),
                       Bf16GemmConfig(128, 128, 64, 4, 5, True),
                       Bf16GemmConfig(64, 128, 64, 4, 4, True))
    for (s, g), want in {(8192, 16): big, (1024, 16): big, (4096, 2): big, (1024, 2): mid,
                         (256, 16): big, (256, 8): mid, (128, 16): mid, (256, 2): small}.items():
        assert configs.bf16_gemm_config(s, g, 1024, 4096, tma=True) == want, (s, g)


def test_hopper_shapes_fill_the_gpu():
    """Large problems take the 128 x 256 x 64 wgmma tile; the others keep a wave of programs."""
    assert configs.bf16_gemm_config(8192, 16, 1024, 4096) == Bf16GemmConfig(128, 256, 64, 8, 3)
    for s, g in itertools.product(SS, (2, 8, 16)):
        cfg = configs.bf16_gemm_config(s, g, 1024, 4096)
        progs = configs.cdiv(s, cfg.block_m) * configs.cdiv(1024, cfg.block_n) * g
        assert progs >= configs.ONE_WAVE_TILES or cfg.block_n == 16 or cfg.block_m == 64, cfg


def test_blocker_and_block_k_limit():
    assert configs.bf16_block_k_limit(512, 64, 4096) == 64
    assert configs.bf16_block_k_limit(192, 128, 384) == 64
    assert configs.bf16_block_k_limit(64, 32, 128) == 32
    assert configs.bf16_gemm_blocker(512, 64, 4096) is None
    assert configs.bf16_gemm_blocker(512, 64, 4096, Bf16GemmConfig(128, 256, 64)) is None
    assert "block_k 64" in configs.bf16_gemm_blocker(64, 32, 128, Bf16GemmConfig(16, 16, 64))
    assert "no K tile" in configs.bf16_gemm_blocker(24, 8, 48)
    assert "rope dim" in configs.bf16_gemm_blocker(64, 128, 128)
    cfg = Bf16GemmConfig(128, 256, 64, 8, 3, tma=True)
    assert cfg.label() == "m128n256k64w8st3T" and dataclasses.replace(cfg, tma=False) != cfg


def test_kernel_file_imports_no_framework():
    """``bf16_kernels`` and the kernels it reuses import Triton only (any launcher may use them)."""
    for module in (bf16_kernels, chain.kernels):
        tree = ast.parse(open(module.__file__).read())
        names = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for a in node.names}
        names |= {node.module.split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.level == 0}
        assert names <= {"__future__", "triton"}, (module.__name__, names)


# ---------------------------------------------------------------------------------------------
# GPU: DeepSeek V4 sizes against the cuBLAS path
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("rope_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("g", [16, 2])
@pytest.mark.parametrize("s", [1, 64, 1000, 4096])
def test_gpu_matches_cublas_and_keeps_o(s, g, rope_dtype):
    hpg, dh, rd, n, p = 8, 512, 64, 1024, 65536
    gen = torch.Generator(device="cuda").manual_seed(s * 31 + g)
    o = (torch.randn((s, g * hpg, dh), generator=gen, device="cuda") / 10).to(torch.bfloat16)
    pos = torch.randint(0, p, (s,), generator=gen, device="cuda")
    ang = torch.rand((p, rd // 2), generator=gen, device="cuda") * 6.3
    cos, sin = torch.cos(ang).to(rope_dtype), torch.sin(ang).to(rope_dtype)
    w = (torch.randn((g, n, hpg * dh), generator=gen, device="cuda") / 30).to(torch.bfloat16)
    before = o.clone()
    ref = launch.wo_a_bf16(o, pos, cos, sin, w, g, fused=False)
    for cfg in (configs.bf16_gemm_config(s, g, n, hpg * dh),
                configs.bf16_gemm_config(s, g, n, hpg * dh, tma=True),
                Bf16GemmConfig(128, 256, 64, 8, 3, tma=True),
                Bf16GemmConfig(64, 128, 64, 4, 4)):
        y, tails = _run(o, pos, cos, sin, w, cfg)
        torch.cuda.synchronize()
        assert torch.equal(o, before), "o was written"
        assert_bitwise_equal(tails, launch.inverse_rope(o, pos, cos, sin)[:, :, dh - rd:],
                             name="tails")
        assert_close(y, ref, tolerance="gemm_bf16", name=cfg.label())
    assert_close(launch.wo_a_bf16(o, pos, cos, sin, w, g), ref, tolerance="gemm_bf16")


@pytest.mark.parametrize("dh,rd", [(128, 64), (96, 32)], ids=["dh-tile", "dh-chunks"])
def test_rotated_copy_is_the_in_place_rotation(rng, dh, rd):
    """``inverse_rope`` into a copy (NoPE lanes in one load when Dh is a tile, else in rd-wide
    chunks) gives the in-place rotation's bits and leaves ``o`` untouched."""
    o, pos, cos, sin = rope_case(rng, s=5, h=3, dh=dh, rd=rd, rope_dtype=torch.float32,
                                 pos_dtype=torch.int64)
    before = o.clone()
    copy = launch.inverse_rope(o, pos, cos, sin)
    _unchanged(o, before)
    in_place = launch.inverse_rope(o.clone(), pos, cos, sin, overwrite_o=True)
    assert_bitwise_equal(to_numpy(copy).view(np.uint16), to_numpy(in_place).view(np.uint16),
                         name="copy vs in place")
