"""Fixtures for the oracle tests: cached RoPE tables and FP8 checkpoint-like weights.

Helpers are fixtures; other dirs import helper modules, so the suite needs the default import mode.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import woa_jax

#: Rows of the small RoPE tables used where the full 1,048,576-row table is not needed.
SMALL_P = 4096


@pytest.fixture(scope="session")
def compress_table():
    """The full V4 compressed-layer table ``(cos, sin)``, fp32 ``[1048576, 32]``, built once."""
    return woa_jax.rope_cos_sin("v4-flash", "compress")


@pytest.fixture(scope="session")
def compress_table_bf16(compress_table):
    """The full table rounded to bf16, as vLLM hands it to AITER's op."""
    return tuple(t.astype(jnp.bfloat16) for t in compress_table)


@pytest.fixture(scope="session")
def small_table():
    """The first ``SMALL_P`` rows of the compressed-layer table, fp32."""
    return woa_jax.rope_cos_sin("v4-flash", "compress", max_positions=SMALL_P)


@pytest.fixture(scope="session")
def _fp8_row_pool():
    """2048 rows of ``randn * 64`` in e4m3fn (K = 4096), drawn once; weights gather rows from it."""
    rng = np.random.default_rng(1234)
    return (rng.standard_normal((2048, 4096), dtype=np.float32) * 64).astype(
        ml_dtypes.float8_e4m3fn
    )


@pytest.fixture(scope="session")
def make_weight(_fp8_row_pool):
    """Factory ``(rows, k, block, rng, fp8_dtype=e4m3fn) -> (weight [rows, k], scale uint8)``.

    Weight rows are gathered from a shared random fp8 pool; each ``block x block`` tile gets a
    scale byte ``119 + randint(-4, 4)`` (``2**-8`` times AITER's ``2**randint(-4, 4)`` spread), so
    the dequantized weights have roughly unit-scale entries divided by 4.
    """

    def make(rows: int, k: int, block: int, rng: np.random.Generator,
             fp8_dtype=jnp.float8_e4m3fn):
        pool = _fp8_row_pool[:, :k]
        w = pool[rng.integers(0, pool.shape[0], rows)]
        if np.dtype(fp8_dtype) != np.dtype(ml_dtypes.float8_e4m3fn):
            # Every e4m3fn value within +-240 is an e4m3fnuz value; clip the rare larger ones.
            w = w.astype(np.float32).clip(-240, 240).astype(fp8_dtype)
        scale = (119 + rng.integers(-4, 5, size=(-(-rows // block), k // block))).astype(np.uint8)
        return w, scale

    return make


@pytest.fixture
def bf16_o():
    """Factory ``(shape, rng, scale=0.1) -> bf16 [S, H, Dh]``: ``randn * scale`` as AITER tests."""

    def make(shape, rng: np.random.Generator, scale: float = 0.1):
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
        return jnp.asarray(x.astype(ml_dtypes.bfloat16))

    return make
