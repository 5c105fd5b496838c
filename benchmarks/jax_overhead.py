"""Where the JAX ``buffer_callback`` path spends its time per call (GPU; run on the device).

    python -m benchmarks.jax_overhead [--g 16]

Times, per call of a jitted function, a ladder of callbacks that each add one step of
``torch_bridge.jax_ops``' launch (no-op callback, DLPack wrap, XLA stream as torch's stream,
the Triton GEMM launch) and the real ``jax_ops`` GEMM at M = 1 (native ``jax_triton`` route
when installed; the callback route with command buffers), two ways: ``latency`` waits for
each call, ``throughput`` issues 100 calls then waits once. The difference between rungs is
what each step costs. Also the device time of the GEMM (M = 1, 64, 8192) and of the whole FP8
chain (``jax_ops.wo_a_fp8``, M = 1, 4, 64: fused natively at M = 1) inside one jitted
program, each against the torch launcher on the same inputs. At M = 8192 both sides are timed
at the clock the GPU holds under sustained load (``_WARM_S``), in three rounds that alternate
which side runs first; the torch burst figure (a short timing after idle time) is printed
beside them.
"""

from __future__ import annotations

import argparse
import math
import os
import time

#: Seconds of back-to-back work before a sustained timing. An H200 running large GEMMs without
#: pause reaches its power cap (700 W) within tens of milliseconds; its SM clock then drops from
#: 1980 to about 1400 MHz and an M = 8192 GEMM takes ~1090 instead of ~940 us (session 10).
_WARM_S = 1.0


