"""Fake AITER 0.1.19.post1 (``scale_shuffle``, no GEMM); see ../../aiter_contract_double.py."""

from __future__ import annotations

import aiter_contract_double as _impl

inverse_rope_group_quant = _impl.scale_shuffle_quant
