"""``--jax-step``: L layers of ``wo_a`` in one jitted step, timed per layer against a CUDA graph
of the same layers in torch.

A JAX model jits its whole step; each of its L layers calls ``jax_ops.wo_a_fp8`` with its own
weight, packed with its scales as one ``jax_ops.FP8Weight`` (one argument a layer, as XLA's
BF16 step's weight). Rows (kind ``jax_step``), ``us`` per layer:

* ``jax_step_native``: the native route (our XLA FFI custom call).
* ``jax_step_callback``: the callback route (``WOA_JAX_NATIVE=0``), recorded in XLA command
  buffers unless ``WOA_JAX_COMMAND_BUFFER=0`` is set.
* ``jax_step_xla_bf16``: what a JAX user writes without this library: ``woa_jax.inverse_rope``
  and a bf16 ``einsum`` on weights dequantized once, outside the step.
* ``jax_step_torch_graph``: the same L ``WoAProjection`` calls on the same values, captured in
  one CUDA graph (eager, by wall clock, on CPU).

The step is laid out as a model's: one rope table for every layer, each layer its own weight,
and each layer after the one before it. It makes its inputs, ``o = base_o * s`` and
``positions = base + shift``, from two device scalars that change every step, so each step's
data is new while its buffers stay put (the torch step does the same two ops). Layer ``l``
reads that ``o`` tied to layer ``l - 1``'s output by an optimization barrier (``_after``): as in
a model, whose next layer reads what the last one wrote, the layers run in turn, never side by
side in XLA's command buffers, and no two calls have the same operands for XLA to merge. The
step returns the last layer's output and a sum of one element of every layer's output taken
behind an optimization barrier, so XLA can neither drop a layer nor compute less of it.

JAX rows: wall time of back-to-back steps (host dispatch included, one wait at the end) over
the steps' layers, after one untimed repetition; on GPU ``host_us`` is the host's time to
dispatch one step with the device idle, over its layers: where it nears ``us`` the step is
host-bound, and its time then follows the host's. Torch row: ``timing.time_cuda`` of the
step, over its layers. ``vs_graph`` is a row's time over the torch graph's (GPU only).
Checks: the FP8 steps' last layer equals the torch layer's output bytes (where the layer
launches other kernels, as when it splits K, the torch launcher running the route's kernels
instead, and the row says so), the BF16 step is within the ``gemm_bf16`` tolerance of the
oracle, the graph's output equals the eager layer's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time

from . import problem, timing
from .problem import Skip

ROUTES = ("native", "callback", "xla_bf16", "torch_graph")
#: Target wall time of one repetition of back-to-back JAX steps, and its bounds in steps.
STEP_FILL_S = 0.03
MIN_STEPS, MAX_STEPS = 3, 50
#: Step-argument sets the back-to-back loop goes round: (scale of o, shift of positions).
VARIANTS = ((1.0, 0), (2.0, 1), (0.5, 2), (1.0, 3))


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Layers per step, groups and token counts of the scenario."""

    layers: tuple[int, ...]
    groups: tuple[int, ...]
    ms: tuple[int, ...]


#: DeepSeek V4-Pro has 61 layers; G = 2 is TP8, G = 16 TP1; decode to an 8K prefill chunk.
GPU = StepConfig(layers=(8, 61), groups=(2, 8, 16), ms=(1, 16, 64, 256, 1024, 8192))
#: Under the Triton interpreter: the harness's CPU shapes, two layers.
CPU = StepConfig(layers=(2,), groups=(2,), ms=(1,))


def provider(route: str) -> str:
    return f"jax_step_{route}"


