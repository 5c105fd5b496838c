"""Scaled-down V4-Flash / V4-Pro cases shared by the TP tests and their worker processes.

Numpy only (plus ml_dtypes), so both the JAX and the torch workers can build identical inputs.
Group counts, heads per group, rope width and the 128 block stay as released; hidden size, head
dim (hence K) and o_lora_rank (N) shrink so a CPU run takes seconds.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from woa_jax import DSV4_CONFIGS, DSV4Config

#: V4-Flash scaled down: G=8 groups of N=128, K=256, hidden 512 (wo_b [512, 1024]).
FLASH_TINY = dataclasses.replace(DSV4_CONFIGS["v4-flash"], name="v4-flash-tiny", hidden_size=512,
                                 num_heads=16, head_dim=128, o_lora_rank=128)
#: V4-Pro scaled down: G=16 groups of N=128, K=256, hidden 896 = 7 * 128 (wo_b [896, 2048]).
PRO_TINY = dataclasses.replace(DSV4_CONFIGS["v4-pro"], name="v4-pro-tiny", hidden_size=896,
                               num_heads=32, head_dim=128, o_lora_rank=128)
CONFIGS: dict[str, DSV4Config] = {c.name: c for c in (FLASH_TINY, PRO_TINY)}
TOKENS = 24
ROPE_ROWS = 4096
LAYER = 3


def make_case(cfg: DSV4Config, seed: int = 0) -> dict[str, np.ndarray]:
    """Full (TP1) checkpoint tensors and inputs as numpy arrays (fp8/e8m0 via ml_dtypes).

    Weights are fp8 of N(0, 1) with E8M0 block scales 2**-9 .. 2**-5 (checkpoint-like magnitudes);
    ``o`` is bf16 N(0, 1) with one all-zero token (exercises the quantizers' amax floor).
    """
    rng = np.random.default_rng(seed)
    b = cfg.block_size
    gn, k = cfg.o_groups * cfg.o_lora_rank, cfg.group_in_features

    def fp8(shape):
        return rng.standard_normal(shape, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)

    def e8m0(shape):
        return rng.integers(118, 123, shape, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)

    o = rng.standard_normal((TOKENS, cfg.num_heads, cfg.head_dim), dtype=np.float32)
    o[5] = 0.0
    return {
        "wo_a.weight": fp8((gn, k)),
        "wo_a.scale": e8m0((gn // b, k // b)),
        "wo_b.weight": fp8((cfg.hidden_size, gn)),
        "wo_b.scale": e8m0((cfg.hidden_size // b, gn // b)),
        "o": o.astype(ml_dtypes.bfloat16),
        "positions": rng.integers(0, ROPE_ROWS, TOKENS).astype(np.int64),
    }
