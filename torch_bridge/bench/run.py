"""The command line of the harness (``python -m torch_bridge.bench``, ``woa bench``)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib

from ..cli.errors import ExitCode, OneLineParser
from . import problem, results
from .jax_step import ROUTES as STEP_ROUTES
from .providers import DEFAULT, PROVIDERS
from .tune import DEFAULT_KINDS as TUNE_DEFAULT_KINDS
from .tune import KINDS as TUNE_KINDS

_DESCRIPTION = ("The wo_a benchmark: every provider checked against the woa_jax oracle, then "
                "timed; rows appended to <results dir>/<machine>.csv.")


class _Parser(OneLineParser):
    """A mistake is one line and exit 2, as in every woa command; the harness also runs on its
    own (``python -m torch_bridge.bench``), so the parser exits itself."""

    def error(self, message: str):
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _ints(s: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in s.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return vals


def _names(s: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in s.split(",") if v.strip())


def build_parser() -> argparse.ArgumentParser:
    """The harness's arguments (``woa bench`` forwards its own to ``main``)."""
    width = max(len(name) for name in PROVIDERS)
    epilog = "providers:\n" + "\n".join(f"  {name:<{width}}  {prov.runs}"
                                         for name, prov in PROVIDERS.items())
    p = _Parser(prog="woa bench", description=_DESCRIPTION, epilog=epilog,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=_ints,
                   help="G values (default: 16,8,2 on GPU, --jax-step 2,8,16; 2 on CPU)")
    p.add_argument("--ms", type=_ints,
                   help="M values (default: 1,2,4,...,8192 on GPU, --jax-step "
                        "1,16,64,256,1024,8192; 1,5 on CPU, --jax-step 1; host cost: 1)")
    p.add_argument("--providers", type=_names, default=DEFAULT,
                   help=f"comma-separated subset of {','.join(PROVIDERS)} (default: all but "
                        "copy)")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per row (median)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--prefill", action="store_true",
                      help="the 100K-token prefill in 8K chunks instead of the sweep")
    mode.add_argument("--tune", action="store_true",
                      help="time candidate Triton launch shapes instead of the sweep")
    mode.add_argument("--host-cost", action="store_true",
                      help="host time per back-to-back eager call of each public op, the "
                           "layer, torch._scaled_mm, torch.bmm and a bare Triton launch")
    mode.add_argument("--jax-step", action="store_true",
                      help="L layers in one jitted step (native, callback, XLA BF16) against a "
                           "CUDA graph of the same layers in torch, per layer")
    p.add_argument("--layers", type=_ints,
                   help="with --jax-step: layers per step (default: 8,61 on GPU, 2 on CPU)")
    p.add_argument("--routes", type=_names,
                   help=f"with --jax-step: comma-separated subset of {','.join(STEP_ROUTES)} "
                        "(default: all)")
    p.add_argument("--tune-kinds", type=_names, default=TUNE_DEFAULT_KINDS,
                   help=f"with --tune: comma-separated subset of {','.join(TUNE_KINDS)} "
                        f"(default: {','.join(TUNE_DEFAULT_KINDS)}; gemm-split: the few-tile "
                        "K splits of both GEMM kernels alone; chain-wgmma: the fused chain's "
                        "wgmma shapes beside the rule's and the two-kernel chain, up to 32 "
                        "tokens)")
    p.add_argument("--sustained", action="store_true",
                   help="sweep and --tune on a GPU: time at the clock held under a long run "
                        "(~20 ms replays after 1 s of them) instead of the burst clock")
    p.add_argument("--eager", action="store_true",
                   help="sweep and --tune on a GPU: launch the calls eagerly between the "
                        "events instead of replaying a CUDA graph")
    p.add_argument("--tuned", metavar="CSV",
                   help="launch with the fastest shapes of the newest --tune run in CSV")
    p.add_argument("--results-dir", metavar="DIR",
                   help="an existing directory where <machine>.csv is appended (default: the "
                        "checkout's benchmarks/results when run from one, else "
                        "$WOA_CACHE_DIR/results, ~/.cache/woa/results)")
    p.add_argument("--plot", metavar="FILE.png", help="draw this run's sweep rows from the CSV")
    p.add_argument("--from-csv", metavar="CSV",
                   help="measure nothing: print (and --plot) the newest run of CSV")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the input sets (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--source-digest", action="store_true",
                   help="print the digest of the installed sources (the 'source' column) "
                        "and exit")
    return p