@contextlib.contextmanager
def _env(**values: str):
    """Environment switches read at trace time (``jax_ops`` picks its route then)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def route_env(route: str) -> dict[str, str]:
    """The switches a route's step is traced under (recorded in the row's ``config``)."""
    if route == "native":
        return {"WOA_JAX_NATIVE": os.environ.get("WOA_JAX_NATIVE") or "1"}
    if route == "callback":
        return {"WOA_JAX_NATIVE": "0",
                "WOA_JAX_COMMAND_BUFFER": os.environ.get("WOA_JAX_COMMAND_BUFFER") or "1"}
    return {}


# ----------------------------------------------------------------------------------------------
# The layers and the step's inputs
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Layers:
    """Per layer: the weight, its tables (the same rope table in each) and the torch layer."""

    problems: list  # problem.Problem of one token, for its weight and tables
    torch_layers: list


def make_layers(sweep: problem.Sweep, g: int, count: int, device: str, seed: int,
                bf16: bool) -> Layers:
    """``count`` layers of ``g`` groups; ``bf16``: keep the dequantized weights for XLA's step."""
    from torch_bridge import WoAProjection

    probs, layers = [], []
    for i in range(count):
        p = problem.make_problem(sweep, g, 1, device, seed + 1000 + i)
        p.o = p.o_work = p.x = p.xs = None  # only the weight and tables are kept
        if not bf16:
            p.w_bf16 = p.cos32 = p.sin32 = None
        probs.append(p)
        layers.append(WoAProjection(p.w.flatten(0, 1), p.ws.flatten(0, 1), g, p.cos_bf16,
                                    p.sin_bf16))
    return Layers(probs, layers)


def check_problem(layer: problem.Problem, inputs: problem.Problem) -> problem.Problem:
    """The oracle's problem for ``layer``'s weight and tables on ``inputs``' ``o`` and positions."""
    return dataclasses.replace(layer, o=inputs.o, pos=inputs.pos, x=None, xs=None, o_work=None,
                               cache={})


# ----------------------------------------------------------------------------------------------
# The steps
# ----------------------------------------------------------------------------------------------

def _outputs(ys):
    """``(last layer's output, keep)``: ``keep`` reads one element of every layer's output
    behind a barrier, so no layer is dropped, merged or computed in part."""
    import jax
    import jax.numpy as jnp

    ys = jax.lax.optimization_barrier(tuple(ys))
    keep = sum(y.reshape(-1)[0].astype(jnp.float32) for y in ys)
    return ys[-1], keep


def _after(o, ys: list):
    """``o`` once the latest layer's output exists (``o`` itself for the first layer)."""
    import jax

    return jax.lax.optimization_barrier((o, ys[-1]))[0] if ys else o


def fp8_step(g: int, backend):
    """The FP8 step on ``jax_ops.wo_a_fp8``; ``params`` are ``((cos, sin), weights)``: the
    rope tables, then each layer's weight, a ``jax_ops.FP8Weight`` (``fp8_weights``) or a
    ``(w, ws)`` pair."""
    from torch_bridge import jax_ops

    def step(params, base_o, base_pos, scale, shift):
        (cos, sin), weights = params
        o = base_o * scale
        pos = base_pos + shift
        ys = []
        for weight in weights:
            w, ws = (weight, None) if isinstance(weight, jax_ops.FP8Weight) else weight
            ys.append(jax_ops.wo_a_fp8(_after(o, ys), pos, cos, sin, w, ws, g, backend=backend))
        return _outputs(ys)

    return step


def fp8_weights(probs: list, g: int) -> tuple:
    """Each layer's weight as the step takes it: one ``jax_ops.FP8Weight`` (one argument a
    layer, as XLA's BF16 step has)."""
    from torch_bridge import interop, jax_ops

    return tuple(jax_ops.pack_weight(interop.to_jax(p.w), interop.to_jax(p.ws), g)
                 for p in probs)


def bf16_step(g: int):
    """XLA's BF16 step; ``params`` are ``((cos32, sin32), (w_bf16 [G, N, K], ...))``."""
    import jax.numpy as jnp

    import woa_jax

    def step(params, base_o, base_pos, scale, shift):
        (cos, sin), weights = params
        o = base_o * scale
        pos = base_pos + shift
        m = o.shape[0]
        ys = []
        for w in weights:
            x = woa_jax.inverse_rope(_after(o, ys), pos, cos, sin, out_dtype=jnp.bfloat16)
            ys.append(jnp.einsum("sgk,gnk->sgn", x.reshape(m, g, -1), w))
        return _outputs(ys)

    return step


def _variants():
    import jax.numpy as jnp

    return [(jnp.asarray(s, jnp.bfloat16), jnp.asarray(d, jnp.int32)) for s, d in VARIANTS]


