"""The three faces of each op agree: ``woa_jax`` (the oracle), ``torch_bridge`` and
``torch_bridge.jax_ops`` take the same positional parameters, and the options they share have
the same names and defaults."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import woa_jax

torch = pytest.importorskip("torch")

import torch_bridge  # noqa: E402
from torch_bridge import jax_ops  # noqa: E402

OPS = ("inverse_rope_group_quant", "batched_gemm_a8w8_mxscale", "wo_a_fp8", "wo_a_bf16")
#: Options each face must have, where the op has them.
SHARED = {"inverse_rope_group_quant": ("fp8_dtype", "amax_floor"),
          "batched_gemm_a8w8_mxscale": ("dtype",),
          "wo_a_fp8": ("amax_floor", "dtype"),
          "wo_a_bf16": ()}


def _params(fn) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(inspect.unwrap(fn)).parameters)


def _positional(fn) -> list[tuple[str, object]]:
    return [(p.name, None if p.default is p.empty else _default_name(p.default))
            for p in _params(fn).values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _default_name(value) -> object:
    """A default compared across frameworks: a dtype by its name."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, type) or hasattr(value, "dtype"):
        return np.dtype(value).name
    return value


@pytest.mark.parametrize("op", OPS)
def test_the_three_faces_take_the_same_arguments(op):
    faces = {m.__name__: getattr(m, op) for m in (woa_jax, torch_bridge, jax_ops)}
    positional = {name: _positional(fn) for name, fn in faces.items()}
    assert len({tuple(p) for p in positional.values()}) == 1, positional
    for option in SHARED[op]:
        if any(option == n for n, _ in positional["woa_jax"]):
            continue  # compared with the positional parameters
        defaults = {name: _default_name(_params(fn)[option].default)
                    for name, fn in faces.items()}
        if option == "fp8_dtype":  # torch's None: x_fp8's dtype when given, else e4m3fn
            defaults = {n: "float8_e4m3fn" if d is None else d for n, d in defaults.items()}
        assert len(set(defaults.values())) == 1, (option, defaults)
    for name in ("torch_bridge", "torch_bridge.jax_ops"):
        params = _params(faces[name])
        named = {n for n, _ in positional[name]}
        assert all(p.kind is p.KEYWORD_ONLY for n, p in params.items() if n not in named), (
            name, op)
        if "backend" in params:
            assert params["backend"].default == "auto", (name, op)