def _check_args(args) -> None:
    unknown = sorted(set(args.providers) - set(PROVIDERS))
    if unknown:
        raise SystemExit(f"unknown providers {unknown}; expected a subset of {list(PROVIDERS)}")
    unknown = sorted(set(args.tune_kinds) - set(TUNE_KINDS))
    if unknown:
        raise SystemExit(f"unknown --tune-kinds {unknown}; expected a subset of "
                         f"{list(TUNE_KINDS)}")
    for flag in ("sustained", "eager"):
        if getattr(args, flag) and (args.prefill or args.host_cost or args.jax_step):
            raise SystemExit(f"--{flag} applies to the sweep and --tune, not to --prefill, "
                             "--host-cost or --jax-step (those time their own way)")
    for flag in ("layers", "routes"):
        if getattr(args, flag) is not None and not args.jax_step:
            raise SystemExit(f"--{flag} applies to --jax-step only")
    if args.routes is not None:
        unknown = sorted(set(args.routes) - set(STEP_ROUTES))
        if unknown or not args.routes:
            raise SystemExit(f"--routes {','.join(args.routes)!r} is not a non-empty subset "
                             f"of {','.join(STEP_ROUTES)}")
    if args.reps < 1:
        raise SystemExit(f"--reps must be at least 1, got {args.reps}")
    if args.plot and (args.tune or args.prefill or args.host_cost or args.jax_step):
        raise SystemExit("--plot draws the sweep; --tune, --prefill, --host-cost and "
                         "--jax-step print tables only")


def _read_csv(path: str, flag: str) -> list[dict]:
    """The rows of a results CSV, or a usage error that names ``flag`` and the problem."""
    try:
        rows = results.read(path)
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"{flag}: cannot read {path}: {e}") from None
    missing = {"run", "mode"} - set(rows[0] if rows else ())
    if not rows or missing:
        raise SystemExit(f"{flag}: {path} holds no results rows (expected a CSV written by "
                         "woa bench)")
    return rows


def _results_dir(given: str | None) -> pathlib.Path:
    """``--results-dir``, which must exist (a typo must not become a new tree), else the
    documented default (``results.default_dir``), created if needed."""
    if given is None:
        path = results.default_dir()
        path.mkdir(parents=True, exist_ok=True)
        return path
    path = pathlib.Path(given)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        raise SystemExit(f"--results-dir {given}: {what}; pass an existing directory")
    return path


