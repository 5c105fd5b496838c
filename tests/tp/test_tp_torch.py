"""torch.distributed tensor parallelism of ``wo_a -> wo_b`` (torch_bridge.tp) on CPU with gloo.

One subprocess spawns a 4-rank gloo world (TP4 on the world, TP2 on two subgroups); every rank
reads its slice of a small safetensors checkpoint and saves its output. Here: all ranks agree bit
for bit, TP equals TP1 within fp32 summation order (``gemm_fp32`` on the fp32 output,
``gemm_bf16`` on the bf16 output), and TP1 equals the JAX oracle.
"""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from _tp_cases import CONFIGS, FLASH_TINY, LAYER, ROPE_ROWS, make_case

from torch_bridge import checkpoint, interop
from torch_bridge.tp import TPOutputProjection, read_wo_b, wo_b_names
from torch_bridge.wo_b import WoBProjection, group_quant_e8m0_2d
from woa_jax import group_quant_e8m0, rope_cos_sin, wo_b_bf16, wo_b_fp8
from woa_jax import tp as wtp
from woa_jax.testing import assert_bitwise_equal, assert_close, relative_error

HERE = pathlib.Path(__file__).parent
WORLDS = (2, 4)
CHAINS = (("fp8", "torch"), ("bf16", "bf16"))


def _torch(a: np.ndarray) -> torch.Tensor:
    return interop.to_torch(jnp.asarray(a))


def _write_checkpoint(root: pathlib.Path, cfg) -> pathlib.Path:
    from safetensors.torch import save_file

    c = make_case(cfg)
    path = root / cfg.name
    wa, sa = checkpoint.wo_a_names(LAYER)
    wb, sb = wo_b_names(LAYER)
    # Two shards with an index, so the readers follow weight_map.
    checkpoint.save_checkpoint(path, {wa: _torch(c["wo_a.weight"]), sa: _torch(c["wo_a.scale"]),
                                      wb: _torch(c["wo_b.weight"]), sb: _torch(c["wo_b.scale"])},
                               shards=2)
    save_file({"o": _torch(c["o"]), "positions": _torch(c["positions"])},
              str(path / "inputs.safetensors"))
    return path


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_ckpt")
    for cfg in CONFIGS.values():
        _write_checkpoint(root, cfg)
    return root


@pytest.fixture(scope="module")
def dist_results(ckpt_root, tmp_path_factory):
    """``{(tp, rank in its group): results}`` from one 4-rank gloo world (TP4, and TP2 on
    subgroups {0, 1} and {2, 3})."""
    out = tmp_path_factory.mktemp("tp_out")
    proc = subprocess.run([sys.executable, str(HERE / "_torch_dist_worker.py"), str(ckpt_root),
                           str(out)], cwd=HERE, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(4)]
    res = {}
    for world, r in [(4, 0), (4, 1), (4, 2), (4, 3), (2, 0), (2, 1), (2, 2), (2, 3)]:
        d = {k.split("/", 1)[1]: v for k, v in ranks[r].items() if k.startswith(f"tp{world}/")}
        res[(world, r)] = d
    return res


def _tp1(ckpt_root, name, backend):
    cfg = CONFIGS[name]
    path = ckpt_root / name
    from safetensors.torch import load_file

    inp = load_file(str(path / "inputs.safetensors"))
    proj = TPOutputProjection.from_checkpoint(path, LAYER, cfg, backend=backend,
                                              layer_kind="window", max_positions=ROPE_ROWS)
    assert (proj.tp, proj.rank) == (1, 0)
    return proj, inp, proj(inp["o"], inp["positions"], dtype=torch.float32)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("key,backend", CHAINS)
