"""Call plans: the first call with a signature validates and plans, later ones only launch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from inputs import gemm_operands, np_to_torch, rope_case, wo_a_checkpoint

import torch_bridge as tb
from torch_bridge import _dispatch
from woa_jax import AITER_AMAX_FLOOR, checks


@pytest.fixture
def counted(monkeypatch):
    """Counts the validations of rope inputs and GEMM operands."""
    calls = {"rope": 0, "gemm": 0}
    rope, gemm = checks.check_rope_inputs, checks.check_gemm_inputs

    def count_rope(*a):
        calls["rope"] += 1
        return rope(*a)

    def count_gemm(*a):
        calls["gemm"] += 1
        return gemm(*a)

    monkeypatch.setattr(checks, "check_rope_inputs", count_rope)
    monkeypatch.setattr(checks, "check_gemm_inputs", count_gemm)
    return calls


def test_ops_validate_once_per_signature(counted, monkeypatch):
    c = rope_case(np.random.default_rng(0), s=4, h=2, dh=128, rd=64, num_groups=2, gs=64)
    args = c.torch()
    first = tb.inverse_rope_group_quant(*args, 2, 64, backend="torch")
    for _ in range(3):
        again = tb.inverse_rope_group_quant(*args, 2, 64, backend="torch")
    assert counted["rope"] == 1
    assert torch.equal(again[0].view(torch.uint8), first[0].view(torch.uint8))
    tb.inverse_rope_group_quant(args[0][:2], *args[1:], 2, 64, backend="torch")  # new S
    assert counted["rope"] == 2
    monkeypatch.setenv("WOA_BACKEND", "aiter")  # the env var is part of an auto signature
    with pytest.raises(tb.BackendUnavailableError, match="backend 'aiter'"):
        tb.inverse_rope_group_quant(*args, 2, 64)
    x, w, xs, ws = (np_to_torch(a) for a in gemm_operands(np.random.default_rng(0), m=3, g=2,
                                                           n=128, k=256))
    for _ in range(3):
        tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="torch")
    assert counted["gemm"] == 1


def test_errors_are_the_same_on_every_call():
    c = rope_case(np.random.default_rng(0), s=4, h=2, dh=128, rd=64, num_groups=2, gs=64)
    o, pos, cos, sin = c.torch()
    for _ in range(2):
        with pytest.raises(ValueError, match="fewer than S=4"):
            tb.inverse_rope_group_quant(o, pos[:2], cos, sin, 2, 64, backend="torch")
        with pytest.raises(TypeError, match="o must be a torch tensor or a JAX array"):
            tb.inverse_rope_group_quant(o.float().numpy(), pos, cos, sin, 2, 64)


def test_projection_plans_once_per_signature(counted, triton_off):
    rng = np.random.default_rng(1)
    c = rope_case(rng, s=5, h=4, dh=128, rd=64, num_groups=2, gs=128)
    w, sc = wo_a_checkpoint(rng, g=2, n=256, k=256)
    proj = tb.WoAProjection(np_to_torch(w), np_to_torch(sc), 2, *c.torch()[2:])
    o, pos = c.torch()[:2]
    ys = [proj(o, pos) for _ in range(3)]
    assert counted["rope"] == 1 and proj.path == "bf16"
    assert all(torch.equal(y, ys[0]) for y in ys)
    proj(o[:1], pos)
    assert counted["rope"] == 2
    with pytest.raises(ValueError, match="must be contiguous"):
        proj(o.transpose(0, 1).contiguous().transpose(0, 1), pos)


def test_a_cached_plan_does_not_pass_an_option_its_checks_reject():
    c = rope_case(np.random.default_rng(0), s=4, h=2, dh=128, rd=64, num_groups=2, gs=64)
    args = c.torch()
    tb.inverse_rope_group_quant(*args, 2, 64, backend="torch", amax_floor=1)
    with pytest.raises(TypeError, match="num_groups must be an integer, got float 2.0"):
        tb.inverse_rope_group_quant(*args, 2.0, 64, backend="torch", amax_floor=1)
    with pytest.raises(TypeError, match="amax_floor"):
        tb.inverse_rope_group_quant(*args, 2, 64, backend="torch", amax_floor=True)


def test_projection_follows_woa_backend_and_reset(triton_off, monkeypatch):
    rng = np.random.default_rng(1)
    c = rope_case(rng, s=5, h=4, dh=128, rd=64, num_groups=2, gs=128)
    w, sc = wo_a_checkpoint(rng, g=2, n=256, k=256)
    proj = tb.WoAProjection(np_to_torch(w), np_to_torch(sc), 2, *c.torch()[2:])
    o, pos = c.torch()[:2]
    proj(o, pos)
    assert proj.path == "bf16"
    monkeypatch.setenv("WOA_BACKEND", "torch")
    proj(o, pos)
    assert proj.path == "torch"
    assert proj._plans
    tb._dispatch.reset_caches()
    assert not proj._plans and not proj._paths


def test_a_bound_eager_launcher_serves_repeats_of_its_signature_only(monkeypatch):
    """After a signature's first call the op asks its backend once for a direct launcher
    (none from the torch backend); a bound launcher then serves plain repeats, a refusal
    (``None``) falls through to the op's path, and calls with output buffers are signatures
    of their own, whose launcher is given the buffers."""
    from torch_bridge import ops
    from torch_bridge.backends import torch_ref

    c = rope_case(np.random.default_rng(0), s=4, h=2, dh=128, rd=64, num_groups=2, gs=64)
    args = c.torch()
    ops._PLANS.clear()
    asked = []
    monkeypatch.setattr(torch_ref.BACKEND, "eager_ops", frozenset({"inverse_rope_group_quant"}))
    monkeypatch.setattr(torch_ref.BACKEND, "eager_launcher",
                        lambda op, *a: asked.append(op) or None, raising=False)
    want = tb.inverse_rope_group_quant(*args, 2, 64, backend="torch")
    tb.inverse_rope_group_quant(*args, 2, 64, backend="torch")
    assert asked == ["inverse_rope_group_quant"] and _asked() == {next(iter(ops._PLANS)): False}
    (key,) = ops._PLANS
    marker = (torch.zeros(1), torch.zeros(1, dtype=torch.float8_e8m0fnu))
    _bind(key, lambda *a: marker)
    assert tb.inverse_rope_group_quant(*args, 2, 64, backend="torch") == marker
    _bind(key, lambda *a: None)  # refused: the op's own path
    q, sc = tb.inverse_rope_group_quant(*args, 2, 64, backend="torch")
    assert torch.equal(q.view(torch.uint8), want[0].view(torch.uint8))
    scale = torch.empty_like(want[1])
    out = tb.inverse_rope_group_quant(*args, 2, 64, backend="torch", x_scale=scale)
    assert torch.equal(out[0].view(torch.uint8), want[0].view(torch.uint8)) and out[1] is scale
    assert asked == ["inverse_rope_group_quant"] * 2 and len(_asked()) == 2
    (given,) = [k for k in _asked() if k != key]
    _bind(given, lambda *a: a[4:])
    assert tb.inverse_rope_group_quant(*args, 2, 64, backend="torch", x_scale=scale) == (
        None, scale)
    _dispatch.reset_caches()
    assert ops._PLANS == {}


def _asked() -> dict:
    """Plan key -> the direct launcher kept in its plan, for the signatures whose backend was
    asked for one (``False``: it had none)."""
    from torch_bridge import ops

    return {k: p.eager for k, p in ops._PLANS.items() if p.eager is not None}


def _bind(key: tuple, launcher) -> None:
    from torch_bridge import ops

    ops._PLANS[key] = ops._PLANS[key]._replace(eager=launcher)


def test_the_layer_keeps_one_eager_launcher_per_signature(monkeypatch):
    """``WoAProjection``: the BF16 chain asks once per signature (never for ``overwrite_o``
    calls), uses what it got on plain repeats, and forgets it on ``reset_caches``."""
    from torch_bridge.backends import bf16

    rng = np.random.default_rng(1)
    c = rope_case(rng, s=3, h=4, dh=128, rd=64, num_groups=2, gs=128)
    w, sc = wo_a_checkpoint(rng, g=2, n=128, k=256)
    o, pos, cos, sin = c.torch()
    layer = tb.WoAProjection(np_to_torch(w), np_to_torch(sc), 2, cos, sin, backend="bf16")
    asked = []
    monkeypatch.setattr(bf16.BACKEND, "eager_launcher", lambda op, *a: asked.append(op) or None)
    layer(o.clone(), pos, overwrite_o=True)
    assert asked == []
    want = layer(o, pos)
    layer(o, pos)
    assert asked == ["wo_a_bf16"]
    (key,) = layer._plans
    assert layer._plans[key].eager is False  # asked once, nothing bound
    layer._plans[key] = layer._plans[key]._replace(eager=lambda o, p: "bound")
    assert layer(o, pos) == "bound"
    assert torch.equal(layer(o.clone(), pos, overwrite_o=True), layer(o.clone(), pos,
                                                                      overwrite_o=True))
    _dispatch.reset_caches()
    assert layer._plans == {}
    assert torch.equal(layer(o, pos), want)


def test_the_gemm_op_binds_a_direct_launcher_for_byte_scales(monkeypatch):
    """After a signature's first call the GEMM op asks its backend once for a direct launcher
    (calls with ``out`` are signatures of their own, whose launcher is given ``out``); calls
    with float scales (converted and checked on every call) never use one, a refusal
    (``None``) falls through to the op's path, and ``reset_caches`` forgets it."""
    from torch_bridge import ops
    from torch_bridge.backends import torch_ref

    x, w, xs, ws = (np_to_torch(a) for a in gemm_operands(np.random.default_rng(0), m=3, g=2,
                                                           n=128, k=256))
    asked = []
    monkeypatch.setattr(torch_ref.BACKEND, "eager_ops", frozenset({"batched_gemm_a8w8_mxscale"}))
    monkeypatch.setattr(torch_ref.BACKEND, "eager_launcher",
                        lambda op, *a: asked.append((op, a)) or None, raising=False)
    want = tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="torch")
    tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="torch")
    assert [op for op, _ in asked] == ["batched_gemm_a8w8_mxscale"]
    assert asked[0][1][:4] == (x, w, xs, ws) and asked[0][1][4:] == (torch.bfloat16, None)
    out = torch.empty_like(want)
    tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="torch", out=out)
    assert len(asked) == 2 and asked[1][1][5] is out
    floats = torch_ref.e8m0_decode(xs)
    for _ in range(2):
        assert torch.equal(tb.batched_gemm_a8w8_mxscale(x, w, floats, ws, backend="torch"), want)
    assert len(asked) == 2
    key = ops.gemm_key(x, w, xs, ws, torch.bfloat16, "torch", None)
    assert set(_asked()) == {key, ops.gemm_key(x, w, xs, ws, torch.bfloat16, "torch", out)}
    marker = torch.zeros(1)
    _bind(key, lambda *a: marker)
    assert tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="torch") is marker
    assert ops.bound_launcher(key)(x, w, xs, ws) is marker
    _bind(key, lambda *a: None)  # refused: the op's own path
    assert torch.equal(tb.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend="torch"), want)
    _dispatch.reset_caches()
    assert ops._PLANS == {}


