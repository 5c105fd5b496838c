"""``inverse_rope_group_quant`` (fused inverse RoPE + 1 x 128 E8M0 fp8 quant) on the Triton
kernels, bit for bit against the ``woa_jax`` oracle.

Interpreter axis: tiny shapes, CPU under ``TRITON_INTERPRET=1`` (tests/conftest.py sets it; on a
GPU machine these run on the GPU). GPU axis (``pytest -m gpu``): DeepSeek V4 sizes, random and
V4 rope tables. The kernels compiled for sm_90 and AMD: ``test_codegen.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import woa_jax
from woa_jax.testing import to_numpy

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from inputs import (  # noqa: E402, F401
    DEVICE,
    DH,
    GROUPS,
    HPG,
    ROPE_TABLES,
    SCALE_POISON,
    TABLE_SHAPES,
    TOKENS,
    P,
    as_torch,
    assert_bytes_equal,
    assert_quant_equal,
    count_differing,
    jx,
    new_seed,
    poisoned,
    quant_oracle,
    rope_inputs,
    rope_tensors,
    xla_memory,
)

from torch_bridge.backends.triton import configs, launch  # noqa: E402

gpu = pytest.mark.gpu

# ---------------------------------------------------------------------------------------------
# Interpreter axis: tiny shapes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gs,g,pos_dtype", [(128, 2, torch.int64), (128, 1, torch.int32),
                                             (64, 2, torch.int32), (32, 4, torch.int64)])
@pytest.mark.parametrize("config", [launch.QuantConfig(8, 2), launch.QuantConfig(32, 2),
                                    launch.QuantConfig(2, 2, block_h=2),
                                    launch.QuantConfig(4, 2, block_h=3),
                                    launch.QuantConfig(1, 1, block_h=1),
                                    launch.QuantConfig(1, 1, block_h=1, whole_head=True),
                                    launch.QuantConfig(2, 1, block_h=2, whole_head=True),
                                    launch.QuantConfig(4, 2, block_h=1, whole_head=True)],
                         ids=lambda c: c.label())
def test_quant_bit_exact(rng, gs, g, pos_dtype, config):
    """Both quant kernels (flat rows; per head, where block_h=3 does not divide H=4 and is cut
    to a divisor, one (token, head) per program, and whole head rows, with masked tokens at
    2 and 4 a program) give the oracle's bytes."""
    o, pos, cos, sin = rope_tensors(rng, pos_dtype=pos_dtype)
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, g, gs, config=config)
    assert q.dtype == torch.float8_e4m3fn and sc.dtype == torch.uint8
    assert tuple(q.shape) == (3, g, 4 * 512 // g) and tuple(sc.shape) == (3, g, 4 * 512 // g // gs)
    assert_quant_equal(q, sc, *woa_jax.inverse_rope_group_quant(*jx(o, pos, cos, sin), g, gs))


@pytest.mark.parametrize("whole_head", [False, True])
@pytest.mark.parametrize("dh,gs", [(128, 128), (128, 64), (192, 64), (256, 32)])
def test_quant_heads_of_fewer_or_more_groups_than_the_load_window(rng, dh, gs, whole_head):
    """The per-head kernel loads up to four groups ahead of its stores: heads of 1, 2, 3 and 8
    groups give the oracle's bytes too, a group or a whole head row at a time (a head of
    192 lanes, not a power of two, goes by groups)."""
    o, pos, cos, sin = rope_tensors(rng, s=5, dh=dh)
    cfg = launch.QuantConfig(4, 1, block_h=1, whole_head=whole_head)
    shape = launch.quant_launch(5, 4, dh, gs, cfg)
    assert shape.per_head and shape.shape["WHOLE_HEAD"] is (whole_head and dh != 192)
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, 2, gs, config=cfg)
    assert_quant_equal(q, sc, *woa_jax.inverse_rope_group_quant(*jx(o, pos, cos, sin), 2, gs))