def main(argv: list[str] | None = None) -> int:
    """Run the harness; returns 0, or 1 if a provider failed its oracle check.

    Raises:
      SystemExit: a usage error, with its one-line message.
    """
    args = build_parser().parse_args(argv)
    if args.source_digest:
        print(results.source_digest())
        return 0
    _check_args(args)
    from rich.console import Console

    from . import report

    console = Console(width=max(Console().width, 150))
    if args.from_csv:
        rows = results.newest_run(_read_csv(args.from_csv, "--from-csv"))
        report.print_tables(rows, console)
        if args.plot:
            try:
                report.plot(rows, args.plot)
            except ValueError as e:
                raise SystemExit(f"--plot: {e} in the newest run of {args.from_csv}") from None
        return 0
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import torch

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        if os.environ["TRITON_INTERPRET"] in ("", "0"):
            raise SystemExit("no GPU: set TRITON_INTERPRET=1 to run the Triton kernels on CPU")
    if args.tuned:
        from .tune import use_tuned

        try:
            use_tuned(_read_csv(args.tuned, "--tuned"))
        except ValueError as e:
            raise SystemExit(f"--tuned: {e} in {args.tuned} (write them with --tune)") from None
    meta = results.metadata(on_gpu)
    csv_path = _results_dir(args.results_dir) / f"{meta['machine']}.csv"
    try:  # before measuring, not after
        results.check_appendable(csv_path)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    console.print(f"[bold]woa bench[/] on {meta['device']}: torch {meta['torch']}, triton "
                  f"{meta['triton']}, jax {meta['jax']}, commit {meta['commit']}, source "
                  f"{meta['source']} -> {csv_path}")
    rows = _measure(args, on_gpu, console, lambda new: results.append(csv_path, meta, new))
    report.print_tables(rows, console)
    if args.plot:
        report.plot(results.newest_run(results.read(csv_path)), args.plot)
    failed = [r for r in rows if str(r.get("check", "")).startswith("FAILED")
              and r["mode"] != "tune"]
    return 1 if failed else 0


def _measure(args, on_gpu: bool, console, save) -> list[dict]:
    """Run the chosen mode; ``save(new_rows)`` as rows come (a killed run keeps them)."""
    from rich.progress import Progress

    from .sweep import measure_copy, run_sweep

    base = problem.GPU if on_gpu else problem.CPU
    ms = args.ms or ((1,) if args.host_cost else base.ms)
    sweep = dataclasses.replace(base, groups=args.groups or base.groups, ms=ms)
    clock = "sustained" if args.sustained else "burst"
    rows: list[dict] = []
    with Progress(console=console, disable=args.no_progress, transient=True) as progress:
        if args.tune:
            from .tune import run_tune

            rows = run_tune(sweep, on_gpu=on_gpu, reps=args.reps, progress=progress,
                            seed=args.seed, kinds=args.tune_kinds, clock=clock,
                            graph=not args.eager, on_shape=save)
        elif args.prefill:
            from .prefill import run_prefill

            cfg = problem.GPU_PREFILL if on_gpu else problem.CPU_PREFILL
            if args.groups:
                cfg = dataclasses.replace(cfg, groups=args.groups)
            rows = run_prefill(sweep, cfg, on_gpu=on_gpu, progress=progress, seed=args.seed)
            save(rows)
        elif args.jax_step:
            from . import jax_step

            cfg = jax_step.GPU if on_gpu else jax_step.CPU
            cfg = dataclasses.replace(cfg, layers=args.layers or cfg.layers,
                                      groups=args.groups or cfg.groups, ms=args.ms or cfg.ms)
            routes = tuple(r for r in STEP_ROUTES if r in (args.routes or STEP_ROUTES))

            def on_rows(new):
                rows.extend(new)
                save(new)

            jax_step.run_jax_step(sweep, cfg, routes, on_gpu=on_gpu, reps=args.reps,
                                  seed=args.seed, progress=progress, on_rows=on_rows)
        elif args.host_cost:
            from .hostcost import run_host_cost

            rows = run_host_cost(sweep, on_gpu=on_gpu, reps=args.reps, seed=args.seed,
                                 progress=progress)
            save(rows)
        else:
            wanted = list(args.providers)
            copy = measure_copy(on_gpu, args.reps) if on_gpu or "copy" in wanted else None
            if copy and "copy" in wanted:
                rows.append(copy)
                save([copy])

            def on_shape(new):
                rows.extend(new)
                save(new)

            run_sweep(sweep, [p for p in wanted if p != "copy"], on_gpu=on_gpu,
                      reps=args.reps, progress=progress,
                      copy_gbps=copy["GB/s"] if copy and on_gpu else None, seed=args.seed,
                      graph=not args.eager, clock=clock, on_shape=on_shape)
    return rows