def test_wo_a_fp8_runs_the_ops_direct_launchers_and_still_checks_its_arguments(monkeypatch):
    """On a backend without a chain of its own the function form runs the two ops, so repeats
    take each op's direct launcher (here stand-ins); the GEMM's refusal after the quant ran is
    finished by the GEMM op; bad arguments raise on every call."""
    from torch_bridge.backends import torch_ref

    rng = np.random.default_rng(2)
    c = rope_case(rng, s=3, h=4, dh=128, rd=64, num_groups=2, gs=128)
    w, sc = (np_to_torch(a) for a in wo_a_checkpoint(rng, g=2, n=128, k=256))
    o, pos, cos, sin = c.torch()
    launched = []

    def launcher(op, *a):
        def run(*args):
            launched.append(op)
            if op == "inverse_rope_group_quant":  # scales as float8_e8m0fnu, as the op's
                q, scale = torch_ref.BACKEND.inverse_rope_group_quant(*args[:4], 2, 128)
                return q, scale.view(torch.float8_e8m0fnu)
            x, w, xs, ws, _ = args
            return None if gemm_refuses else torch_ref.BACKEND.batched_gemm_a8w8_mxscale(
                x, w, xs.view(torch.uint8), ws.view(torch.uint8))
        return run

    monkeypatch.setattr(torch_ref.BACKEND, "eager_ops",
                        frozenset({"inverse_rope_group_quant", "batched_gemm_a8w8_mxscale"}))
    monkeypatch.setattr(torch_ref.BACKEND, "eager_launcher", launcher, raising=False)
    gemm_refuses = False
    want = tb.wo_a_fp8(o, pos, cos, sin, w, sc, 2, backend="torch")
    assert launched == []
    assert torch.equal(tb.wo_a_fp8(o, pos, cos, sin, w, sc, 2, backend="torch"), want)
    assert launched == ["inverse_rope_group_quant", "batched_gemm_a8w8_mxscale"]
    gemm_refuses = True
    assert torch.equal(tb.wo_a_fp8(o, pos, cos, sin, w, sc, 2, backend="torch"), want)
    assert launched[2:] == ["inverse_rope_group_quant", "batched_gemm_a8w8_mxscale"]
    with pytest.raises(TypeError, match="num_groups must be an integer, got float 2.0"):
        tb.wo_a_fp8(o, pos, cos, sin, w, sc, 2.0, backend="torch")
    with pytest.raises(ValueError, match="fewer than S=3"):
        tb.wo_a_fp8(o, pos[:2], cos, sin, w, sc, 2, backend="torch")
    with pytest.raises(TypeError, match="backend must be"):
        tb.wo_a_fp8(o, pos, cos, sin, w, sc, 2, backend=["torch"])


