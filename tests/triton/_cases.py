"""Moved to ``tests/inputs.py`` (``rope_case`` and ``gemm_case`` are ``rope_tensors`` and
``gemm_tensors`` there); re-exported here until every importer imports from ``inputs``."""

from inputs import DEVICE, assert_quant_equal, jx  # noqa: F401
from inputs import gemm_tensors as gemm_case  # noqa: F401
from inputs import rope_tensors as rope_case  # noqa: F401
