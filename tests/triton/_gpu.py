"""Moved to ``tests/inputs.py`` (``jx`` is ``jax_view`` there); re-exported here until every
importer imports from ``inputs``."""

from inputs import (  # noqa: F401
    DH,
    FP32_OUT_ON_GPU,
    GROUPS,
    HPG,
    SCALE_POISON,
    TOKENS,
    N,
    P,
    as_torch,
    assert_bytes_equal,
    chain_oracle,
    checkpoint,
    gemm_inputs,
    new_seed,
    oracle,
    poisoned,
    relerr,
    rope_inputs,
    xla_memory,
)
from inputs import jax_view as jx  # noqa: F401
