"""Tensor-parallel ``wo_a -> wo_b`` on 2 GPUs: NCCL correctness (TP2 vs TP1) and TP2 vs TP1 timing.

Usage (writes ``tp_bench.json`` and ``tp_bench.md`` under ``--out``)::

    torchrun --nproc-per-node 2 -m torch_bridge.bench.tp --out $OUT
    python -m torch_bridge.bench.tp --out $OUT              # spawns the 2 ranks itself
    python -m torch_bridge.bench.tp --out /tmp/tp --smoke   # CPU + gloo, scaled-down shapes

NVLink multicast stays off: ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` and
``NVSHMEM_DISABLE_NVLS=1`` are forced into this process's environment when this module is
imported, before any process group exists, so every rank (spawned here or by torchrun) runs
with them; the JSON records the values each rank
saw. JAX is kept on the CPU (``JAX_PLATFORMS=cpu``): it only builds the RoPE tables here.

Per config (V4-Flash, V4-Pro at full size) and M (tokens):

* check: rank 0 draws the full checkpoint tensors and ``o`` and broadcasts them. TP1 runs the
  whole layer on each GPU (a one-rank group); TP2 runs each rank's half and all-reduces. Gates:
  TP2 vs TP1 relative error within ``gemm_bf16`` on the bf16 output, both ranks bitwise equal,
  and TP1 (``auto``: Triton on Hopper) vs TP1 on the pure-torch reference within
  ``fp8_wo_a_wo_b_impls`` (two FP8 GEMMs with a re-quantized intermediate).
  The fp32 TP2 vs TP1 error is recorded (ideally within ``gemm_fp32``: summation order only).
  At the smallest M the BF16 chain is checked the same way.
* timing: medians of CUDA-event timed calls (``torch_bridge.bench.timing.time_cuda``), eager
  launches, and CUDA-graph replays where capture works (``--graphs``, default on); TP2 is the
  slower rank.
  Breakdown per rank: ``wo_a``, ``wo_b`` (quant + GEMM), ``all_reduce`` of the fp32 partial.
"""

from __future__ import annotations

import os

# Before NCCL starts, in every process this module starts or is started as.
_NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(_NO_MULTICAST)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

WORLD = 2
ROPE_ROWS = 65536


def _configs(smoke: bool) -> list:
    import woa_jax

    if not smoke:
        return [woa_jax.get_config("v4-flash"), woa_jax.get_config("v4-pro")]
    base = woa_jax.DSV4_CONFIGS
    return [dataclasses.replace(base["v4-flash"], name="v4-flash-tiny", hidden_size=512,
                                num_heads=16, head_dim=128, o_lora_rank=128),
            dataclasses.replace(base["v4-pro"], name="v4-pro-tiny", hidden_size=896,
                                num_heads=32, head_dim=128, o_lora_rank=128)]


