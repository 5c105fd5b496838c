"""Tables in the terminal and plots drawn from the results CSV.

A column appears only if some row of the table has a value in it, so a CPU run shows what it
measured (wall time under the interpreter, the checks) and no empty throughput columns.
"""

from __future__ import annotations

#: (header, row key, digits, suffix) of the sweep table, in order.
_SWEEP_COLUMNS = (("us", "us", 1, ""), ("device us", "device_us", 1, ""),
                  ("TFLOP/s", "TFLOP/s", 0, ""), ("GB/s", "GB/s", 0, ""),
                  ("% ceiling", "pct_ceiling", 0, ""), ("vs BF16", "vs_bf16", 2, "x"),
                  ("/ ref BF16", "vs_ref", 2, "x"), ("/ DeepGEMM", "vs_deepgemm", 2, "x"),
                  ("/ peer", "vs_peer", 2, "x"), ("/ _scaled_mm", "vs_scaled_mm", 2, "x"),
                  ("/ graph", "vs_graph", 2, "x"), ("host us", "host_us", 1, ""))


def _fmt(v, digits: int, suffix: str = "") -> str:
    return "-" if v is None else f"{v:.{digits}f}{suffix}"


def _table(title: str, rows: list[dict], lead: tuple[str, ...], console) -> None:
    from rich.table import Table

    cols = [c for c in _SWEEP_COLUMNS if any(r.get(c[1]) is not None for r in rows)]
    t = Table(title=title)
    for c in lead:
        t.add_column(c, justify="left" if c in ("provider", "timer") else "right")
    for header, *_ in cols:
        t.add_column(header, justify="right")
    t.add_column("check")
    for r in rows:
        lead_cells = [str(r.get(c) if r.get(c) is not None else "-") for c in lead]
        t.add_row(*lead_cells, *(_fmt(r.get(key), d, s) for _, key, d, s in cols),
                  r.get("check", ""))
    console.print(t)


def print_tables(rows: list[dict], console) -> None:
    """The sweep, prefill, jax_step, host-cost and tuning tables of ``rows`` (those that have
    rows)."""
    sweep = [r for r in rows if r["mode"] == "sweep"]
    if sweep:
        timers = sorted({f"{r['timer']}" + (f", {r['clock']} clock" if r.get("clock") else "")
                         for r in sweep if r.get("timer")})
        _table(f"wo_a providers, median us per call ({'; '.join(timers)})", sweep,
               ("provider", "G", "M", "timer"), console)
    pre = [r for r in rows if r["mode"] == "prefill"]
    if pre:
        _table("prefill: total wo_a time of M tokens in chunks (us)", pre,
               ("provider", "G", "M", "chunk"), console)
    step = [r for r in rows if r["mode"] == "jax_step"]
    if step:
        from .jax_step import layers_of

        _table("jax_step: L layers per jitted step vs a CUDA graph of them in torch, us per "
               "layer", [{**r, "L": layers_of(r)} for r in step],
               ("provider", "L", "G", "M", "timer"), console)
    host = [r for r in rows if r["mode"] == "host_cost"]
    if host:
        _table("host time per back-to-back eager call (us)", host, ("provider", "G", "M"),
               console)
    tune = [r for r in rows if r["mode"] == "tune"]
    if tune:
        best: dict[tuple, dict] = {}
        for r in tune:
            key = (r["kind"], r["G"], r["M"])
            if r.get("us") and (key not in best or r["us"] < best[key]["us"]):
                best[key] = r
        _table("tuning: best launch shape per (G, M)", [best[k] for k in sorted(best)],
               ("kind", "G", "M", "provider"), console)


def plot(rows: list[dict], path: str) -> None:
    """Per G, time per call against M, one line per provider (sweep rows with a time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [r for r in rows if r["mode"] == "sweep" and r.get("us") and r.get("M")]
    groups = sorted({r["G"] for r in data})
    if not groups:
        raise ValueError("nothing to plot: no timed sweep rows")
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, g in zip(axes[0], groups, strict=True):
        for prov in sorted({r["provider"] for r in data if r["G"] == g}):
            pts = sorted((r["M"], r["us"]) for r in data if r["G"] == g
                         and r["provider"] == prov)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=prov)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("us per call")
        ax.set_title(f"G = {g}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
