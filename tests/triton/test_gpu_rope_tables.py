"""fp32 and bf16 rope tables on a GPU (``pytest -m gpu``): every rotating kernel gives the oracle's
bytes, random tables and DeepSeek V4's own (``woa_jax.rope_cos_sin``).

The oracle rounds each product of the rotation to fp32 before the sum; with fp32 tables a
compiled multiply-add would round once, so these tests catch a contraction the kernels let back
in. bf16 tables give exact products, so they pin that nothing changed there.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from _gpu import jx, new_seed, xla_memory  # noqa: E402, F401

pytestmark = pytest.mark.gpu

HPG, DH, RD, N, P = 8, 512, 64, 1024, 65536
SHAPES = ((1024, 16), (8192, 16), (1024, 2), (8192, 2))
TABLES = [("random", torch.float32), ("random", torch.bfloat16), ("v4-flash", torch.float32),
          ("v4-flash", torch.bfloat16)]


def _t(a):
    """A torch view (on the GPU) of a JAX or torch array; 1- and 2-byte types as unsigned ints."""
    from torch_bridge import interop

    t = interop.to_torch(a)
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _differ(actual, expected) -> int:
    return int((_t(actual) != _t(expected)).sum())


def _inputs(s, g, table, rope_dtype, seed):
    """``o [S, G * 8, 512]`` bf16, positions, and the cos/sin table ``[P, 32]``."""
    import woa_jax
    from torch_bridge import interop

    gen = torch.Generator(device="cuda").manual_seed(seed)
    o = (torch.randn((s, g * HPG, DH), generator=gen, device="cuda") / 10).to(torch.bfloat16)
    pos = torch.randint(0, P, (s,), generator=gen, device="cuda")
    if table == "random":
        ang = torch.rand((P, RD // 2), generator=gen, device="cuda") * 6.3
        cos, sin = torch.cos(ang), torch.sin(ang)
    else:
        cos, sin = (interop.numpy_to_torch(np.asarray(t)).cuda()
                    for t in woa_jax.rope_cos_sin(table, "compress", max_positions=P))
    return o, pos, cos.to(rope_dtype), sin.to(rope_dtype)


def _oracle_quant(o, pos, cos, sin, g):
    import jax

    import woa_jax

    quant = jax.jit(woa_jax.inverse_rope_group_quant, static_argnums=(4, 5))
    return quant(jx(o), jx(pos), jx(cos), jx(sin), g, 128)


@pytest.mark.parametrize("table,rope_dtype", TABLES)
@pytest.mark.parametrize("s,g", SHAPES)
def test_bf16_chain_rotation_is_the_oracles(s, g, table, rope_dtype):
    """The BF16 chain's rotation, copying and in place, against ``woa_jax.inverse_rope``."""
    import jax

    import woa_jax
    from torch_bridge.backends.triton import launch

    seed = new_seed()
    o, pos, cos, sin = _inputs(s, g, table, rope_dtype, seed)
    ref = jax.jit(woa_jax.inverse_rope)(jx(o), jx(pos), jx(cos), jx(sin))
    before = o.clone()
    y = launch.inverse_rope(o, pos, cos, sin)
    assert torch.equal(_t(o), _t(before)), f"seed {seed}: the copying rotation wrote o"
    assert _differ(y, ref) == 0, f"seed {seed}: the rotated copy differs from the oracle"
    launch.inverse_rope(o, pos, cos, sin, overwrite_o=True)
    assert _differ(o, ref) == 0, f"seed {seed}: the in-place rotation differs from the oracle"
