"""Where the JAX ``buffer_callback`` path spends its time per call (GPU; run on the device).

    python -m benchmarks.jax_overhead [--g 16]

Times, per call of a jitted function, a ladder of callbacks that each add one step of
``torch_bridge.jax_ops``' launch (no-op callback, DLPack wrap, XLA stream as torch's stream,
the Triton GEMM launch) and the real ``jax_ops`` GEMM at M = 1 (native ``jax_triton`` route
when installed; the callback route with command buffers), two ways: ``latency`` waits for
each call, ``throughput`` issues 100 calls then waits once. The difference between rungs is
what each step costs. Also the device time of the GEMM (M = 1, 64, 8192) and of the whole FP8
chain (``jax_ops.wo_a_fp8``, M = 1, 4, 64: fused natively at M = 1) inside one jitted
program, each against the torch launcher on the same inputs.
"""

from __future__ import annotations

import argparse
import os
import time


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
    """Device time per GEMM: ``reps`` chained calls inside one jit (native route) against
    the torch launcher's CUDA-graph replays, TMA and pointer tiles, on the same inputs."""
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
        row = {}
        for label, c in (("torch", None), ("torch ptr", pointer)):
            row[label] = median(time_cuda([lambda c=c, a=args, y=yt: launch.
                                           batched_gemm_a8w8_mxscale(*a, out=y, config=c)],
                                          reps=10, fill_us=300.0))

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

        jax_us, loop_us = _jit_loop_us(step, (xj, wj, xsj, wsj), reps, bump_scales)
        route = jax_ops.native_route_reason("triton", (m, g, n, k, 128))
        row["jax native" if route is None else "jax callback"] = jax_us
        row["of which loop"] = loop_us
        print(f"device time M={m}: " + ", ".join(f"{a} {b:.1f} us" for a, b in row.items()),
              flush=True)


def _jit_loop_us(step, args, reps: int, bump_input) -> tuple[float, float]:
    """Device time per ``step(args, bump)`` inside one jitted, unrolled loop of ``reps + 1``
    calls less one call (best of 5 each), and the part of it that is the loop's own: the same
    loop around ``bump_input(args, bump)`` alone (the input change ``step`` makes, written out
    in full as ``step``'s kernel needs it), with nothing launched.

    ``bump`` is 0, but XLA cannot know it, so no call is hoisted out of the loop; each trip
    also reads one output element into the carry."""
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
        best = {}
        for count in (1, reps + 1):
            f(args, count).block_until_ready()
            best[count] = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                f(args, count).block_until_ready()
                best[count] = min(best[count], time.perf_counter() - t0)
        return (best[reps + 1] - best[1]) / reps * 1e6

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
