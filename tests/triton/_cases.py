"""Moved to ``tests/inputs.py`` (``rope_case`` is ``inputs.rope_tensors`` there); this re-export
stays only for ``test_launch_plans.py`` until it imports from ``inputs``."""

from inputs import DEVICE, assert_quant_equal, jx  # noqa: F401
from inputs import rope_tensors as rope_case  # noqa: F401
