"""Moved to ``tests/inputs.py``; this re-export stays only for ``test_gpu_eager.py``,
``test_gpu_threads.py`` and ``_stress.py`` until they import from ``inputs``."""

from inputs import (  # noqa: F401
    DH,
    HPG,
    N,
    checkpoint,
    gemm_inputs,
    new_seed,
    rope_inputs,
    xla_memory,
)
