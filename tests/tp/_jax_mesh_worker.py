"""Runs ``woa_jax.tp.wo_a_wo_b_tp`` on a CPU mesh; started by test_tp_jax.py in a fresh process.

The test process has already initialised JAX with one CPU device, so the multi-device run needs a
new interpreter with ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` set before the import.
Usage: ``python _jax_mesh_worker.py OUT.npz``. Stores fp32 results as ``{config}/{path}/tp{n}``
(tp1 is the unsharded ``wo_a_wo_b`` under ``jax.jit``), the output's device count and replication
beside them, and error messages as ``error/...``.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from _tp_cases import CONFIGS, FLASH_TINY, ROPE_ROWS, make_case

from woa_jax import rope_cos_sin
from woa_jax import tp as wtp

# (config, path, tp sizes): FP8 for both shapes, the BF16 fallback for one.
RUNS = (("v4-flash-tiny", "fp8", (2, 4)), ("v4-pro-tiny", "fp8", (2, 4)),
        ("v4-flash-tiny", "bf16", (2, 4)))


def main(out: str) -> None:
    if len(jax.devices()) < 4:
        raise SystemExit(f"need 4 CPU devices, got {jax.devices()} "
                         f"(XLA_FLAGS={os.environ.get('XLA_FLAGS')!r})")
    res: dict[str, np.ndarray] = {}
    for name, path, tps in RUNS:
        cfg = CONFIGS[name]
        c = {k: jnp.asarray(v) for k, v in make_case(cfg).items()}
        cos, sin = rope_cos_sin(cfg, "window", max_positions=ROPE_ROWS, dtype=jnp.bfloat16)
        args = (c["o"], c["positions"].astype(jnp.int32), cos, sin, c["wo_a.weight"],
                c["wo_a.scale"], c["wo_b.weight"], c["wo_b.scale"])
        tp1 = jax.jit(wtp.wo_a_wo_b, static_argnums=8, static_argnames=("path", "dtype"))
        res[f"{name}/{path}/tp1"] = np.asarray(tp1(*args, cfg.o_groups, path=path,
                                                   dtype=jnp.float32))
        for tp in tps:
            y = wtp.wo_a_wo_b_tp(wtp.tp_mesh(tp), *args, cfg, path=path, dtype=jnp.float32)
            res[f"{name}/{path}/tp{tp}"] = np.asarray(y)
            res[f"{name}/{path}/tp{tp}/devices"] = np.asarray(len(y.sharding.device_set))
            res[f"{name}/{path}/tp{tp}/replicated"] = np.asarray(y.sharding.is_fully_replicated)
    # The default bf16 output, once.
    y = wtp.wo_a_wo_b_tp(wtp.tp_mesh(2), *args, FLASH_TINY, path="bf16")
    res["v4-flash-tiny/bf16/tp2/bf16_out"] = np.asarray(y).view(np.uint16)
    try:
        wtp.wo_a_wo_b_tp(wtp.tp_mesh(3), *args, FLASH_TINY)
    except ValueError as e:
        res["error/tp3"] = np.asarray(str(e))
    np.savez(out, **res)


if __name__ == "__main__":
    main(sys.argv[1])
