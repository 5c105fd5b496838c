"""Activation scale layouts: the logical ``[S, G, Ks]`` row layout and AITER's tiled layouts.

Each tiled layout (AITER's ``scale_layout=`` tiles and its released ``scale_shuffle=True`` tile)
is described by one function, the byte address of logical element (s, g, k); both directions are
a gather/scatter through it, so they are exact inverses over the logical extent by construction.
Padding bytes are undefined in AITER: never compare them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ._spec import ScaleLayout, as_enum
from .checks import _SCALE_BYTES, check_dtype


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def scale_shape(s: int, num_groups: int, scale_groups: int,
                scale_layout: ScaleLayout | str = ScaleLayout.ROW,
                quant_group_size: int = 128) -> tuple[int, ...]:
    """Buffer shape of ``x_scale`` for ``S`` tokens, G groups and ``Ks`` scale columns.

    Mirrors AITER main's ``scale_shape``; ``"scale_shuffle"`` is the released ``scale_shuffle=True``
    tile.
    """
    layout = as_enum(ScaleLayout, scale_layout, "scale_layout")
    g, ks = num_groups, scale_groups
    if layout is ScaleLayout.ROW:
        return (s, g, ks)
    if layout is ScaleLayout.MFMA_TILE:
        return (g, _ceil(s, 32), _ceil(ks, 2 if quant_group_size == 128 else 8))
    if layout is ScaleLayout.SCALE_SHUFFLE:
        return (g, _ceil(s, 32), _ceil(ks, 8))
    if quant_group_size != 32 or ks % 4 != 0:
        raise ValueError(
            f"the n32k4 layout needs quant_group_size 32 and Ks % 4 == 0, got "
            f"quant_group_size={quant_group_size}, Ks={ks}"
        )
    return (_ceil(s, 32) // 32, g, ks * 32)


@functools.lru_cache(maxsize=64)
def _addresses(s: int, g: int, ks: int, layout: ScaleLayout, gs: int) -> np.ndarray:
    """Flat byte address of every logical (s, g, k), as an ``[S, G, Ks]`` int array."""
    shape = scale_shape(s, g, ks, layout, gs)
    si, gi, ki = np.meshgrid(np.arange(s), np.arange(g), np.arange(ks), indexing="ij")
    if layout is ScaleLayout.ROW:
        return (si * g + gi) * ks + ki
    if layout is ScaleLayout.N32K4:
        return (((si // 32) * g + gi) * ks * 32 + (ki // 4) * 128 + (si % 32) * 4 + ki % 4)
    s_pad, ks_pad = shape[1], shape[2]
    base = gi * s_pad * ks_pad
    if layout is ScaleLayout.MFMA_TILE and gs == 128:
        return (base + (si // 32) * ks_pad * 32 + (ki // 2) * 64 + (si % 16) * 4
                + (ki % 2) * 2 + (si // 16) % 2)
    return (base + ((si // 32) * (ks_pad // 8) + ki // 8) * 256
            + ((ki % 4) * 16 + si % 16) * 4 + (si // 16) % 2 + ((ki // 4) % 2) * 2)


def check_row_scales(x_scale) -> tuple[int, int, int]:
    """``(S, G, Ks)`` of row-layout scale bytes (any array with ``shape``/``dtype``, torch too)."""
    if len(x_scale.shape) != 3:
        raise ValueError(f"x_scale must be 3-D [S, G, Ks], got shape {tuple(x_scale.shape)}")
    check_dtype(x_scale, _SCALE_BYTES, "x_scale")
    return tuple(int(d) for d in x_scale.shape)


def check_layout_buffer(buffer, layout: ScaleLayout, s: int, g: int, ks: int, gs: int,
                         name: str = "buffer") -> None:
    """A ``layout`` buffer for ``[S, G, Ks]`` scales: ``scale_shape``'s shape, E8M0 bytes."""
    shape = scale_shape(s, g, ks, layout, gs)
    if tuple(buffer.shape) != shape:
        raise ValueError(f"{name}: a {layout.value} scale buffer for S={s}, G={g}, Ks={ks} has "
                         f"shape {shape}, got {tuple(buffer.shape)}")
    check_dtype(buffer, _SCALE_BYTES, name)


def to_scale_layout(x_scale, scale_layout: ScaleLayout | str, *, quant_group_size: int = 128,
                    pad_value: int = 0x7F):
    """Row-layout ``[S, G, Ks]`` scales into ``scale_layout``'s buffer (padding = ``pad_value``)."""
    layout = as_enum(ScaleLayout, scale_layout, "scale_layout")
    s, g, ks = check_row_scales(x_scale)
    shape = scale_shape(s, g, ks, layout, quant_group_size)
    addr = _addresses(s, g, ks, layout, quant_group_size)
    dtype = x_scale.dtype
    raw = jax.lax.bitcast_convert_type(jnp.asarray(x_scale), jnp.uint8)
    buf = jnp.full(int(np.prod(shape)), pad_value, jnp.uint8).at[addr.ravel()].set(raw.ravel())
    return jax.lax.bitcast_convert_type(buf.reshape(shape), dtype)


def from_scale_layout(buffer, scale_layout: ScaleLayout | str, s: int, num_groups: int,
                      scale_groups: int, *, quant_group_size: int = 128):
    """Read the logical ``[S, G, Ks]`` scales back out of a ``scale_layout`` buffer."""
    layout = as_enum(ScaleLayout, scale_layout, "scale_layout")
    check_layout_buffer(buffer, layout, s, num_groups, scale_groups, quant_group_size)
    addr = _addresses(s, num_groups, scale_groups, layout, quant_group_size)
    dtype = buffer.dtype
    raw = jax.lax.bitcast_convert_type(jnp.asarray(buffer), jnp.uint8).ravel()
    return jax.lax.bitcast_convert_type(raw[addr], dtype)
