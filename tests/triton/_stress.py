"""Concurrent calls of every public entry point, checked bit for bit (``test_gpu_threads.py``).

Each case is one public call at one shape; its references are computed single-threaded first.
Then threads, each on its own CUDA stream, call random cases on random input sets and compare
every output with its reference; one more thread may capture CUDA graphs of layer calls and
replay them while the others run eagerly. A mismatch records whether the output was right once
the whole device had synchronised ("late": the work ran on a stream the caller did not wait on)
or stayed wrong.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from inputs import checkpoint, rope_inputs

#: Tokens per G that reach every launch path: fused decode (G 16 unsplit, G 4 split-K), the
#: unfused chain with its split GEMM the quant's dependent (G 2 decode on Hopper) and on the
#: wgmma GEMM (prefill), the BF16 one-launch chain (decode), its copy + cuBLAS route (G 2, 64
#: tokens) and its TMA GEMM from ``o`` (1024 tokens).
SHAPES = {16: (1, 16, 64, 1024), 4: (1,), 2: (1, 16, 64, 1024)}
INPUT_SETS = 2
#: Where the optional ``deepgemm`` backend joins in, if it can run: TP8's decode batches (each
#: new shape costs DeepGEMM a JIT compile of tens of seconds).
DEEPGEMM_SHAPES = ((2, 16), (2, 64))


def deepgemm_here() -> bool:
    from torch_bridge.backends import deepgemm

    return deepgemm.BACKEND.is_available()[0]


@dataclass
class Case:
    name: str
    run: Callable[[int], tuple[torch.Tensor, ...]]
    refs: list[tuple[torch.Tensor, ...]] = field(default_factory=list)


@dataclass
class Outcome:
    calls: int = 0
    replays: int = 0
    seconds: float = 0.0
    mismatches: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16) \
        if t.element_size() == 2 else t.view(torch.int32)


def same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(_bytes(x), _bytes(y)) for x, y in zip(a, b, strict=True))


def _differing(a, b) -> str:
    parts = []
    for x, y in zip(a, b, strict=True):
        bad = int((_bytes(x) != _bytes(y)).sum())
        finite = bool(x.float().isfinite().all()) if x.is_floating_point() else True
        parts.append(f"{bad}/{x.numel()} differ{'' if finite else ', non-finite'}")
    return "; ".join(parts)


def build_cases(seed: int, shapes=SHAPES) -> list[Case]:
    """Every public entry point at every (G, M), with per-thread output buffers where a call
    takes them; the ``deepgemm`` backend's at ``DEEPGEMM_SHAPES`` where it can run."""
    import torch_bridge as tb

    deep_shapes = DEEPGEMM_SHAPES if deepgemm_here() else ()
    cases: list[Case] = []
    mine = threading.local()

    def buffers(key, make):
        kept = getattr(mine, "kept", None)
        if kept is None:
            kept = mine.kept = {}
        if key not in kept:
            kept[key] = make()
        return kept[key]

    for g, tokens in shapes.items():
        w, ws = checkpoint(g, seed + g)
        _, _, cos, sin = rope_inputs(1, g, seed + g, rope_dtype=torch.float32)
        fp8 = tb.WoAProjection(w, ws, g, cos, sin)
        bf16 = tb.WoAProjection(w, ws, g, cos, sin, backend="bf16")
        wg, wsg = w.view(g, -1, w.shape[1]), ws.view(g, -1, ws.shape[1])
        for m in tokens:
            sets = [rope_inputs(m, g, seed + 1000 * g + 10 * m + j)[:2]
                    for j in range(INPUT_SETS)]
            quant = [tb.inverse_rope_group_quant(o, p, cos, sin, g) for o, p in sets]
            tag = f"G{g} M{m}"

            def add(name, run, tag=tag):
                cases.append(Case(f"{name} {tag}", run))

            add("WoAProjection fp8", lambda i, s=sets, f=fp8: (f(*s[i]),))
            add("WoAProjection bf16", lambda i, s=sets, b=bf16: (b(*s[i]),))

            def overwrite(i, s=sets, b=bf16, key=("o", g, m)):
                o = buffers(key, lambda: torch.empty_like(s[i][0]))
                o.copy_(s[i][0])
                return (b(o, s[i][1], overwrite_o=True),)
            add("WoAProjection bf16 overwrite_o", overwrite)
            add("wo_a_fp8", lambda i, s=sets, a=(cos, sin, w, ws, g):
                (tb.wo_a_fp8(*s[i], *a),))
            add("wo_a_bf16", lambda i, s=sets, a=(cos, sin, w, ws, g):
                (tb.wo_a_bf16(*s[i], *a),))
            add("inverse_rope_group_quant", lambda i, s=sets, a=(cos, sin, g):
                tb.inverse_rope_group_quant(*s[i], *a))

            def quant_into(i, s=sets, a=(cos, sin, g), q=quant, key=("q", g, m)):
                xq, xs = buffers(key, lambda: (torch.empty_like(q[0][0]),
                                               torch.empty_like(q[0][1])))
                return tb.inverse_rope_group_quant(*s[i], *a, x_fp8=xq, x_scale=xs)
            add("inverse_rope_group_quant into buffers", quant_into)
            add("batched_gemm_a8w8_mxscale", lambda i, q=quant, wg=wg, wsg=wsg:
                (tb.batched_gemm_a8w8_mxscale(q[i][0], wg, q[i][1], wsg),))
            if (g, m) in deep_shapes:
                layer = tb.WoAProjection(w, ws, g, cos, sin, backend="deepgemm")
                add("WoAProjection deepgemm", lambda i, s=sets, f=layer: (f(*s[i]),))
                add("wo_a_fp8 deepgemm", lambda i, s=sets, a=(cos, sin, w, ws, g):
                    (tb.wo_a_fp8(*s[i], *a, backend="deepgemm"),))
                add("batched_gemm_a8w8_mxscale deepgemm", lambda i, q=quant, wg=wg, wsg=wsg:
                    (tb.batched_gemm_a8w8_mxscale(q[i][0], wg, q[i][1], wsg,
                                                  backend="deepgemm"),))

            def gemm_into(i, q=quant, wg=wg, wsg=wsg, key=("y", g, m),
                          shape=(m, g, w.shape[0] // g)):
                y = buffers(key, lambda: torch.empty(shape, dtype=torch.bfloat16, device="cuda"))
                return (tb.batched_gemm_a8w8_mxscale(q[i][0], wg, q[i][1], wsg, out=y),)
            add("batched_gemm_a8w8_mxscale into out", gemm_into)
    return cases


def take_references(cases: list[Case]) -> None:
    """Each case's outputs on every input set, single-threaded on the default stream; a second
    round (the bound direct launches) must repeat them."""
    for case in cases:
        case.refs = [tuple(t.clone() for t in case.run(i)) for i in range(INPUT_SETS)]
    for case in cases:
        for i in range(INPUT_SETS):
            again = case.run(i)
            assert same(again, case.refs[i]), f"{case.name}: a repeat differs single-threaded"
    torch.cuda.synchronize()


def _eager_worker(cases, calls: int, rng: random.Random, out: Outcome, lock,
                  stream: torch.cuda.Stream | None = None) -> None:
    stream = stream or torch.cuda.Stream()
    for _ in range(calls):
        case = rng.choice(cases)
        i = rng.randrange(INPUT_SETS)
        try:
            with torch.cuda.stream(stream):
                got = case.run(i)
            stream.synchronize()
            ok = same(got, case.refs[i])
            if not ok:
                torch.cuda.synchronize()
                late = same(got, case.refs[i])
                with lock:
                    out.mismatches.append(f"{case.name} set {i}: {_differing(got, case.refs[i])}"
                                          f"{' (right after a device sync)' if late else ''}")
        except Exception as e:  # noqa: BLE001 - every failure is reported
            with lock:
                out.errors.append(f"{case.name}: {type(e).__name__}: {e}")
        with lock:
            out.calls += 1


def _graph_worker(cases: list[Case], replays: int, rng: random.Random, out: Outcome,
                  lock) -> None:
    """Capture each layer case in a CUDA graph on this thread's stream (static inputs), then
    replay with the input sets copied in."""
    stream = torch.cuda.Stream()
    graphs = []
    try:
        for case in cases:
            static = tuple(t.clone() for t in case.static)
            with torch.cuda.stream(stream):
                for _ in range(2):
                    case.layer(*static)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                y = case.layer(*static)
            graphs.append((case, static, graph, y))
        for _ in range(replays):
            case, static, graph, y = rng.choice(graphs)
            i = rng.randrange(INPUT_SETS)
            with torch.cuda.stream(stream):
                for dst, src in zip(static, case.inputs[i], strict=True):
                    dst.copy_(src)
                graph.replay()
            stream.synchronize()
            if not same((y,), case.refs[i]):
                with lock:
                    out.mismatches.append(f"graph {case.name} set {i}: "
                                          f"{_differing((y,), case.refs[i])}")
            with lock:
                out.replays += 1
    except Exception as e:  # noqa: BLE001
        with lock:
            out.errors.append(f"graph thread: {type(e).__name__}: {e}")


@dataclass
class GraphCase:
    name: str
    layer: Callable
    inputs: list[tuple[torch.Tensor, ...]]
    refs: list[tuple[torch.Tensor, ...]]

    @property
    def static(self):
        return self.inputs[0]


def graph_cases(seed: int) -> list[GraphCase]:
    """Layer calls to capture: the fused FP8 decode chain with split-K (G 4) and without
    (G 16), the unfused one with its split GEMM (G 2, 16 tokens), the BF16 one-launch chain
    without and with split-K (G 2), the FP8 chain at prefill (wgmma), and the ``deepgemm``
    backend's chain where it can run."""
    import torch_bridge as tb

    found = []
    layers = [(4, 1, "auto"), (2, 16, "auto"), (16, 1, "auto"), (16, 64, "bf16"), (2, 64, "bf16"),
              (2, 1024, "auto")]
    if deepgemm_here():
        layers += [(g, m, "deepgemm") for g, m in DEEPGEMM_SHAPES[-1:]]
    for g, m, backend in layers:
        w, ws = checkpoint(g, seed + 7 * g)
        _, _, cos, sin = rope_inputs(1, g, seed + 7 * g, rope_dtype=torch.float32)
        layer = tb.WoAProjection(w, ws, g, cos, sin, backend=backend)
        sets = [rope_inputs(m, g, seed + 77 * g + m + j)[:2] for j in range(INPUT_SETS)]
        refs = [(layer(*s).clone(),) for s in sets]
        found.append(GraphCase(f"WoAProjection {backend} G{g} M{m}", layer, sets, refs))
    torch.cuda.synchronize()
    return found


def stress(cases: list[Case] | list[list[Case]], *, threads: int, calls: int, seed: int,
           graphs: list[GraphCase] | None = None, replays: int = 0,
           one_stream: bool = False) -> Outcome:
    """``threads`` eager threads making ``calls`` calls in all, plus one capturing thread
    replaying ``replays`` graphs of ``graphs``; returns what went wrong. ``cases`` is one list
    for every thread, or a list of lists that the threads take in turn. ``one_stream``: the
    eager threads share the caller's stream (where ``take_references`` bound the direct
    launches) instead of one each."""
    out, lock = Outcome(), threading.Lock()
    shared = torch.cuda.current_stream() if one_stream else None
    shares = cases if isinstance(cases[0], list) else [cases]
    workers = [threading.Thread(target=_eager_worker,
                                args=(shares[t % len(shares)], calls // threads,
                                      random.Random(seed + t), out, lock, shared))
               for t in range(threads)]
    if graphs:
        workers.append(threading.Thread(target=_graph_worker,
                                        args=(graphs, replays, random.Random(seed - 1), out,
                                              lock)))
    start = time.perf_counter()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    torch.cuda.synchronize()
    out.seconds = time.perf_counter() - start
    return out