def _draw(cfg, m: int, device, seed: int):
    """Full TP1 tensors and inputs (fp8 N(0,1) weights, E8M0 scales 2**-9..2**-5, bf16 o)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    b, gn, k = cfg.block_size, cfg.o_groups * cfg.o_lora_rank, cfg.group_in_features

    def fp8(*shape):
        return torch.randn(shape, generator=g, device=device).to(torch.float8_e4m3fn)

    def e8m0(*shape):
        return torch.randint(118, 123, shape, generator=g, device=device, dtype=torch.uint8)

    return {
        "wo_a.weight": fp8(gn, k), "wo_a.scale": e8m0(gn // b, k // b),
        "wo_b.weight": fp8(cfg.hidden_size, gn), "wo_b.scale": e8m0(cfg.hidden_size // b, gn // b),
        "o": torch.randn((m, cfg.num_heads, cfg.head_dim), generator=g, device=device
                         ).to(torch.bfloat16),
        "positions": torch.randint(0, ROPE_ROWS, (m,), generator=g, device=device),
    }


def _broadcast(tensors: dict, src: int = 0) -> None:
    import torch
    import torch.distributed as dist

    for t in tensors.values():
        dist.broadcast(t.view(torch.uint8) if t.element_size() == 1 else t, src)


class _Rank:
    def __init__(self, args, rank: int):
        import torch
        import torch.distributed as dist

        self.args, self.rank = args, rank
        self.cuda = not args.smoke
        if self.cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
            torch.set_num_threads(1)
        dist.init_process_group("nccl" if self.cuda else "gloo", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=120))
        # Every rank creates every group; each rank then uses its own one-rank group for TP1.
        solos = [dist.new_group([r]) for r in range(WORLD)]
        self.solo = solos[rank]
        self.backend = "torch" if args.smoke else args.backend

    # -- timing --------------------------------------------------------------------------------

    def _time(self, fn, graph: bool) -> float:
        from .timing import median, time_cuda, time_wall

        if not self.cuda:
            return median(time_wall(fn, reps=self.args.reps, warmup=1))
        return median(time_cuda([fn], reps=self.args.reps, warmup=3, graph=graph))

    def _slowest(self, us: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([us], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    # -- one (config, M) -----------------------------------------------------------------------

    def _agree(self, ok: bool) -> bool:
        """Whether every rank got ``ok`` (so no rank enters a collective the other skips)."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())

    def case(self, cfg, m: int, *, first_m: bool, check: bool, mode: str) -> dict:
        """Check (when ``check``) and time one (config, M) in ``mode`` ("eager" or "graph")."""
        import torch
        import torch.distributed as dist

        import woa_jax
        from torch_bridge import interop
        from torch_bridge.tp import TPOutputProjection
        from woa_jax.testing import TOLERANCES, relative_error

        t = _draw(cfg, m, self.device, seed=1234 + m)
        _broadcast(t)
        cos, sin = (interop.to_torch(a).to(self.device)
                    for a in woa_jax.rope_cos_sin(cfg, "compress", ROPE_ROWS))
        full = (t["wo_a.weight"], t["wo_a.scale"], t["wo_b.weight"], t["wo_b.scale"], cfg, cos,
                sin)

        def build(backend, group):
            return TPOutputProjection.from_tensors(*full, group=group, backend=backend)

        tp1, tp2 = build(self.backend, self.solo), build(self.backend, None)
        o, pos = t["o"], t["positions"]
        o_l = o[:, tp2.heads].contiguous()
        rec: dict = {"config": cfg.name, "M": m, "hidden": cfg.hidden_size,
                     "o_groups": cfg.o_groups, "rank_groups": tp2.shard.local.num_groups}

        if check:
            y1 = tp1(o, pos, dtype=torch.float32)
            y2 = tp2(o_l, pos, dtype=torch.float32)
            y2b = tp2(o_l, pos)
            rec["route"] = {"wo_a": tp2.wo_a.path, "wo_b": tp2._wo_b_route()[0].value}
            gathered = [torch.empty_like(y2b) for _ in range(WORLD)]
            dist.all_gather(gathered, y2b)
            other = gathered[1 - self.rank]
            ref1 = build("torch", self.solo)(o, pos, dtype=torch.float32)
            checks = {
                "tp2_vs_tp1_bf16": relative_error(y2b, y1.to(torch.bfloat16)),
                "tp2_vs_tp1_fp32": relative_error(y2, y1),
                "ranks_bitwise_equal": bool(torch.equal(other.view(torch.int16),
                                                        y2b.view(torch.int16))),
                "tp1_vs_torch_reference_bf16": relative_error(y1.to(torch.bfloat16),
                                                              ref1.to(torch.bfloat16)),
                "tp2_bf16_is_cast_of_fp32": bool(torch.equal(y2.to(torch.bfloat16), y2b)),
            }
            if first_m:  # the BF16 fallback chain, once per config
                b1 = build("bf16", self.solo)(o, pos, dtype=torch.float32)
                b2 = build("bf16", None)(o_l, pos)
                checks["bf16_chain_tp2_vs_tp1_bf16"] = relative_error(b2, b1.to(torch.bfloat16))
            tol_bf16 = TOLERANCES["gemm_bf16"].rel
            tol_fp32 = TOLERANCES["gemm_fp32"].rel
            checks["fp32_within_gemm_fp32"] = checks["tp2_vs_tp1_fp32"] <= tol_fp32
            checks["pass"] = bool(
                checks["tp2_vs_tp1_bf16"] <= tol_bf16 and checks["ranks_bitwise_equal"]
                and checks["tp1_vs_torch_reference_bf16"]
                <= TOLERANCES["fp8_wo_a_wo_b_impls"].rel
                and checks["tp2_bf16_is_cast_of_fp32"]
                and checks.get("bf16_chain_tp2_vs_tp1_bf16", 0.0) <= tol_bf16)
            rec["check"] = checks
            del ref1, y1, y2, y2b, other, gathered

        # -- timing ----------------------------------------------------------------------------
        path, backend = tp2._wo_b_route()
        z1 = tp1.wo_a(o, pos).flatten(1)
        z2 = tp2.wo_a(o_l, pos).flatten(1)
        part = torch.zeros((m, cfg.hidden_size), dtype=torch.float32, device=self.device)
        graph = mode == "graph"
        fns = {  # part is zeros: repeated in-place all-reduces stay finite
            "tp1": lambda: tp1(o, pos),
            "tp1_wo_a": lambda: tp1.wo_a(o, pos),
            "tp1_wo_b": lambda: tp1.wo_b(z1, path=path, backend=backend),
            "tp2_wo_a": lambda: tp2.wo_a(o_l, pos),
            "tp2_wo_b": lambda: tp2.wo_b(z2, path=path, backend=backend),
            "tp2_all_reduce": lambda: dist.all_reduce(part),
            "tp2": lambda: tp2(o_l, pos),
        }
        tm: dict = {}
        for key, fn in fns.items():
            err = None
            try:
                us = self._time(fn, graph)
            except Exception as e:  # e.g. a step that cannot be captured in a CUDA graph
                err = f"{type(e).__name__}: {e}"[:300]
                if self.cuda:
                    torch.cuda.synchronize()
            if not self._agree(err is None):
                tm[key] = None
                tm.setdefault("errors", {})[key] = err or "failed on the other rank"
                continue
            tm[key] = self._slowest(us) if key.startswith("tp2") else us
        if tm.get("tp1") and tm.get("tp2"):
            tm["speedup_tp2_over_tp1"] = tm["tp1"] / tm["tp2"]
        rec["timing_us"] = {mode: tm}
        return rec