@pytest.mark.parametrize("s", [1, 5, 8])
@pytest.mark.parametrize("config", [launch.QuantConfig(1, 1, block_h=1),
                                    launch.QuantConfig(4, 2, block_h=2),
                                    launch.QuantConfig(2, 1, block_h=1, whole_head=True),
                                    launch.QuantConfig(4, 1, block_h=2, whole_head=True)],
                         ids=lambda c: c.label())
def test_quant_token_major_fp32_scales(rng, s, config):
    """``scale_mn_align``: each scale as the fp32 power of two its byte stands for, at
    ``(g * Ks + j) * S_pad + s`` (S padded to 4; DeepGEMM's sm_90 layout), a group or a whole
    head at a time; the fp8 bytes and the scale values are the oracle's, the padding is left
    as it was."""
    o, pos, cos, sin = rope_tensors(rng, s=s)
    buf = torch.full((2 * 8, -(-s // 4) * 4), -1.0, dtype=torch.float32, device=DEVICE)
    view = buf.view(2, 8, -1).permute(2, 0, 1)[:s]
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, config=config,
                                            x_scale=view, scale_mn_align=4)
    assert sc is view
    rq, rs = woa_jax.inverse_rope_group_quant(*jx(o, pos, cos, sin), 2, 128)
    want = np.ldexp(np.float32(1), np.asarray(rs).view(np.uint8).astype(np.int32) - 127)
    np.testing.assert_array_equal(to_numpy(sc), want)
    np.testing.assert_array_equal(to_numpy(q).view(np.uint8), np.asarray(rq).view(np.uint8))
    assert bool((buf[:, s:] == -1.0).all()), "padding tokens written"


def test_quant_token_major_scales_rejected_where_they_cannot_be_written(rng):
    """Token-major scales need the per-head kernel and an fp32 buffer of their strides."""
    o, pos, cos, sin = rope_tensors(rng, s=5)
    with pytest.raises(ValueError, match="per-head quant kernel"):
        launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, scale_mn_align=4,
                                        config=launch.QuantConfig(8, 2))
    row = torch.empty((5, 2, 8), dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match=r"x_scale must be fp32 of strides \[1, 64, 8\]"):
        launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, scale_mn_align=4, x_scale=row)


def test_strided_positions_are_read_as_values_not_memory(rng):
    """The kernels read positions with unit stride; a strided view (here every other entry of
    a longer vector) must give the bytes of its values, not of its neighbours in memory."""
    o, pos, cos, sin = rope_tensors(rng, s=3)
    longer = torch.stack([pos, (pos + 17) % 64], dim=1).reshape(-1)  # [p0, x, p1, x, p2, x]
    strided = longer[::2]
    assert strided.stride(0) == 2 and torch.equal(strided, pos)
    q, sc = launch.inverse_rope_group_quant(o, strided, cos, sin, 2, 128)
    assert_quant_equal(q, sc, *woa_jax.inverse_rope_group_quant(*jx(o, pos, cos, sin), 2, 128))
    x = o.clone()
    launch.inverse_rope(x, strided, cos, sin, overwrite_o=True)
    np.testing.assert_array_equal(to_numpy(x).view(np.uint16), np.asarray(
        woa_jax.inverse_rope(*jx(o, pos, cos.float(), sin.float()))).view(np.uint16))


def test_quant_fp32_rope_and_fp32_o(rng):
    """fp32 cos/sin and fp32 ``o``: the interpreter does not contract to FMA, so bytes match."""
    o, pos, cos, sin = rope_tensors(rng, rope_dtype=torch.float32, o_dtype=torch.float32)
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128)
    assert_quant_equal(q, sc, *woa_jax.inverse_rope_group_quant(*jx(o, pos, cos, sin), 2, 128))