def time_jax_step(f, params, base, *, layers: int, reps: int, on_gpu: bool) -> list[float]:
    """Microseconds per layer of back-to-back calls of the jitted step ``f`` over ``VARIANTS``
    (one wait at the end of each repetition); on GPU enough steps for ``STEP_FILL_S``. One
    untimed repetition goes first, so that no cost of the first run that far ahead of the
    device counts."""
    import jax

    variants = _variants()
    out = None
    for v in variants:
        out = f(params, *base, *v)
    jax.block_until_ready(out)
    steps = 1
    if on_gpu:
        t0 = time.perf_counter()
        jax.block_until_ready(f(params, *base, *variants[0]))
        one = time.perf_counter() - t0
        steps = max(MIN_STEPS, min(MAX_STEPS, math.ceil(STEP_FILL_S / max(one, 1e-9))))

    def run_steps():
        out = None
        for i in range(steps):
            out = f(params, *base, *variants[i % len(variants)])  # earlier outputs dropped
        jax.block_until_ready(out)

    run_steps()  # untimed
    times = []
    for _ in range(reps if on_gpu else min(reps, 3)):
        t0 = time.perf_counter()
        run_steps()
        times.append((time.perf_counter() - t0) * 1e6 / (steps * layers))
    return times


#: Single steps whose dispatch ``step_host_us`` times.
HOST_CALLS = 10


def step_host_us(f, params, base, *, layers: int, calls: int = HOST_CALLS) -> float:
    """The host's microseconds per layer to dispatch one step of ``f`` with the device idle
    (the median of ``calls`` steps over ``VARIANTS``, each after the last one's wait): the
    host's share of a step, with no wait on the device in it."""
    import jax

    variants = _variants()
    out = f(params, *base, *variants[0])
    times = []
    for i in range(calls):
        jax.block_until_ready(out)
        t0 = time.perf_counter()
        out = f(params, *base, *variants[i % len(variants)])
        times.append((time.perf_counter() - t0) * 1e6 / layers)
    jax.block_until_ready(out)
    return timing.median(times)


def torch_step(layers: list, base_o, base_pos):
    """The torch step: the same input ops, then every layer; ``(step, last)`` where ``last[0]``
    is the last layer's output of the latest call (or graph replay)."""
    import torch

    o, pos = torch.empty_like(base_o), torch.empty_like(base_pos)
    scale = torch.ones((), dtype=base_o.dtype, device=base_o.device)
    shift = torch.zeros((), dtype=base_pos.dtype, device=base_pos.device)
    last: list = [None]

    def step():
        torch.mul(base_o, scale, out=o)
        torch.add(base_pos, shift, out=pos)
        ys = [layer(o, pos) for layer in layers]
        last[0] = ys[-1]
        return torch.stack([y.view(-1)[:1] for y in ys]).float().sum()

    return step, last


# ----------------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------------

def _route_kernels(route: str, m: int, g: int, n: int, k: int, block: int, dh: int, rd: int,
                   on_gpu: bool) -> tuple[bool, object]:
    """``(fused, gemm config)`` of the launches a route makes (``None``: the launcher's own).
    Both routes run what torch runs, K split included; the native GEMM takes the pointer
    kernel where torch's takes the TMA one (the same tile, unsplit)."""
    from torch_bridge.backends.triton import configs, jax_launch

    if jax_launch.wo_a_fp8_fits(m, g, n, k, block, dh, rd):
        return True, None
    if route == "callback":  # the torch launcher's own chain
        return False, None
    cfg = configs.gemm_config(m, g, n, k, block, wgmma=on_gpu and jax_launch.wgmma_ok())
    return False, dataclasses.replace(cfg, tma=False)  # jax_launch.gemm_call's


def _layer_differs(m: int, g: int, n: int, k: int, block: int, dh: int, rd: int,
                   on_gpu: bool) -> str:
    """How the torch layer's launches differ from a route's (for the check's message)."""
    from torch_bridge.backends.triton import configs, gemm

    wgmma = on_gpu and gemm.wgmma_available(None)[0]
    if configs.gemm_config(m, g, n, k, block, wgmma=wgmma).tma:
        return "the layer's GEMM runs the TMA kernel"
    return "the layer's launches differ"


