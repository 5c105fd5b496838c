"""woa_jax stands alone: importing and running it never imports torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_woa_jax_never_imports_torch():
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        import woa_jax
        import woa_jax.testing

        cos, sin = woa_jax.rope_cos_sin("v4-flash", "window", max_positions=4)
        o = np.ones((2, 2, 512), np.float32)
        x, xs = woa_jax.inverse_rope_group_quant(o, np.arange(2), cos, sin, 2, 128)
        assert x.shape == (2, 2, 512) and xs.shape == (2, 2, 4)
        woa_jax.testing.assert_bitwise_equal(xs, xs)
        bad = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        assert not bad, bad
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_testing_stands_below_conformance():
    """``woa_jax.testing`` imports nothing of the sweep; the sweep builds on it."""
    code = (
        "import sys, woa_jax.testing; assert 'woa_jax.conformance' not in sys.modules; "
        "import woa_jax.conformance as c, woa_jax.testing as t; assert c.to_numpy is t.to_numpy; "
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