def test_quant_edge_values_floor_and_clamped_positions(rng):
    """Zero group -> byte 92 (floor 1e-8) or 85 (1e-10); NaN lanes ignored in amax; an inf lane
    gives byte 255; out-of-range positions are clamped like AITER's kernel."""
    o, _, cos, sin = rope_tensors(rng, s=4)
    o[0] = 0.0
    o[1, 0, 5] = float("nan")
    o[2, 1, 7] = float("inf")
    pos = torch.tensor([-3, 0, 63, 1000], device=DEVICE)
    for floor in (woa_jax.AITER_AMAX_FLOOR, woa_jax.CUDA_AMAX_FLOOR):
        q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, amax_floor=floor)
        rq, rs = woa_jax.inverse_rope_group_quant(*jx(o, pos, cos, sin), 2, 128,
                                                  amax_floor=floor)
        assert (to_numpy(sc)[0] == (92 if floor == woa_jax.AITER_AMAX_FLOOR else 85)).all()
        assert to_numpy(sc)[2, 0, 4] == 255  # head 1, lane 7: group 0, chunk 4
        np.testing.assert_array_equal(to_numpy(sc), np.asarray(rs).view(np.uint8))
        finite = np.isfinite(np.asarray(rq, np.float32))  # NaN payloads: compare as NaN
        np.testing.assert_array_equal(to_numpy(q).view(np.uint8)[finite],
                                      np.asarray(rq).view(np.uint8)[finite])
        if DEVICE == "cuda":  # Triton's interpreter casts fp32 NaN to a finite fp8 value
            assert np.isnan(to_numpy(q).astype(np.float32)[~finite]).all()


def test_quant_writes_into_given_buffers_and_fnuz(rng):
    o, pos, cos, sin = rope_tensors(rng)
    xq = torch.empty((3, 2, 1024), dtype=torch.float8_e4m3fnuz, device=DEVICE)
    xs = torch.empty((3, 2, 8), dtype=torch.float8_e8m0fnu, device=DEVICE)
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, x_fp8=xq, x_scale=xs)
    assert q is xq and sc is xs
    rq, rs = woa_jax.inverse_rope_group_quant(*jx(o, pos, cos, sin), 2, 128,
                                              fp8_dtype=jnp.float8_e4m3fnuz)
    assert_quant_equal(q, sc.view(torch.uint8), rq, rs)


def test_quant_rejects_bad_output_buffer(rng):
    o, pos, cos, sin = rope_tensors(rng)
    bad = torch.empty((3, 2, 8, 2), dtype=torch.uint8, device=DEVICE)[..., 0]
    with pytest.raises(ValueError, match="x_scale must be a contiguous"):
        launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, x_scale=bad)
    with pytest.raises(ValueError, match="x_fp8 must be a contiguous"):
        launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128, x_fp8=torch.empty(
            (3, 2, 512), dtype=torch.float8_e4m3fn, device=DEVICE))


# ---------------------------------------------------------------------------------------------
# GPU axis: DeepSeek V4 sizes
# ---------------------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("s", (*TOKENS, 13))  # 13: two-token programs, one row masked
def test_gpu_quant_bytes_exact(s, g):
    _check_rule_bytes(s, g)


def _check_rule_bytes(s: int, g: int) -> None:
    """The default launch into poisoned buffers: every byte written and the oracle's."""
    seed = new_seed()
    pos_dtype = torch.int32 if (s + g) % 2 else torch.int64
    o, pos, cos, sin = rope_inputs(s, g, seed, pos_dtype=pos_dtype)
    q, sc = poisoned(s, g, HPG * DH)
    launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128, x_fp8=q, x_scale=sc)
    rq, rs = quant_oracle(o, pos, cos, sin, g)
    assert bool((sc != SCALE_POISON).all()), f"seed {seed}: scale bytes left unwritten"
    assert_bytes_equal(sc, rs, "scale", seed)
    assert_bytes_equal(q, rq, "fp8", seed)


