"""JAX tensor parallelism of ``wo_a -> wo_b`` (woa_jax.tp) on CPU.

The mesh runs happen in a subprocess with 4 forced host devices (JAX is already initialised with
one device here). TP results must equal TP1 to fp32 summation order: the fp32 partials within
``gemm_fp32`` and the bf16 outputs within ``gemm_bf16``.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _tp_cases import CONFIGS, FLASH_TINY, PRO_TINY, ROPE_ROWS, make_case

from woa_jax import rope_cos_sin
from woa_jax import tp as wtp
from woa_jax.testing import assert_bitwise_equal, assert_close, relative_error

HERE = pathlib.Path(__file__).parent


@pytest.fixture(scope="module")
def mesh_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("jax_tp") / "res.npz"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, str(HERE / "_jax_mesh_worker.py"), str(out)], env=env,
                          cwd=HERE, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with np.load(out) as d:
        return dict(d)


@pytest.mark.parametrize("name,path,tp", [
    ("v4-flash-tiny", "fp8", 2), ("v4-flash-tiny", "fp8", 4),
    ("v4-pro-tiny", "fp8", 2), ("v4-pro-tiny", "fp8", 4),
    ("v4-flash-tiny", "bf16", 2), ("v4-flash-tiny", "bf16", 4),
])
def test_mesh_tp_equals_tp1(mesh_results, name, path, tp):
    ref = mesh_results[f"{name}/{path}/tp1"]
    got = mesh_results[f"{name}/{path}/tp{tp}"]
    assert got.shape == (ref.shape[0], CONFIGS[name].hidden_size)
    assert int(mesh_results[f"{name}/{path}/tp{tp}/devices"]) == tp
    assert bool(mesh_results[f"{name}/{path}/tp{tp}/replicated"])
    assert_close(got, ref, tolerance="gemm_fp32", name=f"{name} {path} tp{tp} fp32")
    assert_close(got.astype(ml_dtypes.bfloat16), ref.astype(ml_dtypes.bfloat16),
                 tolerance="gemm_bf16", name=f"{name} {path} tp{tp} bf16")


def test_mesh_default_output_is_bf16_of_the_fp32_sum(mesh_results):
    got = mesh_results["v4-flash-tiny/bf16/tp2/bf16_out"].view(ml_dtypes.bfloat16)
    assert_bitwise_equal(got, mesh_results["v4-flash-tiny/bf16/tp2"].astype(ml_dtypes.bfloat16))


def test_mesh_rejects_tp_not_dividing_groups(mesh_results):
    msg = str(mesh_results["error/tp3"])
    assert "o_groups=8 is not divisible by tp=3" in msg


def _jax_case(cfg):
    c = {k: jnp.asarray(v) for k, v in make_case(cfg).items()}
    c["positions"] = c["positions"].astype(jnp.int32)
    c["cos"], c["sin"] = rope_cos_sin(cfg, "window", max_positions=ROPE_ROWS, dtype=jnp.bfloat16)
    return c


_partial = jax.jit(wtp.wo_a_wo_b_partial, static_argnums=8, static_argnames=("path",))


def test_shards_sum_to_tp1_and_one_shard_does_not():
    """Per-rank slices from ``tp_shard`` / ``shard_wo_a_wo_b``, summed by hand, give TP1."""
    cfg, tp = FLASH_TINY, 4
    c = _jax_case(cfg)
    full = (c["wo_a.weight"], c["wo_a.scale"], c["wo_b.weight"], c["wo_b.scale"])
    ref = _partial(c["o"], c["positions"], c["cos"], c["sin"], *full, cfg.o_groups)
    parts = []
    for r in range(tp):
        sh = wtp.tp_shard(cfg, tp, r)
        parts.append(_partial(c["o"][:, sh.heads], c["positions"], c["cos"], c["sin"],
                              *wtp.shard_wo_a_wo_b(*full, sh), sh.local.num_groups))
    assert_close(sum(parts), ref, tolerance="gemm_fp32", name="sum of shards")
    # The check has teeth: a missing rank is far outside the tolerance.
    assert relative_error(sum(parts[:-1]), ref) > 0.1


def test_tp_shard_slices():
    sh = wtp.tp_shard("v4-pro", 4, 1)
    assert (sh.local.num_groups, sh.local.num_heads) == (4, 32)
    assert sh.heads == slice(32, 64)
    assert sh.wo_a_rows == slice(4096, 8192) and sh.wo_a_scale_rows == slice(32, 64)
    assert sh.wo_b_cols == slice(4096, 8192) and sh.wo_b_scale_cols == slice(32, 64)


@pytest.mark.parametrize("tp", [3, 5, 16])
def test_tp_shard_rejects_tp_not_dividing_groups(tp):
    with pytest.raises(ValueError, match=f"o_groups=8 is not divisible by tp={tp}"):
        wtp.tp_shard("v4-flash", tp, 0)


def test_tp_shard_rejects_bad_rank_and_hidden():
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 2\)"):
        wtp.tp_shard("v4-flash", 2, 2)
    bad = dataclasses.replace(FLASH_TINY, hidden_size=520)
    with pytest.raises(ValueError, match="hidden_size=520 is not a multiple of the 128-wide"):
        wtp.tp_shard(bad, 2, 0)
    bad = dataclasses.replace(FLASH_TINY, o_lora_rank=192)
    with pytest.raises(ValueError, match="o_lora_rank=192 is not a multiple"):
        wtp.tp_shard(bad, 2, 0)


def test_check_tp_weights_names_the_wrong_tensor():
    c = make_case(PRO_TINY)
    with pytest.raises(ValueError, match=r"wo_b weight has shape \(512, 1024\), expected"):
        wtp.check_tp_weights(PRO_TINY, c["wo_a.weight"], c["wo_a.scale"],
                             make_case(FLASH_TINY)["wo_b.weight"], c["wo_b.scale"])
    weights = (c["wo_a.weight"], c["wo_a.scale"], c["wo_b.weight"], c["wo_b.scale"])
    with pytest.raises(ValueError, match=r"o must be 3-D \[T, H, Dh\], got shape \(24, 128\)"):
        wtp.wo_a_wo_b_tp(wtp.tp_mesh(1), c["o"][:, 0], c["positions"], None, None, *weights,
                         PRO_TINY)


def test_tp_mesh_needs_devices():
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        wtp.tp_mesh(len(jax.devices()) + 1)


def test_wo_a_wo_b_rejects_an_unknown_path():
    c = _jax_case(FLASH_TINY)
    with pytest.raises(ValueError, match="path must be one of 'fp8', 'bf16'"):
        wtp.wo_a_wo_b(c["o"], c["positions"], c["cos"], c["sin"], c["wo_a.weight"],
                      c["wo_a.scale"], c["wo_b.weight"], c["wo_b.scale"], 8, path="fp16")


def test_shard_map_falls_back_to_the_experimental_module(monkeypatch):
    """jax < 0.7 has only ``jax.experimental.shard_map.shard_map``; the same call works on it."""
    import warnings

    from jax.sharding import PartitionSpec as P

    monkeypatch.delattr(jax, "shard_map")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.experimental.shard_map import shard_map as legacy

        sm = wtp._shard_map()
        assert sm is legacy
        f = sm(lambda x: jax.lax.psum(x, "tp"), mesh=wtp.tp_mesh(1), in_specs=(P("tp"),),
               out_specs=P())
        assert_bitwise_equal(f(jnp.arange(4.0)), jnp.arange(4.0))
