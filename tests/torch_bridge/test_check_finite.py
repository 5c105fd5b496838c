"""Activation values are not checked by default (that would cost a device sync per call);
``check_finite=True`` or ``WOA_CHECK_FINITE=1`` checks them and names the first bad element."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from inputs import np_to_torch, rope_case, wo_a_checkpoint

import torch_bridge as tb
from torch_bridge import ops

G, N, H, DH = 2, 128, 4, 64  # K = H * DH / G = 128


def _layer():
    rng = np.random.default_rng(0)
    c = rope_case(rng, s=3, h=H, dh=DH, rd=64, num_groups=G, gs=128)
    w, sc = wo_a_checkpoint(rng, g=G, n=N, k=H * DH // G)
    return c.torch(), np_to_torch(w), np_to_torch(sc)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_off_by_default_bad_values_flow_through_as_documented(bad, triton_off):
    (o, pos, cos, sin), w, sc = _layer()
    o[1, 2, 3] = bad
    proj = tb.WoAProjection(w, sc, G, cos, sin, backend="torch")
    assert not proj.check_finite
    assert not torch.isfinite(proj(o, pos).float()).all()


@pytest.mark.parametrize("bad, shown", [(float("nan"), "nan"), (float("-inf"), "-inf")])
def test_check_finite_names_the_element(bad, shown, triton_off):
    (o, pos, cos, sin), w, sc = _layer()
    proj = tb.WoAProjection(w, sc, G, cos, sin, check_finite=True)
    assert proj.check_finite and isinstance(proj, tb.WoAProjection)
    good, kept = proj(o, pos), o[1, 2, 3].item()
    o[1, 2, 3] = bad
    with pytest.raises(ValueError, match=rf"o: element \[1, 2, 3\] is {shown}; expected finite "
                                         r"values \(check_finite / WOA_CHECK_FINITE=1\)"):
        proj(o, pos)
    with pytest.raises(ValueError, match=r"element \[1, 2, 3\]"):  # JAX in: the same check
        proj(tb.to_jax(o), tb.to_jax(pos))
    plain = tb.WoAProjection(w, sc, G, cos, sin, check_finite=False)
    o[1, 2, 3] = kept
    assert torch.equal(plain(o, pos), good)
    with pytest.raises(TypeError, match="check_finite must be True, False or None"):
        tb.WoAProjection(w, sc, G, cos, sin, check_finite="yes")


def test_check_finite_reads_the_environment_when_a_layer_is_built(monkeypatch, triton_off):
    (o, pos, cos, sin), w, sc = _layer()
    monkeypatch.setenv("WOA_CHECK_FINITE", "1")
    proj = tb.WoAProjection(w, sc, G, cos, sin)
    monkeypatch.setenv("WOA_CHECK_FINITE", "0")
    assert proj.check_finite and not tb.WoAProjection(w, sc, G, cos, sin).check_finite
    monkeypatch.setenv("WOA_CHECK_FINITE", "yes")
    with pytest.raises(ValueError, match="WOA_CHECK_FINITE='yes' is not a valid switch"):
        tb.WoAProjection(w, sc, G, cos, sin)


def test_check_finite_on_gemm_operands():
    x = torch.zeros(2, 1, 128).to(torch.float8_e4m3fn)
    xs = torch.full((2, 1, 1), 127, dtype=torch.uint8)
    ops.check_finite(x=x, x_scale=xs, o=None, positions=torch.arange(2))
    x.view(torch.uint8)[1, 0, 5] = 0x7F
    with pytest.raises(ValueError, match=r"x: element \[1, 0, 5\] is byte 127; expected finite"):
        ops.check_finite(x=x)
    xs.view(torch.uint8)[0, 0, 0] = 255
    with pytest.raises(ValueError, match=r"x_scale: element \[0, 0, 0\] is byte 255; expected "
                                         "E8M0 scale bytes below 255"):
        ops.check_finite(x_scale=xs.view(torch.float8_e8m0fnu))


_ENV_SCRIPT = """
import torch, torch_bridge as tb
o = torch.randn(2, 4, 64, dtype=torch.bfloat16); o[0, 1, 2] = float("inf")
pos = torch.arange(2); cos = torch.ones(8, 32); sin = torch.zeros(8, 32)
x = torch.zeros(2, 1, 128).to(torch.float8_e4m3fn); w = torch.zeros(1, 128, 128).to(x.dtype)
xs = torch.full((2, 1, 1), 127, dtype=torch.uint8); xs[1, 0, 0] = 255
ws = torch.full((1, 1, 1), 127, dtype=torch.uint8)
for name, call in (("quant", lambda: tb.inverse_rope_group_quant(o, pos, cos, sin, 2, 128)),
                   ("gemm", lambda: tb.batched_gemm_a8w8_mxscale(x, w, xs, ws))):
    try:
        call()
        print(name, "ran")
    except ValueError as e:
        print(name, e)
"""


@pytest.mark.parametrize("flag", ["1", "0"])
def test_woa_check_finite_covers_the_ops(flag):
    env = dict(os.environ, WOA_CHECK_FINITE=flag, WOA_BACKEND="torch", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _ENV_SCRIPT], capture_output=True, text=True,
                         env=env, check=True, timeout=300).stdout.splitlines()
    if flag == "0":
        assert out == ["quant ran", "gemm ran"]
    else:
        assert out == ["quant o: element [0, 1, 2] is inf; expected finite values "
                       "(check_finite / WOA_CHECK_FINITE=1)",
                       "gemm x_scale: element [1, 0, 0] is byte 255; expected E8M0 scale bytes "
                       "below 255 (check_finite / WOA_CHECK_FINITE=1)"]
