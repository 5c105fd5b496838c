"""``woa verify``: the cross-framework correctness report.

With no arguments it writes a seeded DeepSeek V4-Flash ``wo_a`` layer as a real safetensors
checkpoint (FP8 e4m3fn weight, E8M0 128x128 scales), loads it back through
``WoAProjection.from_checkpoint``, builds attention outputs with post-softmax magnitudes on the
real V4 rope table, and runs the FP8 chain on every backend that runs here, from torch and from
JAX, plus the BF16 chain, against the ``woa_jax`` oracle and the float64 truth.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import output
from .errors import ExitCode, NotVerifiedError, UsageError, exit_codes_help
from .inspect import fp8_eligibility
from .probe import device_info, versions

_FP8_BACKENDS = ("aiter", "triton", "deepgemm", "torch")
#: Ratio written to ``config.json``'s ``compress_ratios`` for a kept compressed-attention layer.
_COMPRESS_RATIO = 4


def embedded_checkpoint(directory: pathlib.Path, cfg, layer: int, seed: int, *,
                        layer_kind: str = "compress") -> None:
    """Write the seeded full-size ``wo_a`` layer of ``woa_jax.example_inputs`` as a checkpoint.

    The weight is real-valued, quantized into ``cfg.block_size`` tiles as checkpoints are
    (``woa_jax.quantize_weight_blocks``), and written as F8_E4M3 + F8_E8M0 tensors named
    ``layers.{layer}.attn.wo_a.{weight,scale}``, with a ``config.json`` that gives the layer's
    RoPE kind, so ``WoAProjection.from_checkpoint(directory, layer)`` needs nothing else.
    """
    import woa_jax

    from ..checkpoint import save_wo_a_layer
    from ..interop import numpy_to_torch

    full = woa_jax.example_inputs(config=cfg, tokens=1, tp_size=1, seed=seed, max_position=1,
                                  keys=1)
    save_wo_a_layer(directory, layer, numpy_to_torch(full.weight),
                    numpy_to_torch(full.weight_scale))
    ratios = [0] * max(cfg.num_layers, layer + 1)
    ratios[layer] = _COMPRESS_RATIO if layer_kind == "compress" else 0
    (directory / "config.json").write_text(json.dumps(
        {"o_groups": cfg.o_groups, "num_attention_heads": cfg.num_heads,
         "num_hidden_layers": cfg.num_layers, "compress_ratios": ratios}, indent=1) + "\n")


def _sync(x) -> None:
    if hasattr(x, "block_until_ready"):
        x.block_until_ready()
    elif type(x).__module__.startswith("torch") and x.device.type == "cuda":
        import torch

        torch.cuda.synchronize()


class _Progress:
    """The stage running, on one stderr line rewritten in place, when stderr is a terminal: a
    large ``--tokens`` runs for minutes, and a silent terminal looks hung. Pipes get nothing, so
    that an error stays the one line on stderr."""

    def __init__(self):
        self.live = sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def __call__(self, stage: str) -> None:
        if self.live:
            sys.stderr.write(f"\r\033[Kwoa verify: {stage} "
                             f"({time.perf_counter() - self.t0:.0f} s so far)")
            sys.stderr.flush()

    def done(self) -> None:
        if self.live:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _timed(fn: Callable[[], tuple]) -> tuple[tuple, float]:
    """Run once (compile, caches, result), then time a second run."""
    out = fn()
    _sync(out[0])
    t0 = time.perf_counter()
    _sync(fn()[0])
    return out, time.perf_counter() - t0


def _backend_list(spec: str | None, allowed: Sequence[str]) -> tuple[str, ...]:
    if spec is None:
        return tuple(allowed)
    names = tuple(s.strip().lower() for s in spec.split(",") if s.strip())
    bad = [s for s in names if s not in allowed]
    if bad or not names:
        raise UsageError(f"--backends {spec!r}: expected a comma-separated subset of "
                         f"{', '.join(allowed)}")
    return names


def _keep_dir(dest: str) -> pathlib.Path:
    path = pathlib.Path(dest)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UsageError(f"--keep {dest}: exists and is not an empty directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _load(args, tmp: str) -> dict[str, Any]:
    """Read (or write, then read) the layer under test: checkpoint tensors and projection."""
    import torch

    import woa_jax

    from .. import checkpoint
    from ..projection import WoAProjection

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no GPU")
    cfg = woa_jax.get_config(args.config) if args.config else None
    kept = None
    if args.checkpoint is None:
        cfg = cfg or woa_jax.get_config("v4-flash")
        if not 0 <= args.layer < cfg.num_layers:
            raise UsageError(f"--layer {args.layer} is out of range: {cfg.name} has layers 0 to "
                             f"{cfg.num_layers - 1}")
        woa_jax.local_shapes(cfg, args.tp)  # a bad --tp fails before the checkpoint is built
        layer_kind = args.layer_kind or "compress"
        path = _keep_dir(args.keep) if args.keep else pathlib.Path(tmp)
        embedded_checkpoint(path, cfg, args.layer, args.seed, layer_kind=layer_kind)
        kept = str(path) if args.keep else None
        source = f"embedded seeded {cfg.name} checkpoint (safetensors, F8_E4M3 + F8_E8M0)"
    else:
        if args.keep:
            raise UsageError("--keep saves the embedded checkpoint; it does not apply with "
                             "--checkpoint")
        if args.layer < 0:
            raise UsageError(f"--layer must be non-negative, got {args.layer}")
        path = pathlib.Path(args.checkpoint)
        source = str(path)
    num_groups = cfg.o_groups if cfg is not None else None
    # Read first: a missing layer or corrupt data is the first thing to say.
    raw = checkpoint.read_wo_a(path, args.layer, tp_rank=0, tp_size=args.tp,
                               num_groups=num_groups, config=cfg)
    layer_kind = args.layer_kind or checkpoint.layer_kind_from_config(path, args.layer)
    if layer_kind is None:
        raise UsageError(
            f"layer {args.layer}: no config.json with compress_ratios beside {path} tells its "
            "RoPE table; pass --layer-kind compress or --layer-kind window")
    if raw.scale is None:
        raise NotVerifiedError(
            f"layer {args.layer}: wo_a is {str(raw.weight.dtype).removeprefix('torch.')} "
            "without a scale, so there is no FP8 chain to verify (woa inspect lists every layer)")
    proj = WoAProjection.from_checkpoint(path, args.layer, 0, args.tp, config=cfg,
                                         num_groups=num_groups, layer_kind=layer_kind,
                                         device=device)
    # Decided now: WOA_BACKEND naming a backend that cannot run is said before the work.
    auto_path = {"path": proj.path, "reason": proj.fallback_reason}
    return {"raw": raw, "proj": proj, "cfg": cfg, "device": device, "source": source,
            "layer_kind": layer_kind, "kept": kept, "auto_path": auto_path}


def run_verify(args: argparse.Namespace) -> dict[str, Any]:
    """The work of ``woa verify``; returns the JSON payload (``payload["exit"]`` is the verdict).

    Raises:
      UsageError: a bad argument (out-of-range ``--layer``, bad ``--tp``, unknown backend).
      ValueError: ``--config`` disagrees with the checkpoint's shapes.
      CheckpointError: an unreadable checkpoint file; ``NonFiniteTensorError`` for NaN/Inf data.
      NotVerifiedError: the layer has no FP8 chain (an unquantized weight).
      BackendUnavailableError: ``WOA_BACKEND`` names a backend that cannot run the layer here.
    """
    progress = _Progress()
    try:
        return _run_verify(args, progress)
    finally:
        progress.done()


def _run_verify(args: argparse.Namespace, progress: _Progress) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    import woa_jax
    from woa_jax.conformance import raised_summary
    from woa_jax.testing import TOLERANCES, bytes_equal_fraction, relative_error, to_numpy

    from .. import _dispatch, ops
    from .._dispatch import BackendUnavailableError
    from ..interop import to_jax, to_torch
    from ..projection import WoAProjection

    t_start = time.perf_counter()
    if args.tokens < 1:
        raise UsageError(f"--tokens must be at least 1, got {args.tokens}")
    wanted = _backend_list(args.backends, _FP8_BACKENDS + ("bf16",))
    progress("reading the layer")
    with tempfile.TemporaryDirectory(prefix="woa-verify-") as tmp:
        ctx = _load(args, tmp)
    raw, proj, device = ctx["raw"], ctx["proj"], ctx["device"]
    g, n, k, p_rows = proj.num_groups, proj.n, proj.k, int(proj.cos_cache.shape[0])
    head_dim = 512
    heads = g * k // head_dim
    rng = np.random.default_rng(args.seed)
    # A decode batch from requests of all context lengths: log-uniform over [1, P), plus 0.
    positions = np.exp(rng.uniform(0, math.log(p_rows - 1), size=args.tokens)).astype(np.int64)
    positions[0] = 0
    jax_device = jax.devices()[0]
    jax_dev = str(jax_device.platform)

    def jx(t):  # torch -> JAX array on JAX's default device, where o lives
        return jax.device_put(to_jax(t.cpu()), jax_device)

    cos32_j, sin32_j = jx(proj.cos_cache), jx(proj.sin_cache)
    progress(f"{args.tokens} attention outputs")
    o32 = woa_jax.attention_output(rng, positions, heads, head_dim, cos32_j, sin32_j, keys=256)
    o_j = jax.device_put(jnp.asarray(o32, jnp.bfloat16), jax_device)
    pos_j = jax.device_put(jnp.asarray(positions.astype(np.int32)), jax_device)
    # AITER's FP8 path rotates with bf16 cos/sin (vLLM converts the table once); every FP8 row
    # uses them, which also makes the bytes independent of FMA contraction.
    cos_bf_j, sin_bf_j = cos32_j.astype(jnp.bfloat16), sin32_j.astype(jnp.bfloat16)
    w2d_j, s2d_j = jx(raw.weight), jx(raw.scale)

    fp8_ok = fp8_eligibility(
        str(raw.weight.dtype).removeprefix("torch."), tuple(raw.weight.shape),
        str(raw.scale.dtype).removeprefix("torch."), tuple(raw.scale.shape), num_groups=g,
        load_scale=lambda: raw.scale.to(torch.float64).numpy())
    # The float64 truth reads only the T table rows in use.
    progress("the float64 truth")
    truth = woa_jax.wo_a_truth(o_j, jnp.arange(args.tokens, dtype=jnp.int32), cos32_j[pos_j],
                               sin32_j[pos_j], w2d_j, s2d_j, g)
    bf16_ref = jax.jit(woa_jax.wo_a_bf16, static_argnums=6)
    progress("the oracle's BF16 chain")
    (y_bf16_ref,), t_bf16_ref = _timed(lambda: (bf16_ref(o_j, pos_j, cos32_j, sin32_j, w2d_j,
                                                         s2d_j, g),))
    rows: list[dict[str, Any]] = []

    def row(backend, framework, dev, chain, status, detail="", **kw) -> None:
        r = {"backend": backend, "framework": framework, "device": dev, "chain": chain,
             "scale_bytes_equal": None, "fp8_bytes_equal": None, "rel_err_vs_truth": None,
             "fp8_vs_bf16": None, "rel_err_vs_oracle": None, "seconds": None,
             "status": status, "detail": detail}
        r.update(kw)
        rows.append(r)

    gemm_tol = TOLERANCES["gemm_bf16"].rel
    row("oracle bf16", "jax", jax_dev, "bf16", "reference",
        rel_err_vs_truth=relative_error(y_bf16_ref, truth), seconds=t_bf16_ref)
    ref = None
    if fp8_ok["eligible"]:
        w_j, ws_j = woa_jax.wo_a_weight_e8m0(w2d_j, s2d_j, g)

        @jax.jit
        def oracle_chain(o, pos, cos, sin, w, ws):
            x, xs = woa_jax.inverse_rope_group_quant(o, pos, cos, sin, g, fp8_ok["block"],
                                                     fp8_dtype=w.dtype)
            return woa_jax.batched_gemm_a8w8_mxscale(x, w, xs, ws), x, xs

        progress("the oracle's FP8 chain")
        ref, t_ref = _timed(lambda: oracle_chain(o_j, pos_j, cos_bf_j, sin_bf_j, w_j, ws_j))
        row("oracle", "jax", jax_dev, "fp8", "reference", scale_bytes_equal=1.0,
            fp8_bytes_equal=1.0, rel_err_vs_truth=relative_error(ref[0], truth),
            fp8_vs_bf16=relative_error(ref[0], y_bf16_ref), rel_err_vs_oracle=0.0, seconds=t_ref)
    else:
        row("oracle", "jax", jax_dev, "fp8", "not run", fp8_ok["reason"])

    o_t = to_torch(o_j).to(device)
    pos_t = torch.from_numpy(positions).to(device)
    cos_bf_t = proj.cos_cache.to(device, torch.bfloat16)
    sin_bf_t = proj.sin_cache.to(device, torch.bfloat16)

    def fp8_chain(name: str, framework: str):
        if framework == "torch":
            args_ = (o_t, pos_t, cos_bf_t, sin_bf_t)
            w, ws = proj.weight_fp8.to(device), proj.weight_scale_e8m0.to(device)
        else:  # JAX arrays in, JAX arrays out (DLPack inside torch_bridge)
            args_ = (o_j, pos_j, cos_bf_j, sin_bf_j)
            w, ws = jx(proj.weight_fp8), jx(proj.weight_scale_e8m0)

        def run():
            x, xs = ops.inverse_rope_group_quant(*args_, g, proj.block, backend=name,
                                                 fp8_dtype=proj.weight_fp8.dtype)
            return ops.batched_gemm_a8w8_mxscale(x, w, xs, ws, backend=name), x, xs

        return run

    for name in (b for b in _FP8_BACKENDS if b in wanted and ref is not None):
        for framework in ("torch", "jax"):
            dev = device if framework == "torch" else jax_dev
            progress(f"{name} from {framework}")
            try:
                (y, x, xs), sec = _timed(fp8_chain(name, framework))
            except BackendUnavailableError as e:
                why = str(e).split(": ", 1)[-1]
                if framework == "torch":  # the backend cannot run here at all: one row
                    row(name, "-", "-", "fp8", "not run", why)
                    break
                row(name, framework, dev, "fp8", "not run", why)
                continue
            except Exception as e:  # noqa: BLE001 - an available backend that fails breaks
                row(name, framework, dev, "fp8", "BREAK", raised_summary(e))
                continue
            y = to_numpy(y)
            scale_eq = bytes_equal_fraction(to_numpy(xs), ref[2])
            fp8_eq = bytes_equal_fraction(to_numpy(x), ref[1])
            vs_oracle = relative_error(y, ref[0])
            problems = []
            if scale_eq < 1.0:
                problems.append("scale bytes differ")
            if fp8_eq < 1.0:
                problems.append("fp8 bytes differ")
            if not vs_oracle <= gemm_tol:
                problems.append(f"output {vs_oracle:.1e} from the oracle's (> {gemm_tol:g})")
            row(name, framework, dev, "fp8", "BREAK" if problems else "ok", ", ".join(problems),
                scale_bytes_equal=scale_eq, fp8_bytes_equal=fp8_eq,
                rel_err_vs_truth=relative_error(y, truth),
                fp8_vs_bf16=relative_error(y, y_bf16_ref), rel_err_vs_oracle=vs_oracle,
                seconds=sec)

    if "bf16" in wanted:
        # The same checkpoint tensors with the BF16 chain forced (fp32 cos/sin, as upstream).
        bf16_proj = WoAProjection.from_tensors(raw.weight.to(device), raw.scale.to(device), g,
                                               proj.cos_cache.to(device),
                                               proj.sin_cache.to(device), backend="bf16")
        for framework, o_in, pos_in in (("torch", o_t, pos_t), ("jax", o_j, pos_j)):
            dev = device if framework == "torch" else jax_dev
            progress(f"bf16 from {framework}")
            try:
                (y,), sec = _timed(lambda o_in=o_in, pos_in=pos_in: (bf16_proj(o_in, pos_in),))
            except BackendUnavailableError as e:
                row("bf16", framework, dev, "bf16", "not run", str(e))
                continue
            y = to_numpy(y)
            vs_ref = relative_error(y, y_bf16_ref)
            ok = vs_ref <= gemm_tol
            row("bf16", framework, dev, "bf16", "ok" if ok else "BREAK",
                "" if ok else f"output {vs_ref:.1e} from the oracle's BF16 chain (> {gemm_tol:g})",
                rel_err_vs_truth=relative_error(y, truth), rel_err_vs_oracle=vs_ref, seconds=sec)

    compared = [r for r in rows if r["chain"] == "fp8" and r["status"] in ("ok", "BREAK")
                and r["backend"] != "oracle"]
    if any(r["status"] == "BREAK" for r in rows):
        verdict = ExitCode.BROKEN
    elif not compared:
        verdict = ExitCode.NOT_VERIFIED
    else:
        verdict = ExitCode.OK
    cfg = ctx["cfg"]
    return {
        "command": "verify",
        "ok": verdict == ExitCode.OK,
        "exit": int(verdict),
        "verdict": verdict.name.lower(),
        "source": ctx["source"],
        "kept": ctx["kept"],
        "config": getattr(cfg, "name", None) or _config_name(proj),
        "layer": args.layer,
        "layer_kind": ctx["layer_kind"],
        "tp": args.tp,
        "tp_rank": 0,
        "shapes": {"tokens": args.tokens, "heads": heads, "head_dim": head_dim, "groups": g,
                   "n": n, "k": k, "block": proj.block, "rope_rows": p_rows},
        "positions": {"min": int(positions.min()), "max": int(positions.max())},
        "seed": args.seed,
        "fp8_eligible": fp8_ok,
        "auto_path": ctx["auto_path"],
        "rows": rows,
        "versions": versions(),
        "device": device_info(),
        "backends_known": list(_dispatch.BACKENDS),
        "seconds_total": time.perf_counter() - t_start,
    }


def _config_name(proj) -> str | None:
    import woa_jax

    for cfg in woa_jax.DSV4_CONFIGS.values():
        if (cfg.group_in_features, cfg.o_lora_rank, cfg.block_size) == (proj.k, proj.n,
                                                                         proj.block):
            return cfg.name
    return None


def _verdict_line(payload: dict[str, Any]) -> str:
    rows = payload["rows"]
    if payload["exit"] == ExitCode.BROKEN:
        broken = [r for r in rows if r["status"] == "BREAK"]
        return f"FAIL: {len(broken)} row(s) break the byte contract (exit 1)"
    if payload["exit"] == ExitCode.NOT_VERIFIED:
        skipped = [f"{r['backend']}: {r['detail']}" for r in rows
                   if r["chain"] == "fp8" and r["status"] == "not run"]
        return ("NOT VERIFIED: no FP8 backend ran, so no bytes were compared (exit 3). "
                + "; ".join(skipped))
    return "PASS: every FP8 backend that ran matches the oracle's bytes"


def _label(r: dict[str, Any]) -> str:
    if r["backend"].startswith("oracle") or r["framework"] == "-":
        return r["backend"]
    return f"{r['backend']} from {r['framework']}"


def add_parser(sub) -> None:
    """Register ``woa verify`` with the subcommand parsers ``sub``."""
    v = sub.add_parser(
        "verify", help="cross-framework correctness report (no arguments needed)",
        description="Run the FP8 wo_a chain on every backend that runs here, in torch and JAX, "
        "plus the BF16 chain, against the woa_jax oracle and the float64 truth. Without "
        "--checkpoint the layer is a seeded V4 checkpoint written to a temporary directory "
        "(--keep DIR saves it). " + exit_codes_help(*ExitCode, ok="every FP8 backend that "
        "ran matches the oracle") + ".")
    v.add_argument("--config", choices=("v4-flash", "v4-pro", "v4.1-flash"),
                   help="model shapes (default v4-flash; inferred from --checkpoint)")
    v.add_argument("--tokens", type=int, default=32, help="tokens in the batch (default 32)")
    v.add_argument("--tp", type=int, default=8,
                   help="tensor-parallel degree; rank 0's groups run (default 8: 1 of V4-Flash's "
                        "8 groups, 2 of V4-Pro's 16)")
    v.add_argument("--checkpoint", metavar="PATH", help="a real checkpoint (file or directory)")
    v.add_argument("--keep", metavar="DIR",
                   help="write the embedded checkpoint (with a config.json) to DIR, new or "
                        "empty, for woa inspect DIR or WoAProjection.from_checkpoint(DIR, layer)")
    v.add_argument("--layer", type=int, default=0, help="layer index (default 0)")
    v.add_argument("--layer-kind", choices=("compress", "window"),
                   help="RoPE table of the layer (default: config.json's compress_ratios; "
                        "compress for the embedded layer)")
    v.add_argument("--backends", metavar="LIST",
                   help=f"comma-separated subset of {','.join((*_FP8_BACKENDS, 'bf16'))} "
                        "(default all)")
    v.add_argument("--device", choices=("cpu", "cuda"), help="torch device (default: GPU if any)")
    v.add_argument("--seed", type=int, default=0,
                   help="seed of the attention outputs, positions and embedded weight (default 0)")
    v.add_argument("--json", metavar="FILE", nargs="?", const="-",
                   help="JSON to FILE, or to stdout without FILE")
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``woa verify``: the report as text or JSON; returns the ``ExitCode``."""
    output.check_json_dest(args.json)
    payload = run_verify(args)
    output.write_json(args.json, payload)
    code = ExitCode(payload["exit"])
    if args.json == "-":
        return code
    sh = payload["shapes"]
    title = (f"woa verify: {payload['config']} wo_a, layer {payload['layer']} "
             f"({payload['layer_kind']} rope), tp={payload['tp']} rank 0: G={sh['groups']} "
             f"N={sh['n']} K={sh['k']} block {sh['block']}, {sh['tokens']} tokens at positions "
             f"{payload['positions']['min']}..{payload['positions']['max']}")
    columns = ["backend", "from", "device", "scale =", "fp8 =", "vs f64", "vs BF16", "status"]
    table_rows = [[r["backend"], r["framework"], r["device"], output.pct(r["scale_bytes_equal"]),
                   output.pct(r["fp8_bytes_equal"]), output.sci(r["rel_err_vs_truth"]),
                   output.sci(r["fp8_vs_bf16"]), r["status"]] for r in payload["rows"]]
    details = [f"{_label(r)}: {r['status']}: {r['detail']}" for r in payload["rows"]
               if r["detail"]]
    notes = [
        "scale = / fp8 =: bytes equal to the woa_jax oracle's (bf16 cos/sin, amax floor 1e-8). "
        "vs f64: relative error against the float64 truth. vs BF16: the FP8 output against the "
        "BF16 chain's.",
        *details,
        f"source: {payload['source']}. WoAProjection's auto path here: "
        f"{payload['auto_path']['path']}.",
    ]
    if payload["kept"]:
        kept = payload["kept"]
        notes.append(f"checkpoint kept in {kept}: woa inspect {kept}, or in Python "
                     f"WoAProjection.from_checkpoint({kept!r}, layer={payload['layer']}).")
    output.print_table(title, columns, table_rows, right=(3, 4, 5, 6), notes=notes)
    print()
    output.say(_verdict_line(payload))
    return code