@gpu
@pytest.mark.parametrize("s,g", [(1, 4), (9, 2), (100, 2), (33, 4), (64, 4), (13, 16)])
def test_gpu_quant_whole_rows_bytes_exact(s, g):
    """Decode batches of whole head rows, 1 and 2 tokens a program (one masked at odd S), at
    G 2 / 4 / 16 as the rule launches them: every byte written and the oracle's."""
    cfg = launch.quant_config(s, heads=g * HPG)
    one_token = s * g * HPG <= configs.DEPENDENT_QUANT_ROWS
    assert cfg.whole_head and cfg.block_r == (1 if one_token else 2), cfg
    _check_rule_bytes(s, g)


@gpu
def test_gpu_quant_fp32_rope_fma_differences_are_rare():
    """With fp32 cos/sin the GPU may contract ``a*c + b*s`` into an FMA (one fp32 ulp apart from the
    oracle's separately rounded products). Against the oracle on XLA:CPU (no contraction), such
    fp8 bytes must be at most 1e-5 of all bytes and each one fp8 step away; scale bytes too must
    differ in at most 1e-5 of the groups."""
    seed = new_seed()
    s, g = 1024, 16
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=torch.float32)
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128)
    cpu = jax.devices("cpu")[0]
    args = [jax.device_put(np.asarray(to_numpy(t)), cpu) for t in (o, pos, cos, sin)]
    with jax.default_device(cpu):
        rq, rs = jax.jit(woa_jax.inverse_rope_group_quant, static_argnums=(4, 5))(*args, g, 128)
    sb, rsb = as_torch(sc).cpu(), torch.from_numpy(np.array(rs).view(np.uint8))
    qa, qe = as_torch(q).cpu(), torch.from_numpy(np.array(rq).view(np.uint8))
    scale_diff = int((sb != rsb).sum())
    diff = (qa != qe) & (sb == rsb).repeat_interleave(128, dim=-1)
    frac = int(diff.sum()) / qa.numel()
    da, de = qa[diff].int(), qe[diff].int()
    info = (f"seed {seed}: {int(diff.sum())} of {qa.numel()} fp8 bytes differ ({frac:.2e}), "
            f"{scale_diff} of {sb.numel()} scale bytes; first pairs "
            f"{list(zip(da[:8].tolist(), de[:8].tolist(), strict=True))}")
    print(info)
    assert scale_diff <= 1e-5 * sb.numel(), info
    assert frac <= 1e-5, info
    # e4m3 bytes are monotone in magnitude within a sign: one step is a byte difference of 1.
    assert bool((((da ^ de) & 0x80) == 0).all()), info
    assert bool(((da & 0x7F) - (de & 0x7F)).abs().eq(1).all()), info


@gpu
def test_gpu_quant_clamps_positions_like_aiter():
    o, _, cos, sin = rope_inputs(6, 2, new_seed())
    pos = torch.tensor([-5, 0, P - 1, P, P + 100, 7], device="cuda")
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128)
    rq, rs = quant_oracle(o, pos, cos, sin, 2)
    assert_bytes_equal(q, rq, "fp8", 0)
    assert_bytes_equal(sc, rs, "scale", 0)


@gpu
@pytest.mark.parametrize("table,rope_dtype", ROPE_TABLES)
@pytest.mark.parametrize("s,g", TABLE_SHAPES)
def test_gpu_quant_bytes_are_the_oracles_for_every_table(s, g, table, rope_dtype):
    """Random and DeepSeek V4 rope tables, fp32 and bf16 (``inputs.ROPE_TABLES``: why)."""
    seed = new_seed()
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=rope_dtype, table=table)
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128)
    rq, rs = quant_oracle(o, pos, cos, sin, g)
    assert count_differing(sc, rs) == 0, f"seed {seed}: scale bytes differ"
    bad = count_differing(q, rq)
    assert bad == 0, f"seed {seed}: {bad} of {q.numel()} fp8 bytes differ from the oracle"
