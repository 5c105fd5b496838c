"""Runs ``torch_bridge.tp.TPOutputProjection`` in a 4-process gloo world; started by
test_tp_torch.py as ``python _torch_dist_worker.py CKPT_ROOT OUT_DIR``.

One world of 4 spawned processes serves both TP degrees, as deployments do (TP groups are
subgroups): TP4 runs on the whole world, TP2 on the subgroups {0, 1} and {2, 3} (two replicas).
Each rank reads its slice of every case's checkpoint (``CKPT_ROOT/<config>``), runs the FP8 chain
(backend ``torch``) and the BF16 chain (backend ``bf16``) and saves its outputs to
``OUT_DIR/rank{r}.pt`` under keys ``tp{n}/{config}/{chain}/...``; the test process compares.
The launcher itself imports no torch (spawned children pay that once each).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pathlib
import sys

WORLD = 4
# (result key, backend): the FP8 chain on the pure-torch reference, and the BF16 fallback chain.
CHAINS = (("fp8", "torch"), ("bf16", "bf16"))


def _rank_main(rank: int, ckpt_root: str, out_dir: str) -> None:
    import dataclasses

    import torch
    import torch.distributed as dist
    from _tp_cases import CONFIGS, LAYER, ROPE_ROWS
    from safetensors.torch import load_file

    from torch_bridge.tp import TPOutputProjection

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/init", rank=rank,
                            world_size=WORLD)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    groups = {4: None, 2: pairs[rank // 2]}
    res: dict[str, object] = {}
    for tp, group in groups.items():
        for name, cfg in CONFIGS.items():
            path = pathlib.Path(ckpt_root) / name
            inp = load_file(str(path / "inputs.safetensors"))
            for key, backend in CHAINS:
                proj = TPOutputProjection.from_checkpoint(path, LAYER, cfg, group=group,
                                                          backend=backend, layer_kind="window",
                                                          max_positions=ROPE_ROWS)
                o = inp["o"][:, proj.heads].contiguous()
                pre = f"tp{tp}/{name}/{key}"
                res[f"{pre}/shard"] = (proj.rank, proj.tp)
                res[f"{pre}/fp32"] = proj(o, inp["positions"], dtype=torch.float32)
                res[f"{pre}/bf16"] = proj(o, inp["positions"])
                res[f"{pre}/route"] = (proj.wo_a.path, proj._wo_b_route()[0].value)
        bad = dataclasses.replace(CONFIGS["v4-flash-tiny"], name="five-groups", o_groups=5,
                                  num_heads=10)
        try:
            TPOutputProjection.from_checkpoint(pathlib.Path(ckpt_root) / "v4-flash-tiny", LAYER,
                                               bad, group=group)
        except ValueError as e:
            res[f"tp{tp}/error/groups"] = str(e)
    torch.save(res, pathlib.Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    # The results are on disk; skip interpreter teardown (torch + jax atexit work cost seconds per
    # process on a 2-core runner). The exit code still reports success to the launcher.
    os._exit(0)


def main(ckpt_root: str, out_dir: str) -> int:
    ctx = mp.get_context("spawn")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the spawned ranks
    procs = [ctx.Process(target=_rank_main, args=(r, ckpt_root, out_dir)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    for p in procs:
        if p.is_alive():
            p.kill()
    if bad:
        print(f"ranks failed (rank, exit code): {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