def test_gloo_tp_equals_tp1(dist_results, ckpt_root, world, name, key, backend):
    _, _, ref = _tp1(ckpt_root, name, backend)
    r0 = dist_results[(world, 0)]
    assert r0[f"{name}/{key}/route"] == (backend, key)
    for r in range(4):  # group ranks; TP2 runs twice, on ranks {0, 1} and {2, 3}
        assert dist_results[(world, r)][f"{name}/{key}/shard"] == (r % world, world)
    for r in range(1, 4):  # the all-reduce leaves one value on every rank (and replica)
        assert_bitwise_equal(dist_results[(world, r)][f"{name}/{key}/bf16"],
                             r0[f"{name}/{key}/bf16"], name=f"rank {r} vs rank 0")
    got = r0[f"{name}/{key}/fp32"]
    assert got.dtype == torch.float32 and got.shape == (ref.shape[0], CONFIGS[name].hidden_size)
    assert_close(got, ref, tolerance="gemm_fp32", name=f"{name} {key} tp{world} fp32")
    assert r0[f"{name}/{key}/bf16"].dtype == torch.bfloat16
    assert_bitwise_equal(r0[f"{name}/{key}/bf16"], got.to(torch.bfloat16), name="one final cast")
    assert_close(r0[f"{name}/{key}/bf16"], ref.to(torch.bfloat16), tolerance="gemm_bf16",
                 name=f"{name} {key} tp{world} bf16")


@pytest.mark.parametrize("world", WORLDS)
def test_gloo_rejects_groups_not_divisible(dist_results, world):
    msg = dist_results[(world, 0)]["error/groups"]
    assert f"o_groups=5 is not divisible by tp={world}" in msg


_oracle = jax.jit(wtp.wo_a_wo_b, static_argnums=8, static_argnames=("path", "dtype"))


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("key,backend", CHAINS)
def test_tp1_matches_the_jax_oracle(ckpt_root, name, key, backend):
    proj, inp, y = _tp1(ckpt_root, name, backend)
    c = {k: jnp.asarray(v) for k, v in make_case(CONFIGS[name]).items()}
    ref = _oracle(interop.to_jax(inp["o"]), c["positions"].astype(jnp.int32),
                        interop.to_jax(proj.wo_a.cos_cache), interop.to_jax(proj.wo_a.sin_cache),
                        c["wo_a.weight"], c["wo_a.scale"], c["wo_b.weight"], c["wo_b.scale"],
                        CONFIGS[name].o_groups, path=key, dtype=jnp.float32)
    assert_close(y, ref, tolerance="gemm_fp32", name=f"{name} {key} torch TP1 vs JAX")


def _tensors(cfg):
    return {k: _torch(v) for k, v in make_case(cfg).items()}


def test_from_tensors_slices_like_the_checkpoint_reader(ckpt_root):
    """Emulated TP4 without a process group: the per-rank partials of ``from_tensors`` slices sum
    to TP1, and ``read_wo_b`` returns exactly the ``from_tensors`` columns."""
    cfg, tp = FLASH_TINY, 4
    t = _tensors(cfg)
    cos, sin = (interop.to_torch(a) for a in rope_cos_sin(cfg, "window", ROPE_ROWS))
    full = TPOutputProjection.from_tensors(t["wo_a.weight"], t["wo_a.scale"], t["wo_b.weight"],
                                           t["wo_b.scale"], cfg, cos, sin, backend="torch")
    ref = full(t["o"], t["positions"], dtype=torch.float32)
    parts = []
    for r in range(tp):
        sh = wtp.tp_shard(cfg, tp, r)
        wa, sa, wb, sb = (x.contiguous() for x in wtp.shard_wo_a_wo_b(
            t["wo_a.weight"], t["wo_a.scale"], t["wo_b.weight"], t["wo_b.scale"], sh))
        wb_disk, sb_disk = read_wo_b(ckpt_root / cfg.name, LAYER, sh)
        assert_bitwise_equal(wb_disk, wb, name="wo_b columns")
        assert_bitwise_equal(sb_disk, sb, name="wo_b scale columns")
        proj = TPOutputProjection(
            full.wo_a.__class__(wa, sa, sh.local.num_groups, cos, sin, backend="torch"),
            WoBProjection(wb, sb), sh)
        parts.append(proj.partial(t["o"][:, sh.heads].contiguous(), t["positions"]))
    assert_close(sum(parts), ref, tolerance="gemm_fp32", name="sum of rank partials")
    assert relative_error(sum(parts[:-1]), ref) > 0.1  # a lost rank is caught


