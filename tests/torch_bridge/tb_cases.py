"""Input builders shared by the torch_bridge tests: one set of bytes as numpy, torch and JAX."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

import woa_jax
from torch_bridge import interop


def np_to_torch(a: np.ndarray) -> torch.Tensor:
    """Same bytes as a torch tensor of its own (ml_dtypes types go through their raw bits)."""
    return interop.numpy_to_torch(np.array(a))


@dataclasses.dataclass
class RopeCase:
    o: np.ndarray
    positions: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    num_groups: int
    gs: int

    def torch(self):
        return tuple(np_to_torch(a) for a in (self.o, self.positions, self.cos, self.sin))

    def jax(self):
        return tuple(jnp.asarray(a) for a in (self.o, self.positions, self.cos, self.sin))


def rope_case(rng: np.random.Generator, *, s: int, h: int, dh: int, rd: int, num_groups: int,
              gs: int = 128, p: int = 64, act: str = "bfloat16", rope: str = "float32",
              pos_dtype=np.int64, scale: float = 0.1) -> RopeCase:
    o = (rng.standard_normal((s, h, dh)) * scale).astype(getattr(ml_dtypes, act, act))
    angles = rng.standard_normal((p, rd // 2)).astype(np.float32) * 3
    cos = np.cos(angles).astype(getattr(ml_dtypes, rope, rope))
    sin = np.sin(angles).astype(getattr(ml_dtypes, rope, rope))
    positions = rng.integers(0, p, size=s).astype(pos_dtype)
    return RopeCase(o, positions, cos, sin, num_groups, gs)


def gemm_operands(rng: np.random.Generator, *, m: int, g: int, n: int, k: int, block: int = 128,
                  fp8: str = "float8_e4m3fn"):
    """``(x, w, x_scale, w_scale)`` numpy: signed randn payloads, scales 2**randint(-4, 4)."""
    fdt = getattr(ml_dtypes, fp8)
    x = rng.standard_normal((m, g, k)).astype(np.float32).astype(fdt)
    w = rng.standard_normal((g, n, k)).astype(np.float32).astype(fdt)
    xs = (127 + rng.integers(-4, 5, size=(m, g, k // block))).astype(np.uint8)
    ws = (127 + rng.integers(-4, 5, size=(g, -(-n // block), k // block))).astype(np.uint8)
    return x, w, xs, ws


def wo_a_checkpoint(rng: np.random.Generator, *, g: int, n: int, k: int, block: int = 128,
                    fp8: str = "float8_e4m3fn"):
    """A checkpoint-style ``([G*N, K] fp8, [G*N/B, K/B] e8m0)`` pair, numpy."""
    fdt = getattr(ml_dtypes, fp8)
    w = (rng.standard_normal((g * n, k)) * 0.5).astype(np.float32).astype(fdt)
    sbytes = (120 + rng.integers(-3, 4, size=(-(-g * n // block), k // block))).astype(np.uint8)
    return w, sbytes.view(ml_dtypes.float8_e8m0fnu)


# One XLA computation per shape compiles much faster than op-by-op eager dispatch.
_oracle_quant = jax.jit(woa_jax.inverse_rope_group_quant, static_argnums=(4, 5),
                        static_argnames=("fp8_dtype", "amax_floor"))


def oracle_rope_quant(c: RopeCase, *, fp8=jnp.float8_e4m3fn, amax_floor=woa_jax.AITER_AMAX_FLOOR):
    return _oracle_quant(*c.jax(), c.num_groups, c.gs, fp8_dtype=fp8, amax_floor=amax_floor)