def test_wo_a_fp8_runs_the_chain_of_the_backend_that_takes_both_ops(monkeypatch):
    """Where one backend takes both ops and has a chain of its own (triton: fused at decode),
    the function form runs that chain, as ``WoAProjection`` does, and keeps the chain's direct
    launcher for repeats (a refusal goes back to the chain); a signature is planned once, and
    another signature or a backend the GEMM does not share gets its own plan."""
    from torch_bridge import projection
    from torch_bridge.backends import torch_ref

    rng = np.random.default_rng(3)
    c = rope_case(rng, s=3, h=4, dh=128, rd=64, num_groups=2, gs=128)
    w, sc = (np_to_torch(a) for a in wo_a_checkpoint(rng, g=2, n=128, k=256))
    o, pos, cos, sin = c.torch()
    want = tb.wo_a_fp8(o, pos, cos, sin, w, sc, 2, backend="torch")
    _dispatch.reset_caches()  # the plan above was made for the backend without a chain
    be = torch_ref.BACKEND
    ran = []

    def chain(o, positions, cos_cache, sin_cache, w, ws, g, *, amax_floor, dtype):
        ran.append("chain")
        x, xs = be.inverse_rope_group_quant(o, positions, cos_cache, sin_cache, g, 128,
                                            amax_floor=amax_floor)
        return be.batched_gemm_a8w8_mxscale(x, w, xs, ws, dtype=dtype)

    def launcher(op, o, positions, cos_cache, sin_cache, w, ws, g, amax_floor):
        assert op == "wo_a_fp8" and amax_floor == AITER_AMAX_FLOOR
        return lambda o, positions: ran.append("bound") or (None if refuse else want)

    monkeypatch.setattr(be, "ops", be.ops | {"wo_a_fp8"})
    monkeypatch.setattr(be, "eager_ops", frozenset({"wo_a_fp8"}))
    monkeypatch.setattr(be, "wo_a_fp8", chain, raising=False)
    monkeypatch.setattr(be, "eager_launcher", launcher, raising=False)
    refuse = False
    for _ in range(2):
        assert torch.equal(tb.wo_a_fp8(o, pos, cos, sin, w, sc, 2, backend="torch"), want)
    assert ran == ["chain", "bound"]
    refuse = True
    assert torch.equal(tb.wo_a_fp8(o, pos, cos, sin, w, sc, 2, backend="torch"), want)
    assert ran[2:] == ["bound", "chain"]
    (proj,) = [p for p in projection._PREPARED.values() if p._weight2d is w]
    assert [p.backend for p in proj._plans.values()] == [be]
    tb.wo_a_fp8(o[:2], pos, cos, sin, w, sc, 2, backend="torch")
    assert len(proj._plans) == 2
    with pytest.raises(ValueError, match="fewer than S=3"):
        tb.wo_a_fp8(o, pos[:2], cos, sin, w, sc, 2, backend="torch")