def check_fp8(y, route: str, ref_layer, p: problem.Problem, on_gpu: bool) -> str:
    """``y``, the step's last layer, against the torch layer's bytes (``ref_layer``), else
    against the torch launcher running the route's kernels; always within the oracle's
    tolerance. ``AssertionError`` when neither matches."""
    from torch_bridge.backends.triton import launch
    from woa_jax.testing import assert_bitwise_equal

    close = problem.check_close(y, p, "chain_fp8")
    try:
        assert_bitwise_equal(y, ref_layer, name="last layer vs torch layer")
        return f"bytes exact vs torch layer; {close}"
    except AssertionError:
        pass
    m, h, dh = p.o.shape
    g, n, k = p.w.shape
    block = k // p.ws.shape[2]
    rd = 2 * p.cos_bf16.shape[1]
    fused, cfg = _route_kernels(route, m, g, n, k, block, dh, rd, on_gpu)
    want = launch.wo_a_fp8(p.o, p.pos, p.cos_bf16, p.sin_bf16, p.w, p.ws, g, single_kernel=fused,
                           config=cfg)
    assert_bitwise_equal(y, want, name=f"last layer vs torch launch of the {route} route's "
                                       "kernels")
    why = _layer_differs(m, g, n, k, block, dh, rd, on_gpu)
    return f"bytes exact vs torch launch of the same kernels ({why}); {close}"


# ----------------------------------------------------------------------------------------------
# The scenario
# ----------------------------------------------------------------------------------------------

def add_ratios(rows: list[dict]) -> None:
    """``vs_graph``: each timed row's time over the torch graph's of the same (L, G, M)."""
    graph = {(layers_of(r), r["G"], r["M"]): r["us"] for r in rows
             if r["provider"] == provider("torch_graph") and r.get("us")}
    for r in rows:
        base = graph.get((layers_of(r), r.get("G"), r.get("M")))
        if base and r.get("us") and r["provider"] != provider("torch_graph"):
            r["vs_graph"] = r["us"] / base


def layers_of(row: dict) -> int | None:
    """L of a row: its ``config``'s ``layers`` (a dict, or the JSON read from a CSV)."""
    cfg = row.get("config")
    if isinstance(cfg, str):
        cfg = json.loads(cfg)
    return (cfg or {}).get("layers")


