"""Moved to ``tests/inputs.py``; this re-export stays only for ``test_dispatch.py`` and
``test_call_plans.py`` until they import from ``inputs``."""

from inputs import gemm_operands, np_to_torch, rope_case, wo_a_checkpoint  # noqa: F401
