"""woa_jax.tp entry points validate their options before any work."""

from __future__ import annotations

import pytest

from woa_jax import tp as wtp


@pytest.mark.parametrize("floor", [float("nan"), 0.0, -1.0, float("inf")])
def test_every_tp_entry_point_rejects_a_bad_amax_floor(floor):
    """The floor is checked first, so no tensor is needed to see the error."""
    match = "amax_floor must be a finite number > 0"
    for path in ("fp8", "bf16"):
        with pytest.raises(ValueError, match=match):
            wtp.wo_a_wo_b_partial(*[None] * 8, 1, path=path, amax_floor=floor)
        with pytest.raises(ValueError, match=match):
            wtp.wo_a_wo_b(*[None] * 8, 1, path=path, amax_floor=floor)
    with pytest.raises(ValueError, match=match):
        wtp.wo_a_wo_b_tp(wtp.tp_mesh(1), *[None] * 8, "v4-flash", amax_floor=floor)
