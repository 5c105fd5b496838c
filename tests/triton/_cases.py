"""Small inputs for the interpreter tests (CPU under ``TRITON_INTERPRET=1``, else the GPU)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from woa_jax.testing import assert_bitwise_equal, to_numpy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rope_case(rng, s=3, h=4, dh=512, rd=64, p=64, *, rope_dtype=torch.bfloat16,
              pos_dtype=torch.int64, o_dtype=torch.bfloat16):
    """``(o [S, H, Dh], positions [S], cos, sin [P, rd / 2])`` with random angles."""
    o = torch.from_numpy(rng.standard_normal((s, h, dh)).astype(np.float32) / 10).to(o_dtype)
    pos = torch.from_numpy(rng.integers(0, p, s)).to(pos_dtype)
    ang = rng.uniform(0, 6.3, (p, rd // 2)).astype(np.float32)
    cos = torch.from_numpy(np.cos(ang)).to(rope_dtype)
    sin = torch.from_numpy(np.sin(ang)).to(rope_dtype)
    return [t.to(DEVICE) for t in (o, pos, cos, sin)]


def gemm_case(rng, m, g, n, k, block=128):
    """``(x [M, G, K], w [G, N, K], x_scale, w_scale)``: e4m3fn operands, E8M0 byte scales."""
    x = rng.standard_normal((m, g, k)).astype(np.float32) * 30
    w = rng.standard_normal((g, n, k)).astype(np.float32) * 30
    xs = rng.integers(122, 131, (m, g, k // block)).astype(np.uint8)
    ws = rng.integers(112, 120, (g, -(-n // block), k // block)).astype(np.uint8)
    ts = (torch.from_numpy(x).to(torch.float8_e4m3fn), torch.from_numpy(w).to(torch.float8_e4m3fn),
          torch.from_numpy(xs), torch.from_numpy(ws))
    return [t.to(DEVICE) for t in ts]


def jx(*ts):
    """The tensors as JAX arrays (for the oracle)."""
    return [jnp.asarray(to_numpy(t)) for t in ts]


def assert_quant_equal(q, sc, rq, rs):
    assert_bitwise_equal(to_numpy(sc).view(np.uint8), np.asarray(rs).view(np.uint8),
                         name="scale bytes")
    assert_bitwise_equal(to_numpy(q).view(np.uint8), np.asarray(rq).view(np.uint8),
                         name="fp8 bytes")