def _per_call_us(fn, args, *, n: int, wait_each: bool) -> float:
    fn(*args).block_until_ready()
    t0 = time.perf_counter()
    r = None
    for _ in range(n):
        r = fn(*args)
        if wait_each:
            r.block_until_ready()
    r.block_until_ready()
    return (time.perf_counter() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--g", type=int, default=16, help="groups G (default 16)")
    p.add_argument("--n", type=int, default=100, help="calls per timing (default 100)")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from jax.experimental.buffer_callback import buffer_callback

    from torch_bridge import jax_ops
    from torch_bridge.backends.triton import launch

    g, n, k = args.g, 1024, 4096
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 120, (1, g, k), dtype=np.uint8))
    w = jnp.asarray(rng.integers(0, 120, (g, n, k), dtype=np.uint8))
    xs = jnp.asarray(np.full((1, g, k // 128), 127, np.uint8))
    ws = jnp.asarray(np.full((g, n // 128, k // 128), 120, np.uint8))
    out_t = jax.ShapeDtypeStruct((1, g, n), jnp.bfloat16)

    def noop(ctx, out, *ins):
        pass

    def wrap(ctx, out, *ins):
        [torch.from_dlpack(b) for b in (out, *ins)]

    def wrap_stream(ctx, out, *ins):
        with torch.cuda.stream(torch.cuda.ExternalStream(ctx.stream)):
            [torch.from_dlpack(b) for b in (out, *ins)]

    def gemm_launch(ctx, out, xb, wb, xsb, wsb):
        with torch.cuda.stream(torch.cuda.ExternalStream(ctx.stream)):
            f8 = torch.float8_e4m3fn
            launch.batched_gemm_a8w8_mxscale(
                torch.from_dlpack(xb).view(f8), torch.from_dlpack(wb).view(f8),
                torch.from_dlpack(xsb), torch.from_dlpack(wsb), out=torch.from_dlpack(out))

    rungs = {"jit add (no callback)": jax.jit(lambda a, b, c, d: a + 1)}
    for name, cb in (("noop callback", noop), ("dlpack wrap", wrap),
                     ("wrap on XLA stream", wrap_stream), ("Triton GEMM launch", gemm_launch)):
        rungs[name] = jax.jit(lambda a, b, c, d, cb=cb: buffer_callback(cb, out_t)(a, b, c, d))
    rungs["jax_ops GEMM (route by default)"] = jax.jit(
        lambda a, b, c, d: jax_ops.batched_gemm_a8w8_mxscale(
            jax.lax.bitcast_convert_type(a, jnp.float8_e4m3fn),
            jax.lax.bitcast_convert_type(b, jnp.float8_e4m3fn),
            jax.lax.bitcast_convert_type(c, jnp.float8_e8m0fnu),
            jax.lax.bitcast_convert_type(d, jnp.float8_e8m0fnu)))
    rungs["jax_ops GEMM, callback + cmd buffer"] = jax.jit(
        lambda a, b, c, d: jax_ops.batched_gemm_a8w8_mxscale(
            jax.lax.bitcast_convert_type(a, jnp.float8_e4m3fn),
            jax.lax.bitcast_convert_type(b, jnp.float8_e4m3fn),
            jax.lax.bitcast_convert_type(c, jnp.float8_e8m0fnu),
            jax.lax.bitcast_convert_type(d, jnp.float8_e8m0fnu), command_buffer=True))

    xt, wt = (torch.from_dlpack(a).view(torch.float8_e4m3fn) for a in (x, w))
    xst, wst = torch.from_dlpack(xs), torch.from_dlpack(ws)
    yt = torch.empty((1, g, n), dtype=torch.bfloat16, device="cuda")

    def torch_launch():
        launch.batched_gemm_a8w8_mxscale(xt, wt, xst, wst, out=yt)
        return yt

    torch_launch()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.n):
        torch_launch()
    torch.cuda.synchronize()
    torch_us = (time.perf_counter() - t0) / args.n * 1e6

    print(f"G={g} M=1, {args.n} calls; torch eager launch loop: {torch_us:.1f} us/call")
    _device_time(g, n, k)
    _chain_device_time(g)
    print(f"{'rung':34s} {'latency us':>11s} {'throughput us':>14s}")
    for name, fn in rungs.items():
        if "callback + cmd buffer" in name:  # trace with the native route off
            before = os.environ.get("WOA_JAX_TRITON")
            os.environ["WOA_JAX_TRITON"] = "0"
            try:
                fn(x, w, xs, ws).block_until_ready()
            finally:
                if before is None:
                    os.environ.pop("WOA_JAX_TRITON")
                else:
                    os.environ["WOA_JAX_TRITON"] = before
        lat = _per_call_us(fn, (x, w, xs, ws), n=args.n, wait_each=True)
        thr = _per_call_us(fn, (x, w, xs, ws), n=args.n, wait_each=False)
        print(f"{name:34s} {lat:11.1f} {thr:14.1f}", flush=True)
    return 0


def _device_time(g: int, n: int, k: int, reps: int = 20) -> None:
    """Device time per GEMM: ``reps`` chained calls inside one jit against the torch
    launcher's CUDA-graph replays of as many calls (default and pointer tiles), same inputs;
    at M = 8192 three rounds in alternating order."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import torch

    from benchmarks.timing import median, time_cuda
    from torch_bridge import jax_ops
    from torch_bridge.backends.triton import launch

    for m in (1, 64, 8192):
        gen = torch.Generator(device="cuda").manual_seed(m)
        xt = torch.randn((m, g, k), generator=gen, device="cuda").mul(40).to(torch.float8_e4m3fn)
        wt = torch.randn((g, n, k), generator=gen, device="cuda").mul(40).to(torch.float8_e4m3fn)
        xst = torch.full((m, g, k // 128), 120, dtype=torch.uint8, device="cuda")
        wst = torch.full((g, n // 128, k // 128), 120, dtype=torch.uint8, device="cuda")
        yt = torch.empty((m, g, n), dtype=torch.bfloat16, device="cuda")
        # The default launch shape (on Hopper the Gluon kernel above M = 16 where it has enough
        # tiles) and the pointer kernel that the native JAX route launches.
        pointer = dataclasses.replace(launch.gemm_config(m, g, n, k, 128), tma=False)
        args = (xt, wt, xst, wst)

        sustained = m >= 1024

        def torch_us(c, a=args, y=yt, sustained=sustained) -> tuple[float, float]:
            """(burst, sustained) us per call: replays of about 300 us of work (one call at
            M = 8192; ten of them after idle time run at the burst clock), then, at large M,
            replays of ``reps`` calls back to back after ``_WARM_S`` of them, as the JAX loop
            runs (else the burst figure twice)."""
            fn = [lambda: launch.batched_gemm_a8w8_mxscale(*a, out=y, config=c)]
            burst = median(time_cuda(fn, reps=10, fill_us=300.0))
            if not sustained:
                return burst, burst
            warm = math.ceil(_WARM_S * 1e6 / (reps * burst))
            return burst, median(time_cuda(fn, reps=10, warmup=warm, fill_us=reps * burst))

        row = {"torch ptr": torch_us(pointer)[1]}

        def to_jax(t, dtype):
            return jax.lax.bitcast_convert_type(jnp.asarray(t.view(torch.uint8).cpu().numpy()),
                                                dtype)

        xj, wj = (to_jax(t, jnp.float8_e4m3fn) for t in (xt, wt))
        xsj, wsj = (to_jax(t, jnp.float8_e8m0fnu) for t in (xst, wst))

        def bump_scales(a, bump):
            return jax.lax.bitcast_convert_type(a[2], jnp.uint8) + bump.astype(jnp.uint8)

        def step(a, bump):
            x, w, _, ws = a
            xs_i = jax.lax.bitcast_convert_type(bump_scales(a, bump), jnp.float8_e8m0fnu)
            return jax_ops.batched_gemm_a8w8_mxscale(x, w, xs_i, ws)

        route = jax_ops.native_route_reason("triton", (m, g, n, k, 128))
        jax_label = "jax native" if route is None else "jax callback"
        # Large M: both sides at their sustained clock (see _WARM_S), in three rounds that
        # alternate which side runs first, so drift over the run shows as spread between
        # rounds instead of as a gap.
        rounds = 3 if sustained else 1
        pairs = []
        for r in range(rounds):
            sides = {}
            for side in (("torch", "jax") if r % 2 == 0 else ("jax", "torch")):
                if side == "torch":
                    burst, sides[side] = torch_us(None)
                    row.setdefault("torch burst", burst)
                else:
                    sides[side], row["of which loop"] = _jit_loop_us(
                        step, (xj, wj, xsj, wsj), reps, bump_scales, sustained=sustained)
            pairs.append((sides["torch"], sides["jax"]))
            if rounds > 1:
                print(f"device time M={m} round {r + 1} ({' first, '.join(sides)} second, "
                      f"sustained): torch {sides['torch']:.1f} us, {jax_label} "
                      f"{sides['jax']:.1f} us ({_gap(sides['torch'], sides['jax'], m)})",
                      flush=True)
        row["torch"], row[jax_label] = (median([p[i] for p in pairs]) for i in (0, 1))
        print(f"device time M={m}: " + ", ".join(f"{a} {b:.1f} us" for a, b in row.items())
              + f"; gap {_gap(row['torch'], row[jax_label], m)}"
              + (f" (sustained, median of {rounds} rounds)" if sustained else ""), flush=True)


def _gap(torch_us: float, jax_us: float, m: int) -> str:
    """JAX against torch: in percent at large M (the 5 % target), in us at decode (15 us)."""
    if m >= 1024:
        return f"{(jax_us / torch_us - 1) * 100:+.1f} %"
    return f"{jax_us - torch_us:+.1f} us"


def _jit_loop_us(step, args, reps: int, bump_input, *,
                 sustained: bool = False) -> tuple[float, float]:
    """Device time per ``step(args, bump)`` inside one jitted, unrolled loop, and the part of
    it that is the loop's own: the same loop around ``bump_input(args, bump)`` alone (the input
    change ``step`` makes, written out in full as ``step``'s kernel needs it), nothing launched.

    Burst (default): a loop of ``reps + 1`` calls less one of 1 call, best of 5 each.
    ``sustained``: after ``_WARM_S`` of back-to-back loops, loops of ``2 reps + 1`` less loops
    of ``reps + 1`` calls, 5 of each in turn, medians: both at the clock the GPU holds under
    a long run (the fixed costs of a loop cancel either way).

    ``bump`` is 0, but XLA cannot know it, so no call is hoisted out of the loop; each trip
    also reads one output element into the carry."""
    import statistics

    import jax
    import jax.numpy as jnp

    def bump_only(a, bump):
        return jax.lax.optimization_barrier(bump_input(a, bump)).reshape(-1)[:1].reshape(1, 1, 1)

    def per_call_us(fn):
        def loop(args, count):
            def body(i, acc):
                y = fn(args, (acc > jnp.float32(3e38)).astype(jnp.int32))
                return acc + y[0, 0, 0].astype(jnp.float32)
            # Unrolled: a rolled loop syncs the host on each trip, which a callback route pays.
            return jax.lax.fori_loop(0, count, body, jnp.float32(0), unroll=True)

        f = jax.jit(loop, static_argnums=1)
        short, long = (reps + 1, 2 * reps + 1) if sustained else (1, reps + 1)
        times: dict[int, list[float]] = {short: [], long: []}
        for count in times:
            f(args, count).block_until_ready()
        if sustained:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < _WARM_S:
                f(args, long).block_until_ready()
        for _ in range(5):
            for count in (long, short):
                t0 = time.perf_counter()
                f(args, count).block_until_ready()
                times[count].append(time.perf_counter() - t0)
        pick = statistics.median if sustained else min
        return (pick(times[long]) - pick(times[short])) / (long - short) * 1e6

    return per_call_us(step), per_call_us(bump_only)


def _chain_device_time(g: int) -> None:
    """Device time per FP8 chain call under ``jax.jit`` (``jax_ops.wo_a_fp8``) against the torch
    launcher's (``launch.wo_a_fp8``) CUDA-graph replays, same inputs (L2-warm on both sides)."""
    import torch

    from benchmarks import bench, shapes
    from benchmarks.timing import median, time_cuda
    from torch_bridge import interop, jax_ops
    from torch_bridge.backends.triton import launch

    for m in (1, 4, 64):
        p = bench.make_problem(shapes.GPU, g, m, "cuda", seed=m)
        y = torch.empty((m, g, shapes.GPU.n), dtype=torch.bfloat16, device="cuda")
        torch_us = median(time_cuda([lambda p=p, y=y: launch.wo_a_fp8(
            p.o, p.pos, p.cos_bf16, p.sin_bf16, p.w, p.ws, g, out=y)], reps=10, fill_us=300.0))
        args = tuple(interop.to_jax(t) for t in (p.o, p.pos, p.cos_bf16, p.sin_bf16, p.w, p.ws))

        def bump_positions(a, bump):
            return a[1] + bump.astype(a[1].dtype)

        def step(a, bump, g=g):
            o, _, cos, sin, w, ws = a
            return jax_ops.wo_a_fp8(o, bump_positions(a, bump), cos, sin, w, ws, g)

        jax_us, loop_us = _jit_loop_us(step, args, 20, bump_positions)
        fused = launch.fused_chosen(m, g, shapes.GPU.n, shapes.GPU.k, 128)
        print(f"chain device time G={g} M={m} ({'fused' if fused else 'quant + GEMM'}): "
              f"torch {torch_us:.1f} us, jax {jax_us:.1f} us ({jax_us - torch_us:+.1f}), "
              f"of which the loop's own ops {loop_us:.1f} us", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