def _config(route: str, layers: int, extra: dict | None = None) -> dict:
    """A row's ``config``: L, the route's switches, and for JAX's routes ``XLA_FLAGS`` and a
    non-default device allocator (``XLA_PYTHON_CLIENT_ALLOCATOR``), which both move step
    times."""
    out = {"layers": layers, **route_env(route), **(extra or {})}
    if route != "torch_graph":
        out["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
        if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR"):
            out["XLA_PYTHON_CLIENT_ALLOCATOR"] = os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"]
    return out


def _row(route: str, layers: int, g: int, m: int, sweep: problem.Sweep) -> dict:
    return {"mode": "jax_step", "kind": "jax_step", "provider": provider(route), "G": g,
            "M": m, "N": sweep.n, "K": sweep.k, "sets": 1, "config": _config(route, layers)}


def _jax_route(route: str, g: int, lay: Layers, count: int, inputs, ref_layer, on_gpu: bool,
               reps: int):
    """Check and time one JAX route; ``(row fields, check)``."""
    import jax
    import jax.numpy as jnp
    import torch

    from torch_bridge import interop, jax_ops

    backend = None if on_gpu else "triton"
    if route == "native":
        reason = jax_ops.native_route_reason("triton")
        if reason is not None:
            raise Skip(f"no native route here: {reason}")
    probs = lay.problems[:count]
    first = probs[0]  # every layer's tables hold the same rope table
    if route == "xla_bf16":
        params = ((interop.to_jax(first.cos32), interop.to_jax(first.sin32)),
                  tuple(interop.to_jax(p.w_bf16) for p in probs))
        step = bf16_step(g)
    else:
        params = ((interop.to_jax(first.cos_bf16), interop.to_jax(first.sin_bf16)),
                  fp8_weights(probs, g))
        step = fp8_step(g, backend)
    base = (interop.to_jax(inputs.o), interop.to_jax(inputs.pos.to(torch.int32)))
    f = jax.jit(step)
    # The route is chosen while tracing: a retrace must see the same switches.
    with _env(**route_env(route)):
        y, _ = f(params, *base, jnp.asarray(1.0, jnp.bfloat16), jnp.asarray(0, jnp.int32))
        p = check_problem(probs[-1], inputs)
        if route == "xla_bf16":
            msg = problem.check_close(y, p, "chain_bf16")
        else:
            msg = check_fp8(y, route, ref_layer, p, on_gpu)
        del y
        times = time_jax_step(f, params, base, layers=count, reps=reps, on_gpu=on_gpu)
        fields = {"timer": "jit", "clock": None, "us": timing.median(times), "times_us": times}
        if on_gpu:
            fields["host_us"] = step_host_us(f, params, base, layers=count)
    return fields, msg


def _torch_route(lay: Layers, count: int, inputs, ref_layer, on_gpu: bool, reps: int):
    """Check and time the torch step (a CUDA graph on GPU); ``(row fields, check)``."""
    import torch

    from woa_jax.testing import assert_bitwise_equal

    step, last = torch_step(lay.torch_layers[:count], inputs.o, inputs.pos.to(torch.int32))
    if on_gpu:
        times = [t / count for t in timing.time_cuda([step], reps=reps)]
        torch.cuda.synchronize()
        fields = {"timer": "graph", "clock": "burst"}
    else:
        times = [t / count for t in timing.time_wall(step, reps=min(reps, 3))]
        fields = {"timer": "wall", "clock": None}
    y = last[0]
    assert_bitwise_equal(y, ref_layer, name="torch step's last layer vs the eager layer")
    msg = problem.check_close(y, check_problem(lay.problems[count - 1], inputs), "chain_fp8")
    what = "graph" if on_gpu else "step"
    return {**fields, "us": timing.median(times), "times_us": times}, \
        f"bytes exact {what} vs eager layer; {msg}"


def run_jax_step(sweep: problem.Sweep, cfg: StepConfig, routes: tuple[str, ...], *,
                 on_gpu: bool, reps: int, seed: int, progress, on_rows=None) -> list[dict]:
    """Rows of every route at every (G, L, M); ``on_rows(new)`` after each (G, L, M)."""
    import jax
    import torch

    device = "cuda" if on_gpu else "cpu"
    rows = []
    todo = len(cfg.groups) * len(cfg.layers) * len(cfg.ms) * len(routes)
    task = progress.add_task("jax step", total=todo)
    for g in cfg.groups:
        progress.update(task, description=f"jax step G={g}: drawing {max(cfg.layers)} layers")
        lay = make_layers(sweep, g, max(cfg.layers), device, seed, bf16="xla_bf16" in routes)
        for m in cfg.ms:
            inputs = problem.make_problem(sweep, g, m, device, seed)
            inputs.w = inputs.ws = inputs.w_bf16 = inputs.x = inputs.xs = inputs.o_work = None
            for count in cfg.layers:
                ref_layer = lay.torch_layers[count - 1](inputs.o, inputs.pos)  # eager
                new = []
                for route in routes:
                    progress.update(task, description=f"jax step G={g} L={count} M={m} {route}")
                    row = _row(route, count, g, m, sweep)
                    try:
                        if route == "torch_graph":
                            fields, msg = _torch_route(lay, count, inputs, ref_layer, on_gpu,
                                                       reps)
                            row["config"]["backend"] = lay.torch_layers[count - 1].path
                        else:
                            fields, msg = _jax_route(route, g, lay, count, inputs, ref_layer,
                                                     on_gpu, reps)
                        row.update(fields, check=msg)
                    except Skip as e:
                        row.update(us=None, check=f"skipped: {e}")
                    except AssertionError as e:
                        row.update(us=None, check=f"FAILED: {e}")
                    except Exception as e:  # keep going; the row records the error
                        row.update(us=None,
                                   check=f"FAILED: {type(e).__name__}: {str(e)[:300]}")
                    new.append(row)
                    progress.advance(task)
                    if on_gpu:
                        torch.cuda.empty_cache()
                if on_gpu:
                    add_ratios(new)
                rows += new
                if on_rows is not None:
                    on_rows(new)
                del ref_layer
            del inputs
        del lay
        jax.clear_caches()  # this G's executables are not run again
        if on_gpu:
            torch.cuda.empty_cache()
    return rows
