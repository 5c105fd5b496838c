"""Inverse RoPE on the rope tail of each head (GPT-J interleaved pairs, rotation by -theta)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .checks import check_rope_inputs


def _no_contract(p):
    """``p`` itself, rounded to fp32 before any later add.

    Under ``jax.jit`` XLA's CPU compiler contracts ``x * y + z`` into an FMA (eager dispatch runs
    each op alone); a product that reaches the add through a select is not contracted, so jitted
    and eager results agree bit for bit. A NaN product becomes the canonical NaN.
    """
    return jnp.where(jnp.isnan(p), jnp.float32(jnp.nan), p)


def _rotate(o, positions, cos_cache, sin_cache, sign: int):
    """Rotate the last ``2 * cos.shape[1]`` lanes of every head of ``o``; fp32 ``[S, H, Dh]``.

    ``sign=-1`` is the inverse rotation (docs/NUMERICS.md section 2):
    ``a' = a c + b s``, ``b' = b c - a s`` with ``a, b`` lanes ``(2j, 2j+1)`` of the tail.
    The products and the sum are separate fp32 operations, eager and under ``jax.jit`` alike.
    """
    half = cos_cache.shape[1]
    rows = cos_cache.shape[0]
    positions = positions[: o.shape[0]]  # AITER accepts len(positions) >= S and reads the first S
    # AITER's kernel clamps out-of-range positions to [0, P-1]; the oracle does the same. Clamp
    # before narrowing to int32 so int64 positions >= 2**31 clamp instead of wrapping; numpy input
    # is clamped on the host because JAX (x64 off) truncates int64 to int32 on entry.
    if isinstance(positions, np.ndarray):
        positions = np.clip(positions, 0, rows - 1)
    pos = jnp.clip(positions, 0, rows - 1).astype(jnp.int32)
    c = cos_cache[pos].astype(jnp.float32)[:, None, :]  # [S, 1, half]
    s = sin_cache[pos].astype(jnp.float32)[:, None, :]
    x = o.astype(jnp.float32)
    nope, tail = x[..., : x.shape[-1] - 2 * half], x[..., x.shape[-1] - 2 * half :]
    a, b = tail[..., 0::2], tail[..., 1::2]
    ac, bs, bc, as_ = (_no_contract(p) for p in (a * c, b * s, b * c, a * s))
    if sign < 0:
        a2, b2 = ac + bs, bc - as_
    else:
        a2, b2 = ac - bs, bc + as_
    rot = jnp.stack([a2, b2], axis=-1).reshape(tail.shape)
    return jnp.concatenate([nope, rot], axis=-1)


def inverse_rope(o, positions, cos_cache, sin_cache, *, out_dtype=None):
    """Inverse GPT-J RoPE of the last ``2 * cos_cache.shape[1]`` lanes of each head.

    Args:
      o: ``[S, H, Dh]`` bf16/fp16/fp32 attention output in RoPE-rotated space.
      positions: ``[S]`` int32 or int64 token positions. Out-of-range values are clamped to
        ``[0, P - 1]`` as AITER's kernel does; callers should pass ``0 <= p < P``. (Under
        ``jax.jit`` without x64, JAX narrows int64 arguments to int32 before the clamp sees them.)
      cos_cache, sin_cache: ``[P, rd / 2]`` bf16 or fp32 tables (``rope_cos_sin``).
      out_dtype: dtype of the result; ``None`` keeps ``o.dtype`` (the BF16 path rounds the rotated
        lanes to bf16, RNE). Pass ``jnp.float32`` to keep the unrounded fp32 rotation.

    Returns:
      ``[S, H, Dh]``; lanes ``[0, Dh - rd)`` are ``o``'s values unchanged.

    Raises:
      ValueError, TypeError: a rank, shape or dtype does not fit (the message names which).

    Numerics: inputs are upcast to fp32, products and sums are separate fp32 operations. With bf16
    ``o`` and bf16 cos/sin every product is exact in fp32, so the result is independent of FMA
    contraction; with fp32 cos/sin an implementation that contracts ``a*c + b*s`` into an FMA can
    differ from this oracle by one fp32 ulp in a rotated lane.
    """
    check_rope_inputs(o, positions, cos_cache, sin_cache)
    out = _rotate(o, positions, cos_cache, sin_cache, sign=-1)
    return out.astype(o.dtype if out_dtype is None else out_dtype)


def forward_rope(o, positions, cos_cache, sin_cache, *, out_dtype=None):
    """The forward rotation (by +theta) that ``inverse_rope`` undoes; same arguments."""
    check_rope_inputs(o, positions, cos_cache, sin_cache)
    out = _rotate(o, positions, cos_cache, sin_cache, sign=+1)
    return out.astype(o.dtype if out_dtype is None else out_dtype)


def inverse_rope_float64(o, positions, cos_cache, sin_cache) -> np.ndarray:
    """Exact-math inverse RoPE in numpy float64 (the "truth" for error measurement)."""
    check_rope_inputs(o, positions, cos_cache, sin_cache)
    o = np.asarray(o, dtype=np.float64)
    cos = np.asarray(cos_cache, dtype=np.float64)
    sin = np.asarray(sin_cache, dtype=np.float64)
    half = cos.shape[1]
    pos = np.clip(np.asarray(positions)[: o.shape[0]].astype(np.int64), 0, cos.shape[0] - 1)
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    out = o.copy()
    tail = out[..., o.shape[-1] - 2 * half :]
    a, b = tail[..., 0::2].copy(), tail[..., 1::2].copy()
    tail[..., 0::2] = a * c + b * s
    tail[..., 1::2] = b * c - a * s
    return out
