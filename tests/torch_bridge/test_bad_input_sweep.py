"""Property-based sweep of bad input through every public entry point.

Each entry point starts from a valid call; hypothesis applies one or two mutations (a wrong shape,
dtype, stride, device, type or value, each with the exception type ``torch_bridge`` documents for
it) and the call must raise one of the mutations' types, never return and never fail deeper with
another exception.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from inputs import np_to_torch, rope_case, wo_a_checkpoint

import torch_bridge as tb
import woa_jax
from torch_bridge import TPOutputProjection, WoAProjection, WoBProjection

Unavailable = tb.BackendUnavailableError
G, H, DH, RD, N = 2, 2, 128, 64, 128  # K = H * DH / G = 128
K = H * DH // G
TINY = dataclasses.replace(woa_jax.DSV4_CONFIGS["v4-flash"], name="sweep-tiny", hidden_size=128,
                           num_heads=H, o_groups=G, head_dim=DH, rope_dim=RD, o_lora_rank=N)


def _base() -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    c = rope_case(rng, s=3, h=H, dh=DH, rd=RD, num_groups=G, gs=128, p=16)
    o, pos, cos, sin = c.torch()
    w, sc = (np_to_torch(a) for a in wo_a_checkpoint(rng, g=G, n=N, k=K))
    wb = np_to_torch((rng.standard_normal((128, G * N)) * 0.5).astype(np.float32).astype(
        ml_dtypes.float8_e4m3fn))
    sb = torch.full((1, G * N // 128), 120, dtype=torch.uint8)
    x = torch.randn(3, G, K).to(torch.float8_e4m3fn)
    xs = torch.full((3, G, 1), 127, dtype=torch.uint8)
    return dict(o=o, positions=pos, cos_cache=cos, sin_cache=sin, weight=w, weight_scale=sc,
                wo_b_weight=wb, wo_b_scale=sb, x=x, w=w.view(G, N, K), x_scale=xs,
                w_scale=sc.view(G, 1, 1), z=torch.randn(3, G * N, dtype=torch.bfloat16))


BASE = _base()


def _noncontiguous(t: torch.Tensor) -> torch.Tensor:
    """Same shape and values, last-dim stride 2."""
    wide = torch.empty((*t.shape, 2), dtype=t.dtype)
    wide[..., 0] = t
    return wide[..., 0]


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _set_byte(t: torch.Tensor, index: tuple[int, ...], byte: int) -> torch.Tensor:
    out = t.clone()
    out.view(torch.uint8)[index] = byte
    return out


def _nan_scale(t: torch.Tensor) -> torch.Tensor:
    f = torch.exp2(t.view(torch.uint8).float() - 127)
    f.view(-1)[0] = float("nan")
    return f


#: Mutations: name -> (argument, function of (value, draw) -> bad value, documented type).
Mutation = tuple[str, Callable, type]


def _tensor_mutations(arg: str, *, dtypes: tuple[torch.dtype, ...], contiguous: bool,
                      optional: bool = False) -> list:
    """Type, dtype, device, rank (and stride) mutations of a tensor argument (``None`` is a
    ``ValueError`` for an argument that may be ``None`` for another kind of call)."""
    not_tensors = [3, [1, 2], "tensor"] + ([] if optional else [None])
    muts = [
        (arg, lambda v, d: d(st.sampled_from(not_tensors)), TypeError),
        (arg, lambda v, d: v.float().numpy(), TypeError),
        (arg, lambda v, d: v.to(d(st.sampled_from(dtypes))), TypeError),
        (arg, lambda v, d: _meta(v), ValueError),
        (arg, lambda v, d: v.reshape(-1) if v.dim() > 1 else v.reshape(1, -1), ValueError),
        (arg, lambda v, d: v.unsqueeze(d(st.integers(0, v.dim()))), ValueError),
    ]
    if contiguous:
        muts.append((arg, lambda v, d: _noncontiguous(v), ValueError))
    if optional:
        muts.append((arg, lambda v, d: None, ValueError))
    return muts


def _number_mutations(arg: str, bad: list, wrong_types: list) -> list:
    """Bad values (``ValueError``) and values of the wrong type (``TypeError``)."""
    return [(arg, lambda v, d: d(st.sampled_from(bad)), ValueError),
            (arg, lambda v, d: d(st.sampled_from(wrong_types)), TypeError)]


BAD_FLOORS = [float("nan"), 0.0, -1.0, float("inf")]
WRONG_FLOORS = ["1e-8", None, True, [1e-8]]
ROPE = (
    _tensor_mutations("o", dtypes=(torch.int32, torch.uint8, torch.float64, torch.bool),
                      contiguous=True)
    + _tensor_mutations("positions", dtypes=(torch.float32, torch.int16, torch.uint8),
                        contiguous=False)
    + _tensor_mutations("cos_cache", dtypes=(torch.int32, torch.float64), contiguous=False)
    + [("positions", lambda v, d: v[:d(st.integers(0, 2))], ValueError),
       ("sin_cache", lambda v, d: v[:, :d(st.integers(1, RD // 2 - 1))], ValueError),
       ("cos_cache", lambda v, d: torch.cat([v, v[:, :1 + d(st.integers(0, 40))]], 1),
        ValueError),
       ("o", lambda v, d: v[:, :1], ValueError)]
)
GROUPS = _number_mutations("num_groups", [0, -1, 3], [2.5, 2.0, "2", None, True])
FLOOR = _number_mutations("amax_floor", BAD_FLOORS, WRONG_FLOORS)
BACKEND = [("backend", lambda v, d: d(st.sampled_from(["nope", "cuda", ""])), ValueError),
           ("backend", lambda v, d: d(st.sampled_from([3, 1.5])), TypeError)]

WEIGHT = (
    _tensor_mutations("weight", dtypes=(torch.int8, torch.uint8, torch.float8_e5m2),
                      contiguous=False)
    + _tensor_mutations("weight_scale", dtypes=(torch.int32, torch.int8), contiguous=False,
                        optional=True)
    + [("weight", lambda v, d: _set_byte(v, (d(st.integers(0, G * N - 1)), 0), 0x7F),
        ValueError),
       ("weight_scale", lambda v, d: _set_byte(v, (0, 0), 0xFF), ValueError),
       ("weight_scale", lambda v, d: _nan_scale(v), ValueError),
       ("weight_scale", lambda v, d: -torch.exp2(v.view(torch.uint8).float() - 127),
        ValueError),
       ("weight_scale", lambda v, d: v[:, :0], ValueError)]
)
QUANT_OPTIONS = [
    ("quant_group_size", lambda v, d: d(st.sampled_from([0, 96, 256])), ValueError),
    ("quant_group_size", lambda v, d: d(st.sampled_from(["128", 128.0, None])), TypeError),
    ("scale_layout", lambda v, d: d(st.sampled_from(["bogus", "scale_shuffle"])), ValueError),
    ("scale_layout", lambda v, d: d(st.sampled_from([0, None])), TypeError),
    ("fp8_dtype", lambda v, d: d(st.sampled_from([torch.bfloat16, torch.float8_e5m2])),
     TypeError),
    ("x_fp8", lambda v, d: torch.empty((3, G, K + 1), dtype=torch.float8_e4m3fn), ValueError),
    ("x_fp8", lambda v, d: torch.empty((3, G, K), dtype=torch.bfloat16), TypeError),
    ("x_scale", lambda v, d: torch.empty((3, G, 1), dtype=torch.float32), TypeError),
    ("x_scale", lambda v, d: torch.empty((3, G, 2), dtype=torch.uint8), ValueError),
]
GEMM = (
    _tensor_mutations("x", dtypes=(torch.bfloat16, torch.int8, torch.float8_e5m2),
                      contiguous=False)
    + _tensor_mutations("w_scale", dtypes=(torch.int32, torch.int8), contiguous=False)
    + [("w", lambda v, d: v[:, :, :64], ValueError),
       ("w", lambda v, d: v.view(torch.float8_e4m3fnuz), TypeError),
       ("x_scale", lambda v, d: v[:, :1], ValueError),
       ("x_scale", lambda v, d: torch.full(v.shape, 3.0), ValueError),
       ("w_scale", lambda v, d: _nan_scale(v), ValueError),
       ("dtype", lambda v, d: d(st.sampled_from([torch.float16, "bf16", None])), TypeError),
       ("out", lambda v, d: torch.empty((3, G, N + 1), dtype=torch.bfloat16), ValueError),
       ("backend", lambda v, d: "bf16", Unavailable)]
    + BACKEND
)
CALL = (
    _tensor_mutations("o", dtypes=(torch.int32, torch.float64), contiguous=True)
    + _tensor_mutations("positions", dtypes=(torch.float32, torch.int16), contiguous=False)
    + [("o", lambda v, d: v[:, :1], ValueError),
       ("positions", lambda v, d: v[:d(st.integers(0, 2))], ValueError)]
)
WO_B = (
    _tensor_mutations("wo_b_weight", dtypes=(torch.int8, torch.uint8), contiguous=False)
    + [("wo_b_weight", lambda v, d: _set_byte(v, (5, 7), 0xFF), ValueError),
       ("wo_b_scale", lambda v, d: v[:, :1], ValueError),
       ("wo_b_scale", lambda v, d: None, ValueError),
       ("wo_b_scale", lambda v, d: _nan_scale(v), ValueError)]
    + FLOOR
)
Z = (
    _tensor_mutations("z", dtypes=(torch.int32, torch.float64), contiguous=False)
    + [("z", lambda v, d: v[:, :K], ValueError),
       ("path", lambda v, d: "fp16", ValueError),
       ("path", lambda v, d: d(st.sampled_from([3, None])), TypeError),
       ("dtype", lambda v, d: d(st.sampled_from([torch.float16, None])), TypeError),
       ("backend", lambda v, d: "bf16", Unavailable)]
)
_PROJ = WoAProjection(BASE["weight"], BASE["weight_scale"], G, BASE["cos_cache"],
                      BASE["sin_cache"], backend="torch")
_WO_B = WoBProjection(BASE["wo_b_weight"], BASE["wo_b_scale"])


def _quant(a):
    return tb.inverse_rope_group_quant(
        a["o"], a["positions"], a["cos_cache"], a["sin_cache"], a["num_groups"],
        a["quant_group_size"], scale_layout=a["scale_layout"], backend=a["backend"],
        x_fp8=a["x_fp8"], x_scale=a["x_scale"], fp8_dtype=a["fp8_dtype"],
        amax_floor=a["amax_floor"])


def _chain(fn):
    def call(a):
        kw = {"amax_floor": a["amax_floor"]} if fn is tb.wo_a_fp8 else {}
        return fn(a["o"], a["positions"], a["cos_cache"], a["sin_cache"], a["weight"],
                  a["weight_scale"], a["num_groups"], **kw)
    return call


def _tp(a):
    proj = TPOutputProjection.from_tensors(a["weight"], a["weight_scale"], a["wo_b_weight"],
                                           a["wo_b_scale"], a["config"], a["cos_cache"],
                                           a["sin_cache"], tp_size=a["tp_size"],
                                           amax_floor=a["amax_floor"], backend="torch")
    return proj(a["o"], a["positions"])


ROPE_DEFAULTS = dict(num_groups=G, quant_group_size=128, scale_layout="row", backend="torch",
                     x_fp8=None, x_scale=None, fp8_dtype=None, amax_floor=1e-8)
ENTRY_POINTS: dict[str, tuple[Callable, dict, list]] = {
    "inverse_rope_group_quant": (_quant, ROPE_DEFAULTS,
                                 ROPE + GROUPS + FLOOR + BACKEND + QUANT_OPTIONS),
    "batched_gemm_a8w8_mxscale": (
        lambda a: tb.batched_gemm_a8w8_mxscale(a["x"], a["w"], a["x_scale"], a["w_scale"],
                                               a["dtype"], backend=a["backend"], out=a["out"]),
        dict(dtype=torch.bfloat16, backend="torch", out=None), GEMM),
    "wo_a_fp8": (_chain(tb.wo_a_fp8), dict(num_groups=G, amax_floor=1e-8),
                 ROPE + GROUPS + FLOOR + WEIGHT),
    "wo_a_bf16": (_chain(tb.wo_a_bf16), dict(num_groups=G), ROPE + GROUPS + WEIGHT),
    "WoAProjection": (
        lambda a: WoAProjection(a["weight"], a["weight_scale"], a["num_groups"], a["cos_cache"],
                                a["sin_cache"], backend=a["backend"],
                                amax_floor=a["amax_floor"])(a["o"], a["positions"]),
        dict(num_groups=G, backend="torch", amax_floor=1e-8),
        WEIGHT + GROUPS + FLOOR + BACKEND + CALL
        + [("cos_cache", lambda v, d: v[:, :16], ValueError),
           ("backend", lambda v, d: "aiter", Unavailable)]),
    "WoAProjection.__call__": (lambda a: _PROJ(a["o"], a["positions"]), {}, CALL),
    "TPOutputProjection": (
        _tp, dict(config=TINY, tp_size=None, amax_floor=1e-8),
        CALL + FLOOR
        + [("weight", lambda v, d: v[:128], ValueError),
           ("wo_b_weight", lambda v, d: v[:, :128], ValueError),
           ("weight_scale", lambda v, d: _nan_scale(v), ValueError),
           ("config", lambda v, d: "v9-nope", ValueError),
           ("wo_b_weight", lambda v, d: d(st.sampled_from([None, 3, v.float().numpy()])),
            TypeError),
           ("cos_cache", lambda v, d: d(st.sampled_from([None, v.numpy()])), TypeError),
           ("wo_b_scale", lambda v, d: v[:, :1], ValueError),
           ("tp_size", lambda v, d: d(st.sampled_from([2, 3])), ValueError)]),
    "WoBProjection": (
        lambda a: WoBProjection(a["wo_b_weight"], a["wo_b_scale"],
                                amax_floor=a["amax_floor"])(a["z"]),
        dict(amax_floor=1e-8), WO_B),
    "WoBProjection.__call__": (
        lambda a: _WO_B(a["z"], path=a["path"], backend=a["backend"], dtype=a["dtype"]),
        dict(path="fp8", backend="torch", dtype=torch.float32), Z),
    "to_jax": (lambda a: tb.to_jax(a["t"]), dict(t=torch.zeros(2)),
               [("t", lambda v, d: d(st.sampled_from([None, 3, [1.0], v.numpy()])),
                 TypeError)]),
    "to_torch": (lambda a: tb.to_torch(a["t"]), dict(t=torch.zeros(2)),
                 [("t", lambda v, d: d(st.sampled_from([None, 3, [1.0], v.numpy()])),
                   TypeError)]),
}


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
def test_valid_base_calls_run(name):
    """The sweep's starting points are valid calls (so each failure is the mutation's)."""
    call, defaults, _ = ENTRY_POINTS[name]
    call({**BASE, **defaults})


@pytest.mark.parametrize("name", list(ENTRY_POINTS))
@settings(max_examples=40, deadline=None, derandomize=True)
@given(data=st.data())
def test_bad_input_raises_the_documented_error(name, data):
    call, defaults, mutations = ENTRY_POINTS[name]
    args = {**BASE, **defaults}
    picked = data.draw(st.lists(st.sampled_from(mutations), min_size=1, max_size=2,
                                unique_by=lambda m: m[0]), label="mutations")
    for arg, mutate, _ in picked:
        args[arg] = mutate(args[arg], data.draw)
    expected = tuple({kind for _, _, kind in picked})
    with pytest.raises(expected):
        call(args)
        pytest.fail(f"{name} returned for {[m[0] for m in picked]}")