def _env_record() -> dict:
    import torch

    rec = {k: os.environ.get(k) for k in _NO_MULTICAST}
    rec["torch"] = torch.__version__
    rec["host"] = socket.gethostname()
    if torch.cuda.is_available():
        rec["gpu"] = torch.cuda.get_device_name()
        rec["nccl"] = str(torch.cuda.nccl.version())
    return rec


def _markdown(result: dict) -> str:
    lines = ["# TP2 vs TP1: wo_a -> wo_b", "",
             f"{result['started']}; env: " + ", ".join(f"{k}={v}" for k, v in
                                                      result["env"][0].items()), ""]
    lines += ["| config | M | route (wo_a/wo_b) | TP2 vs TP1 bf16 | fp32 | ranks equal | "
              "vs torch ref | pass |", "|---|---|---|---|---|---|---|---|"]
    for r in result["cases"]:
        if "error" in r:
            lines.append(f"| {r['config']} | {r['M']} | error: {r['error'][:80]} | | | | | no |")
            continue
        c = r["check"]
        lines.append(f"| {r['config']} | {r['M']} | {r['route']['wo_a']}/{r['route']['wo_b']} "
                     f"| {c['tp2_vs_tp1_bf16']:.2e} | {c['tp2_vs_tp1_fp32']:.2e} "
                     f"| {c['ranks_bitwise_equal']} | {c['tp1_vs_torch_reference_bf16']:.2e} "
                     f"| {c['pass']} |")
    cols = ("tp1", "tp2", "speedup_tp2_over_tp1", "tp2_wo_a", "tp2_wo_b", "tp2_all_reduce",
            "tp1_wo_a", "tp1_wo_b")
    lines += ["", "| config | M | mode | TP1 us | TP2 us | speedup | TP2 wo_a | TP2 wo_b | "
              "all_reduce | TP1 wo_a | TP1 wo_b |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for r in result["cases"]:
        for mode, tm in r.get("timing_us", {}).items():
            cells = [("-" if tm.get(c) is None else
                      f"{tm[c]:.2f}x" if c.startswith("speedup") else f"{tm[c]:.1f}")
                     for c in cols]
            lines.append(f"| {r['config']} | {r['M']} | {mode} | " + " | ".join(cells) + " |")
            notes += [f"- {r['config']} M={r['M']} {mode} {k}: {v}"
                      for k, v in tm.get("errors", {}).items()]
    lines += ["", "Times are microseconds (medians; TP2 columns: the slower rank)."]
    if notes:
        lines += ["", "Timing errors:", *notes]
    return "\n".join(lines) + "\n"


def _run(rank: int, args) -> None:
    import torch.distributed as dist

    me = _Rank(args, rank)
    out = pathlib.Path(args.out)
    result = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "world": WORLD, "args": vars(args), "cases": []}
    envs = [None] * WORLD
    dist.all_gather_object(envs, _env_record())
    result["env"] = envs
    ms = sorted(args.ms)
    passes = [("eager", True)] + ([("graph", False)] if (me.cuda and args.graphs) else [])
    by_key: dict = {}
    # Pass 1 checks and times eagerly; pass 2 re-times with CUDA graphs, so a capture problem
    # can never cost the results of pass 1 (they are on disk first).
    for mode, check in passes:
        for cfg in _configs(args.smoke):
            for m in ms:
                t0 = time.perf_counter()
                try:
                    rec = me.case(cfg, m, first_m=(m == ms[0]), check=check, mode=mode)
                except Exception as e:  # record and go on; both ranks run the same code
                    rec = {"config": cfg.name, "M": m, "error": f"{mode}: {type(e).__name__}: "
                           f"{e}\n{traceback.format_exc()[-1500:]}"}
                rec["seconds"] = round(time.perf_counter() - t0, 1)
                key = (cfg.name, m)
                if key in by_key:  # merge pass 2 into pass 1's record
                    old = by_key[key]
                    old.setdefault("timing_us", {}).update(rec.get("timing_us", {}))
                    if "error" in rec:
                        old.setdefault("errors", []).append(rec["error"])
                    old["seconds"] += rec["seconds"]
                else:
                    by_key[key] = rec
                    result["cases"].append(rec)
                if rank == 0:  # after every case: a later failure keeps the earlier ones
                    out.mkdir(parents=True, exist_ok=True)
                    (out / "tp_bench.json").write_text(json.dumps(result, indent=1))
                    (out / "tp_bench.md").write_text(_markdown(result))
                    print(json.dumps({"mode": mode, **{k: rec.get(k) for k in (
                        "config", "M", "check", "timing_us", "seconds", "error")}}), flush=True)
    ok = all(r.get("check", {}).get("pass", False) for r in result["cases"])
    if rank == 0:
        print(_markdown(result), flush=True)
        print("TP CHECK", "PASS" if ok else "FAIL", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


def _spawned(rank: int, args, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD))
    _run(rank, args)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", required=True, help="directory for tp_bench.json / tp_bench.md")
    p.add_argument("--ms", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="token counts M (default 128,8192; --smoke 16,64)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--backend", default="auto", help="wo_a / wo_b backend (default auto)")
    p.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="also time CUDA-graph replays")
    p.add_argument("--smoke", action="store_true",
                   help="CPU + gloo, scaled-down shapes, backend torch (checks the harness)")
    args = p.parse_args(argv)
    if args.ms is None:
        args.ms = [16, 64] if args.smoke else [128, 8192]
    if args.smoke:
        args.reps = min(args.reps, 3)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        if int(os.environ["WORLD_SIZE"]) != WORLD:
            raise SystemExit(f"torch_bridge.bench.tp needs exactly {WORLD} ranks, got "
                             f"WORLD_SIZE={os.environ['WORLD_SIZE']}")
        _run(int(os.environ["RANK"]), args)
        return
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawned, args=(args, port), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
