"""Activation scale layouts for torch tensors, through ``woa_jax``'s address tables.

Backends produce the logical row layout ``[S, G, Ks]``; the tiled layouts of AITER main
(``"mfma_tile"``, ``"n32k4"``) and the released ``"scale_shuffle"`` tile are a scatter through the
byte address of every logical element. The addresses are read out of ``woa_jax.from_scale_layout``
itself, so this module and the oracle share one definition. Padding bytes are filled with
``pad_value`` here and are undefined in AITER: never compare them.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

import woa_jax
from woa_jax import ScaleLayout, scale_shape
from woa_jax.checks import as_enum
from woa_jax.layouts import check_layout_buffer, check_row_scales


def _addresses(s: int, g: int, ks: int, layout: ScaleLayout, gs: int) -> np.ndarray:
    """``[S, G, Ks]`` int64: the flat byte address of each logical scale in a ``layout`` buffer.

    The oracle reads logical element ``i`` from buffer byte ``addr[i]``; reading a buffer whose
    bytes are one byte of their own address gives that byte of ``addr``, four bytes in four reads.
    """
    shape = scale_shape(s, g, ks, layout, gs)
    own = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    addr = np.zeros((s, g, ks), dtype=np.int64)
    for byte in range(4):
        plane = ((own >> (8 * byte)) & 0xFF).astype(np.uint8)
        read = woa_jax.from_scale_layout(plane, layout, s, g, ks, quant_group_size=gs)
        addr |= np.asarray(read).astype(np.int64) << (8 * byte)
    return addr


@functools.cache
def _index(s: int, g: int, ks: int, layout: ScaleLayout, gs: int,
           device: torch.device) -> torch.Tensor:
    """The address table on ``device``, built and copied once per shape: a per-call build and
    host-to-device copy would cost host time and break CUDA-graph capture. Tables are kept
    for the process (8 bytes per scale byte of each shape seen): a captured graph reads its
    table by address, so evicting one would let its memory be reused under the graph."""
    addr = _addresses(s, g, ks, layout, gs)
    return torch.from_numpy(addr).reshape(-1).to(device)


def to_scale_layout(x_scale: torch.Tensor, scale_layout: ScaleLayout | str, *,
                    quant_group_size: int = 128, pad_value: int = 0x7F,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Row-layout ``[S, G, Ks]`` scale bytes into a ``scale_layout`` buffer.

    Args:
      x_scale: ``[S, G, Ks]`` uint8 or float8_e8m0fnu.
      scale_layout: ``"row"``, ``"mfma_tile"``, ``"n32k4"`` or ``"scale_shuffle"``.
      quant_group_size: GS (the tiled layouts depend on it).
      pad_value: byte written to padding (0x7F = 1.0) when a new buffer is allocated.
      out: a preallocated buffer of ``scale_shape(...)`` to write into (padding left untouched).

    Returns:
      The buffer, ``woa_jax.scale_shape(S, G, Ks, scale_layout, GS)``, in ``x_scale``'s dtype.
    """
    layout = as_enum(ScaleLayout, scale_layout, "scale_layout")
    s, g, ks = check_row_scales(x_scale)
    if out is None:
        out = torch.full(scale_shape(s, g, ks, layout, quant_group_size), pad_value,
                         dtype=torch.uint8, device=x_scale.device).view(x_scale.dtype)
    else:
        check_layout_buffer(out, layout, s, g, ks, quant_group_size, "out")
    flat = out.view(torch.uint8).view(-1)
    flat[_index(s, g, ks, layout, quant_group_size, out.device)] = (
        x_scale.view(torch.uint8).reshape(-1))
    return out


def from_scale_layout(buffer: torch.Tensor, scale_layout: ScaleLayout | str, s: int,
                      num_groups: int, scale_groups: int, *,
                      quant_group_size: int = 128) -> torch.Tensor:
    """Read the logical ``[S, G, Ks]`` scale bytes out of a ``scale_layout`` buffer."""
    layout = as_enum(ScaleLayout, scale_layout, "scale_layout")
    check_layout_buffer(buffer, layout, s, num_groups, scale_groups, quant_group_size)
    idx = _index(s, num_groups, scale_groups, layout, quant_group_size, buffer.device)
    raw = buffer.contiguous().view(torch.uint8).reshape(-1)[idx]
    return raw.reshape(s, num_groups, scale_groups).view(buffer.dtype)
