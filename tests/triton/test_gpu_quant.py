"""Triton quant on a GPU (``pytest -m gpu``): bytes against the ``woa_jax`` oracle."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _gpu import (  # noqa: E402, F401
    DH,
    GROUPS,
    HPG,
    SCALE_POISON,
    TOKENS,
    P,
    as_torch,
    assert_bytes_equal,
    jx,
    new_seed,
    oracle,
    poisoned,
    rope_inputs,
    xla_memory,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("g", GROUPS)
@pytest.mark.parametrize("s", TOKENS)
def test_quant_bytes_exact(s, g):
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    pos_dtype = torch.int32 if (s + g) % 2 else torch.int64
    o, pos, cos, sin = rope_inputs(s, g, seed, pos_dtype=pos_dtype)
    q, sc = poisoned(s, g, HPG * DH)
    launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128, x_fp8=q, x_scale=sc)
    rq, rs = oracle("inverse_rope_group_quant")(jx(o), jx(pos), jx(cos), jx(sin), g, 128)
    assert bool((sc != SCALE_POISON).all()), f"seed {seed}: scale bytes left unwritten"
    assert_bytes_equal(sc, rs, "scale", seed)
    assert_bytes_equal(q, rq, "fp8", seed)


def test_quant_fp32_rope_fma_differences_are_rare():
    """With fp32 cos/sin the GPU may contract ``a*c + b*s`` into an FMA (one fp32 ulp apart from the
    oracle's separately rounded products). Against the oracle on XLA:CPU (no contraction), such
    fp8 bytes must be at most 1e-5 of all bytes and each one fp8 step away; scale bytes too must
    differ in at most 1e-5 of the groups."""
    import jax

    import woa_jax
    from torch_bridge.backends.triton import launch
    from woa_jax.testing import to_numpy

    seed = new_seed()
    s, g = 1024, 16
    o, pos, cos, sin = rope_inputs(s, g, seed, rope_dtype=torch.float32)
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, g, 128)
    cpu = jax.devices("cpu")[0]
    args = [jax.device_put(np.asarray(to_numpy(t)), cpu) for t in (o, pos, cos, sin)]
    with jax.default_device(cpu):
        rq, rs = jax.jit(woa_jax.inverse_rope_group_quant, static_argnums=(4, 5))(*args, g, 128)
    sb, rsb = as_torch(sc).cpu(), torch.from_numpy(np.array(rs).view(np.uint8))
    qa, qe = as_torch(q).cpu(), torch.from_numpy(np.array(rq).view(np.uint8))
    scale_diff = int((sb != rsb).sum())
    diff = (qa != qe) & (sb == rsb).repeat_interleave(128, dim=-1)
    frac = int(diff.sum()) / qa.numel()
    da, de = qa[diff].int(), qe[diff].int()
    info = (f"seed {seed}: {int(diff.sum())} of {qa.numel()} fp8 bytes differ ({frac:.2e}), "
            f"{scale_diff} of {sb.numel()} scale bytes; first pairs "
            f"{list(zip(da[:8].tolist(), de[:8].tolist(), strict=True))}")
    print(info)
    assert scale_diff <= 1e-5 * sb.numel(), info
    assert frac <= 1e-5, info
    # e4m3 bytes are monotone in magnitude within a sign: one step is a byte difference of 1.
    assert bool((((da ^ de) & 0x80) == 0).all()), info
    assert bool(((da & 0x7F) - (de & 0x7F)).abs().eq(1).all()), info


def test_quant_clamps_positions_like_aiter():
    from torch_bridge.backends.triton import launch

    o, _, cos, sin = rope_inputs(6, 2, new_seed())
    pos = torch.tensor([-5, 0, P - 1, P, P + 100, 7], device="cuda")
    q, sc = launch.inverse_rope_group_quant(o, pos, cos, sin, 2, 128)
    rq, rs = oracle("inverse_rope_group_quant")(jx(o), jx(pos), jx(cos), jx(sin), 2, 128)
    assert_bytes_equal(q, rq, "fp8", 0)
    assert_bytes_equal(sc, rs, "scale", 0)
