"""JAX providers: ``torch_bridge.jax_ops`` under ``jax.jit``, timed two ways.

``us``: wall clock per call of ``BACK_TO_BACK_CALLS`` back-to-back calls of one jitted function
(cycling over the input sets, no wait in between, one wait at the end): what a JAX user's step
loop pays, host included. Enough calls that the first call's dispatch and the final wait, which
a steady loop hides, weigh little.
``device_us`` (GPU): time per call inside one jitted program, an unrolled loop of
``LOOP_CALLS + 1`` calls less a loop of one (best of 5 each), less the same measurement of
the loop around its input change alone. Each trip changes an input by a zero XLA cannot see
through, so no call is hoisted, and feeds one output element to the next. It is the kernels'
time plus the gaps XLA leaves between the loop's launches, which the kernels do not hide at
decode sizes (a CUDA-graph replay of the torch calls has no such gaps).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from .problem import Skip, check_close

LOOP_CALLS = 20
BACK_TO_BACK_CALLS = 20


@dataclasses.dataclass
class JaxTimed:
    """A jitted ``step(args, bump)`` and its per-set arguments."""

    step: Callable
    args: list
    bump_only: Callable

    def back_to_back_us(self, reps: int, calls: int = BACK_TO_BACK_CALLS) -> list[float]:
        """Wall microseconds per call, ``calls`` calls per repetition over the sets in turn."""
        import jax
        import jax.numpy as jnp

        f = jax.jit(self.step)
        zero = jnp.int32(0)
        order = [self.args[i % len(self.args)] for i in range(max(calls, len(self.args)))]
        jax.block_until_ready([f(a, zero) for a in self.args])
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            r = [f(a, zero) for a in order]
            jax.block_until_ready(r)
            out.append((time.perf_counter() - t0) * 1e6 / len(order))
        return out

    def device_us(self) -> float | None:
        """Device microseconds per call inside one jitted program (see the module doc); ``None``
        when the difference of the two loops is not positive (other work on the GPU or host
        outweighed the calls: no figure rather than a wrong one)."""
        us = _loop_us(self.step, self.args[0]) - _loop_us(self.bump_only, self.args[0])
        return us if us > 0 else None


def _loop_us(fn, args) -> float:
    import jax
    import jax.numpy as jnp

    def loop(a, count):
        def body(i, acc):
            y = fn(a, (acc > jnp.float32(3e38)).astype(jnp.int32))
            return acc + y.reshape(-1)[0].astype(jnp.float32)
        # Unrolled: a rolled loop waits on the host each trip where a callback route runs.
        return jax.lax.fori_loop(0, count, body, jnp.float32(0), unroll=True)

    f = jax.jit(loop, static_argnums=1)
    best = {}
    for count in (1, LOOP_CALLS + 1):
        f(args, count).block_until_ready()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            f(args, count).block_until_ready()
            times.append(time.perf_counter() - t0)
        best[count] = min(times)
    return (best[LOOP_CALLS + 1] - best[1]) / LOOP_CALLS * 1e6


def _jax(p, fields):
    from torch_bridge import interop

    return tuple(interop.to_jax(getattr(p, f)) for f in fields)


def _barrier_first(x):
    import jax

    return jax.lax.optimization_barrier(x).reshape(-1)[:1]


def gemm_jax(sets, on_gpu):
    import jax
    import jax.numpy as jnp

    from torch_bridge import jax_ops

    backend = None if on_gpu else "triton"

    def bumped_scale(a, bump):
        u8 = jax.lax.bitcast_convert_type(a[2], jnp.uint8) + bump.astype(jnp.uint8)
        return jax.lax.bitcast_convert_type(u8, a[2].dtype)

    def step(a, bump):
        x, w, _, ws = a
        return jax_ops.batched_gemm_a8w8_mxscale(x, w, bumped_scale(a, bump), ws, backend=backend)

    args = [_jax(p, ("x", "w", "xs", "ws")) for p in sets]
    msg = check_close(jax.jit(step)(args[0], jnp.int32(0)), sets[0], "gemm")
    return JaxTimed(step, args, lambda a, bump: _barrier_first(bumped_scale(a, bump))), msg


def chain_fp8_jax(sets, on_gpu, *, command_buffer=False):
    import jax
    import jax.numpy as jnp

    from torch_bridge import jax_ops

    backend = None if on_gpu else "triton"

    def bumped_positions(a, bump):
        return a[1] + bump.astype(a[1].dtype)

    def step(a, bump):
        o, _, cos, sin, w, ws = a
        return jax_ops.wo_a_fp8(o, bumped_positions(a, bump), cos, sin, w, ws, sets[0].g,
                                backend=backend, command_buffer=command_buffer)

    args = [_jax(p, ("o", "pos", "cos_bf16", "sin_bf16", "w", "ws")) for p in sets]
    one = jax.jit(step)
    msg = check_close(one(args[0], jnp.int32(0)), sets[0], "chain_fp8")
    if len(args) > 1:  # a second input set through the same executable (command-buffer replay)
        msg += f"; set 2 {check_close(one(args[1], jnp.int32(0)), sets[1], 'chain_fp8')}"
    return JaxTimed(step, args, lambda a, bump: _barrier_first(bumped_positions(a, bump))), msg


def chain_fp8_jax_cb(sets, on_gpu):
    from torch_bridge import jax_ops

    if not on_gpu:
        raise Skip("command buffers exist on GPUs only")
    if jax_ops.native_route_reason("triton") is None:
        raise Skip("the native route has no callback to record (same as chain_fp8_jax); "
                   "WOA_JAX_NATIVE=0 measures the callback route")
    try:
        return chain_fp8_jax(sets, on_gpu, command_buffer=True)
    except ValueError as e:  # a backend whose callbacks may not be recorded (AITER)
        if "cannot be recorded" not in str(e):
            raise
        raise Skip(str(e)) from e