def test_tp_needs_a_process_group_and_divisible_groups():
    t = _tensors(FLASH_TINY)
    cos, sin = (interop.to_torch(a) for a in rope_cos_sin(FLASH_TINY, "window", 64))
    args = (t["wo_a.weight"], t["wo_a.scale"], t["wo_b.weight"], t["wo_b.scale"], FLASH_TINY,
            cos, sin)
    with pytest.raises(ValueError, match="need torch.distributed: call dist.init_process_group"):
        TPOutputProjection.from_tensors(*args, tp_rank=0, tp_size=2)
    with pytest.raises(ValueError, match=r"wo_b weight has shape \(896, 2048\), expected"):
        pro = _tensors(CONFIGS["v4-pro-tiny"])
        TPOutputProjection.from_tensors(t["wo_a.weight"], t["wo_a.scale"], pro["wo_b.weight"],
                                        pro["wo_b.scale"], FLASH_TINY, cos, sin)
    proj = TPOutputProjection.from_tensors(*args, backend="torch")
    with pytest.raises(ValueError, match="o has 8 heads; rank 0 of tp=1 holds 16"):
        proj(t["o"][:, :8].contiguous(), t["positions"])
    with pytest.raises(ValueError, match=r"o must be 3-D \[T, H_l, Dh\]"):
        proj(t["o"][:, 0], t["positions"])


def test_from_tensors_takes_unquantized_weights_without_scales():
    """``None`` scales mean unquantized weights, as in ``from_checkpoint``: the exact BF16
    dequantized weights give the FP8 checkpoint's BF16 chain bit for bit."""
    t = _tensors(FLASH_TINY)
    cos, sin = (interop.to_torch(a) for a in rope_cos_sin(FLASH_TINY, "window", ROPE_ROWS))
    fp8 = TPOutputProjection.from_tensors(t["wo_a.weight"], t["wo_a.scale"], t["wo_b.weight"],
                                          t["wo_b.scale"], FLASH_TINY, cos, sin, backend="bf16")
    wa = fp8.wo_a.weight_bf16.reshape(-1, fp8.wo_a.k)
    wb = fp8.wo_b.weight_bf16
    ref = fp8(t["o"], t["positions"], dtype=torch.float32)
    plain = TPOutputProjection.from_tensors(wa, None, wb, None, FLASH_TINY, cos, sin)
    assert plain.wo_a.path == "bf16"
    assert_bitwise_equal(plain(t["o"], t["positions"], dtype=torch.float32), ref,
                         name="unquantized weights")
    mixed = TPOutputProjection.from_tensors(t["wo_a.weight"], t["wo_a.scale"], wb, None,
                                            FLASH_TINY, cos, sin, backend="bf16")
    assert_bitwise_equal(mixed(t["o"], t["positions"], dtype=torch.float32), ref,
                         name="unquantized wo_b only")
    with pytest.raises(ValueError, match="FP8 .* wo_a weight needs its block scale"):
        TPOutputProjection.from_tensors(t["wo_a.weight"], None, wb, None, FLASH_TINY, cos, sin)
    with pytest.raises(ValueError, match=r"wo_a weight has shape \(512, 256\), expected"):
        TPOutputProjection.from_tensors(wa[:512], None, wb, None, FLASH_TINY, cos, sin)
    with pytest.raises(TypeError, match="wo_a_weight must be a torch tensor or a JAX array, "
                                        "got NoneType"):
        TPOutputProjection.from_tensors(None, None, wb, None, FLASH_TINY, cos, sin)


def test_wo_b_quant_bytes_equal_the_oracle():
    rng = np.random.default_rng(3)
    z = rng.standard_normal((9, 512), dtype=np.float32) * 0.05
    z[2, 128:256] = 0.0  # an all-zero group takes the floor's byte
    zb = jnp.asarray(z, jnp.bfloat16)
    q, s = group_quant_e8m0_2d(interop.to_torch(zb))
    qj, sj = group_quant_e8m0(zb, 128)
    assert_bitwise_equal(q, qj, name="fp8 bytes")
    assert_bitwise_equal(s, sj, name="scale bytes")
    with pytest.raises(ValueError, match="block must be 32, 64 or 128 and divide K=500"):
        group_quant_e8m0_2d(torch.zeros(2, 500))


