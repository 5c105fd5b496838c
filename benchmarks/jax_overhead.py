"""Where the JAX ``buffer_callback`` path spends its time per call (GPU; run on the device).

    python -m benchmarks.jax_overhead [--g 16]

Times, per call of a jitted function, a ladder of callbacks that each add one step of
``torch_bridge.jax_ops``' launch (no-op callback, DLPack wrap, XLA stream as torch's stream,
the Triton GEMM launch) and the real ``jax_ops`` GEMM at M = 1 (native ``jax_triton`` route
when installed; the callback route with command buffers), two ways: ``latency`` waits for
each call, ``throughput`` issues 100 calls then waits once. The difference between rungs is
what each step costs.
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
    p.add_argument("--g", type=int, default=16)
    p.add_argument("--n", type=int, default=100)
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
    print(f"{'rung':34s} {'latency us':>11s} {'throughput us':>14s}")
    for name, fn in rungs.items():
        if "callback + cmd buffer" in name:  # trace with the native route off
            os.environ["WOA_JAX_TRITON"] = "0"
            fn(x, w, xs, ws).block_until_ready()
            os.environ.pop("WOA_JAX_TRITON")
        lat = _per_call_us(fn, (x, w, xs, ws), n=args.n, wait_each=True)
        thr = _per_call_us(fn, (x, w, xs, ws), n=args.n, wait_each=False)
        print(f"{name:34s} {lat:11.1f} {thr:14.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
