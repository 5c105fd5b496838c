"""Activation scale layouts: row, AITER's mfma_tile / n32k4, released scale_shuffle.

Addresses follow AITER's scale layouts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from woa_jax import ScaleLayout, from_scale_layout, scale_shape, to_scale_layout


def _one_hot_address(s, g, ks, layout, gs, where) -> int:
    """Scatter a single non-zero byte at logical ``where``; return its flat buffer address."""
    x = np.zeros((s, g, ks), np.uint8)
    x[where] = 1
    buf = np.asarray(to_scale_layout(x, layout, quant_group_size=gs, pad_value=0)).ravel()
    (addr,) = np.flatnonzero(buf)
    return int(addr)


@pytest.mark.parametrize(
    ("layout", "gs", "s", "g", "ks", "shape"),
    [
        ("row", 128, 40, 2, 3, (40, 2, 3)),
        ("mfma_tile", 128, 40, 2, 3, (2, 64, 4)),
        ("mfma_tile", 32, 40, 2, 10, (2, 64, 16)),
        ("mfma_tile", 64, 1, 3, 8, (3, 32, 8)),
        ("scale_shuffle", 128, 40, 2, 3, (2, 64, 8)),
        ("n32k4", 32, 40, 2, 8, (2, 2, 256)),
        ("n32k4", 32, 0, 2, 8, (0, 2, 256)),
    ],
)
def test_scale_shape(layout, gs, s, g, ks, shape):
    assert scale_shape(s, g, ks, layout, gs) == shape


# Addresses worked out by hand from AITER's layout formulas.
@pytest.mark.parametrize(
    ("layout", "gs", "dims", "where", "addr"),
    [
        # [G, 64, 4]: g*256 + (s//32)*4*32 + (k//2)*64 + (s%16)*4 + (k%2)*2 + (s//16)%2
        ("mfma_tile", 128, (40, 2, 3), (17, 1, 2), 256 + 64 + 4 + 1),
        ("mfma_tile", 128, (40, 2, 3), (39, 0, 1), 128 + 28 + 2),
        ("mfma_tile", 128, (40, 2, 3), (0, 0, 0), 0),
        # [G, 64, 16]: g*1024 + ((s//32)*2 + k//8)*256 + ((k%4)*16 + s%16)*4 + (s//16)%2
        #              + ((k//4)%2)*2
        ("mfma_tile", 32, (40, 2, 10), (33, 1, 9), 1024 + 3 * 256 + 17 * 4),
        ("mfma_tile", 32, (40, 2, 10), (18, 0, 5), 18 * 4 + 1 + 2),
        ("scale_shuffle", 128, (40, 2, 10), (33, 1, 9), 1024 + 3 * 256 + 17 * 4),
        ("scale_shuffle", 32, (40, 2, 10), (18, 0, 5), 18 * 4 + 1 + 2),
        # [2, G, 256]: ((s//32)*G + g)*Ks*32 + (k//4)*128 + (s%32)*4 + k%4
        ("n32k4", 32, (40, 2, 8), (37, 1, 6), 3 * 256 + 128 + 20 + 2),
        ("n32k4", 32, (40, 2, 8), (3, 0, 4), 128 + 12),
        # row: (s*G + g)*Ks + k
        ("row", 128, (40, 2, 3), (17, 1, 2), (17 * 2 + 1) * 3 + 2),
    ],
)
def test_documented_byte_addresses(layout, gs, dims, where, addr):
    assert _one_hot_address(*dims, layout, gs, where) == addr


CASES = [
    ("row", 128), ("mfma_tile", 128), ("mfma_tile", 32), ("mfma_tile", 64),
    ("scale_shuffle", 128), ("scale_shuffle", 32), ("n32k4", 32),
]


@pytest.mark.parametrize(("layout", "gs"), CASES, ids=[f"{c[0]}-gs{c[1]}" for c in CASES])
@pytest.mark.parametrize("s", [0, 17, 70])
def test_round_trip_and_padding(layout, gs, s):
    g, ks = 2, (8 if layout == "n32k4" else 5)
    rng = np.random.default_rng(s)
    x = rng.integers(0, 256, (s, g, ks), dtype=np.uint8)
    buf = to_scale_layout(x, layout, quant_group_size=gs, pad_value=0xAB)
    assert buf.shape == scale_shape(s, g, ks, layout, gs) and buf.dtype == jnp.uint8
    back = from_scale_layout(buf, layout, s, g, ks, quant_group_size=gs)
    np.testing.assert_array_equal(np.asarray(back), x)
    # Every byte is either one logical element or padding.
    raw = np.asarray(buf).ravel()
    assert raw.size - s * g * ks == int((raw == 0xAB).sum()) - int((x == 0xAB).sum())
    # Buffer -> logical -> buffer reproduces every logical byte.
    again = np.asarray(to_scale_layout(back, layout, quant_group_size=gs, pad_value=0xAB))
    np.testing.assert_array_equal(again, np.asarray(buf))


def test_e8m0_dtype_is_kept_and_default_padding_is_one():
    x = jnp.asarray(np.full((3, 1, 2), 120, np.uint8)).view(jnp.float8_e8m0fnu)
    buf = to_scale_layout(x, ScaleLayout.MFMA_TILE)
    assert buf.dtype == jnp.float8_e8m0fnu and buf.shape == (1, 32, 2)
    raw = np.asarray(buf).view(np.uint8).ravel()
    assert int((raw == 120).sum()) == 6 and int((raw == 0x7F).sum()) == raw.size - 6
    back = from_scale_layout(buf, "mfma_tile", 3, 1, 2)
    assert back.dtype == jnp.float8_e8m0fnu
    np.testing.assert_array_equal(np.asarray(back).view(np.uint8), np.asarray(x).view(np.uint8))


def test_layouts_under_jit():
    x = np.random.default_rng(0).integers(0, 256, (37, 3, 8), dtype=np.uint8)
    to = jax.jit(to_scale_layout, static_argnums=(1,),
                 static_argnames=("quant_group_size", "pad_value"))
    frm = jax.jit(from_scale_layout, static_argnums=(1, 2, 3, 4),
                  static_argnames=("quant_group_size",))
    for layout, gs in CASES:
        buf = to(x, layout, quant_group_size=gs)
        np.testing.assert_array_equal(np.asarray(buf),
                                      np.asarray(to_scale_layout(x, layout, quant_group_size=gs)))
        np.testing.assert_array_equal(np.asarray(frm(buf, layout, 37, 3, 8, quant_group_size=gs)),
                                      x)


def test_layout_errors():
    x = np.zeros((4, 2, 6), np.uint8)
    with pytest.raises(ValueError, match="n32k4 layout needs quant_group_size 32 and Ks % 4 == 0, "
                                         "got quant_group_size=128, Ks=8"):
        scale_shape(4, 2, 8, "n32k4", 128)
    with pytest.raises(ValueError, match="got quant_group_size=32, Ks=6"):
        to_scale_layout(x, "n32k4", quant_group_size=32)
    with pytest.raises(ValueError, match="scale_layout must be one of 'row', 'mfma_tile', 'n32k4', "
                                         "'scale_shuffle', got 'mfma'"):
        to_scale_layout(x, "mfma")
    with pytest.raises(ValueError, match=r"x_scale must be 3-D \[S, G, Ks\], got shape \(2, 6\)"):
        to_scale_layout(x[0], "row")
    with pytest.raises(ValueError, match=r"a mfma_tile scale buffer for S=4, G=2, Ks=6 has shape "
                                         r"\(2, 32, 6\), got \(2, 32, 8\)"):
        from_scale_layout(np.zeros((2, 32, 8), np.uint8), "mfma_tile", 4, 2, 6)
    with pytest.raises(TypeError, match="x_scale must have dtype uint8 or float8_e8m0fnu, got "
                                        "float32"):
        to_scale_layout(x.astype(np.float32), "row")
    with pytest.raises(TypeError, match="buffer must have dtype uint8 or float8_e8m0fnu"):
        from_scale_layout(x.astype(np.float32), "row", 4, 2, 6)