@pytest.mark.parametrize("path", ["fp8", "bf16"])
def test_wo_b_projection_matches_the_oracle(path):
    t = _tensors(FLASH_TINY)
    rng = np.random.default_rng(4)
    z = jnp.asarray(rng.standard_normal((7, 1024), dtype=np.float32) * 0.1, jnp.bfloat16)
    proj = WoBProjection(t["wo_b.weight"], t["wo_b.scale"])
    y = proj(interop.to_torch(z), path=path, backend="torch")
    fn = jax.jit(wo_b_fp8 if path == "fp8" else wo_b_bf16)
    ref = fn(z, jnp.asarray(make_case(FLASH_TINY)["wo_b.weight"]),
             jnp.asarray(make_case(FLASH_TINY)["wo_b.scale"]))
    assert y.dtype == torch.float32
    assert_close(y, ref, tolerance="gemm_fp32", name=f"wo_b {path}")
    assert proj(interop.to_torch(z), path=path, backend="torch",
                dtype=torch.bfloat16).dtype == torch.bfloat16


def test_wo_b_projection_errors():
    t = _tensors(FLASH_TINY)
    with pytest.raises(ValueError, match="needs its block scale"):
        WoBProjection(t["wo_b.weight"], None)
    with pytest.raises(ValueError, match="hidden=500 must be a multiple of the 128-wide block"):
        WoBProjection(t["wo_b.weight"][:500], t["wo_b.scale"])
    proj = WoBProjection(t["wo_b.weight"], t["wo_b.scale"])
    with pytest.raises(ValueError, match="does not match wo_b's 1024 input columns"):
        proj(torch.zeros(3, 512, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="path must be one of 'fp8', 'bf16'"):
        proj(torch.zeros(3, 1024, dtype=torch.bfloat16), path="int8")
    sf = t["wo_b.scale"].view(torch.uint8).to(torch.int32)
    odd = ((sf << 23).view(torch.float32) * 0.75).contiguous()  # not powers of two
    proj = WoBProjection(t["wo_b.weight"], odd)
    assert "not losslessly representable as E8M0" in proj.fp8_unavailable
    with pytest.raises(ValueError, match="the FP8 wo_b path cannot run"):
        proj(torch.zeros(3, 1024, dtype=torch.bfloat16), backend="torch")
    assert proj(torch.zeros(3, 1024, dtype=torch.bfloat16), path="bf16").shape == (3, 512)


def test_bf16_mm_probes_out_dtype_once_and_lets_other_errors_through(monkeypatch):
    """``out_dtype`` is tried once per device type: a missing kernel (NotImplementedError) falls
    back to the exact fp32 upcast from then on; other errors (out of memory) propagate."""
    from torch_bridge import wo_b

    real, calls = torch.mm, []

    def fake_mm(a, b, **kw):
        calls.append(kw)
        if kw:
            raise fail
        return real(a, b)

    monkeypatch.setattr(torch, "mm", fake_mm)
    monkeypatch.setattr(wo_b, "_MM_OUT_DTYPE", {})
    a, b = (torch.empty(4, 8, dtype=torch.bfloat16, device="meta") for _ in range(2))
    fail = NotImplementedError("Could not run 'aten::mm.dtype' with arguments from 'Meta'")
    for _ in range(3):
        assert wo_b._mm_fp32(a, b).dtype == torch.float32
    assert calls == [{"out_dtype": torch.float32}, {}, {}, {}]
    monkeypatch.setattr(wo_b, "_MM_OUT_DTYPE", {})
    fail = torch.OutOfMemoryError("out of memory")
    with pytest.raises(torch.OutOfMemoryError):
        wo_b._mm_fp32(a, b)


def test_from_checkpoint_reads_vllm_names(tmp_path):
    cfg = FLASH_TINY
    c = _tensors(cfg)
    wa, sa = checkpoint.wo_a_names(LAYER, "vllm")
    wb, sb = wo_b_names(LAYER, "vllm")
    assert sb.endswith("self_attn.wo_b.weight_scale_inv")
    checkpoint.save_checkpoint(tmp_path, {wa: c["wo_a.weight"], sa: c["wo_a.scale"],
                                          wb: c["wo_b.weight"], sb: c["wo_b.scale"]})
    cos, sin = (interop.to_torch(a) for a in rope_cos_sin(cfg, "window", ROPE_ROWS))
    proj = TPOutputProjection.from_checkpoint(tmp_path, LAYER, cfg, backend="torch",
                                              cos_cache=cos, sin_cache=sin)
    ref = TPOutputProjection.from_tensors(c["wo_a.weight"], c["wo_a.scale"], c["wo_b.weight"],
                                          c["wo_b.scale"], cfg, cos, sin, backend="torch")
    assert_bitwise_equal(proj(c["o"], c["positions"]), ref(c["o"], c["positions"]))


def test_from_checkpoint_refuses_a_config_that_is_not_the_checkpoints(tmp_path):
    """The V4-Pro config on a V4-Flash checkpoint, and wo_b scales in another block size."""
    c = _tensors(FLASH_TINY)
    names = {**dict(zip(checkpoint.wo_a_names(LAYER), ("wo_a.weight", "wo_a.scale"),
                        strict=True)),
             **dict(zip(wo_b_names(LAYER), ("wo_b.weight", "wo_b.scale"), strict=True))}
    checkpoint.save_checkpoint(tmp_path, {n: c[k] for n, k in names.items()})
    cos, sin = (interop.to_torch(a) for a in rope_cos_sin(FLASH_TINY, "window", 8))
    with pytest.raises(ValueError, match=r"is \[1024, 256\] in 128x128 scale blocks, but config "
                                         r"v4-pro-tiny with num_groups=16 expects \[2048, 256\]"):
        TPOutputProjection.from_checkpoint(tmp_path, LAYER, CONFIGS["v4-pro-tiny"],
                                           cos_cache=cos, sin_cache=sin)
    odd = dataclasses.replace(FLASH_TINY, name="v4-flash-tiny-32", block_size=32)
    wb, sb = wo_b_names(LAYER)
    with pytest.raises(ValueError, match=rf"{sb} has shape \(4, 8\); the config's 32x32 blocks "
                                         r"of \[hidden, 1024\] give 32 columns"):
        read_wo_b(tmp_path, LAYER, wtp.tp_shard(odd, 1, 0))


def test_read_wo_b_names_the_missing_tensor(tmp_path):
    checkpoint.save_checkpoint(tmp_path, {"layers.0.attn.wo_a.weight": torch.zeros(2, 2)})
    sh = wtp.tp_shard(FLASH_TINY, 1, 0)
    with pytest.raises(checkpoint.CheckpointError,
                       match="no wo_b weight for layer 0 in the checkpoint; it has none"):
        read_wo_b(tmp_path, 0, sh)


def test_wo_b_fp8_on_triton_quantizes_with_the_triton_kernel():
    """With the Triton GEMM (TRITON_INTERPRET=1 on CPU CI) the activation quant runs the Triton
    backend's kernel with zero rope lanes; bytes and result still match the oracle."""
    from torch_bridge import _dispatch

    ok, why = _dispatch.get_backend("triton").is_available()
    if not ok:
        pytest.skip(f"triton backend unavailable here: {why}")
    rng = np.random.default_rng(5)
    z = jnp.asarray(rng.standard_normal((6, 1024), dtype=np.float32) * 0.1, jnp.bfloat16)
    zt = interop.to_torch(z)
    if not _dispatch.get_backend("triton").supports(
            "inverse_rope_group_quant", _dispatch.Case(device_type=zt.device.type))[0]:
        pytest.skip("triton backend does not run on this device here")
    q, s = group_quant_e8m0_2d(zt, backend="triton")
    qj, sj = group_quant_e8m0(z, 128)
    assert_bitwise_equal(q, qj, name="fp8 bytes (triton)")
    assert_bitwise_equal(s, sj, name="scale bytes (triton)")
    c = make_case(FLASH_TINY)
    proj = WoBProjection(_torch(c["wo_b.weight"]), _torch(c["wo_b.scale"]))
    assert proj._gemm_backend(zt, torch.float32, "triton") == "triton"
    y = proj(zt, backend="triton")
    ref = jax.jit(wo_b_fp8)(z, jnp.asarray(c["wo_b.weight"]), jnp.asarray(c["wo_b.scale"]))
    assert_close(y, ref, tolerance="gemm_fp32", name="wo_b fp8 on triton")
