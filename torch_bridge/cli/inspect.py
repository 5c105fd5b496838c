"""``woa inspect PATH``: each ``wo_a`` of a checkpoint and whether the FP8 path can take it."""

from __future__ import annotations

import argparse
import pathlib
import re
from collections.abc import Callable
from typing import Any

from . import output
from .errors import ExitCode, UsageError, exit_codes_help

#: dtype names as the table shows them.
_SHORT = {"float8_e4m3fn": "e4m3fn", "float8_e4m3fnuz": "e4m3fnuz", "float8_e8m0fnu": "e8m0",
          "bfloat16": "bf16", "float16": "f16", "float32": "f32", "uint8": "u8"}
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class _Meta:
    """Shape and dtype name only: what ``woa_jax.check_wo_a_weight`` reads."""

    def __init__(self, shape: tuple[int, ...], dtype: str):
        self.shape, self.dtype = shape, dtype


def fp8_eligibility(weight_dtype: str, weight_shape: tuple[int, ...], scale_dtype: str | None,
                    scale_shape: tuple[int, ...] | None, *, num_groups: int,
                    tp: int | None = None,
                    load_scale: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Whether a checkpoint ``wo_a`` can take the FP8 path, and why not.

    Args:
      weight_dtype: the weight's dtype name (``woa_jax.checks`` spelling).
      weight_shape: ``[G * N, K]``.
      scale_dtype: the block scale's dtype name, ``None`` when the checkpoint has none.
      scale_shape: ``[G * N / B, K / B]``, or ``None``.
      num_groups: G of the whole layer.
      tp: describe this tensor-parallel split (which must divide G).
      load_scale: returns the scale values; called only for float scales, which must be exact
        powers of two to be restated as E8M0.

    Returns:
      ``{"eligible", "block", "scale_format", "reason"}``.
    """
    import woa_jax

    out: dict[str, Any] = {"eligible": False, "block": None, "scale_format": "missing",
                           "reason": ""}
    if scale_dtype is not None:
        out["scale_format"] = {"float8_e8m0fnu": "E8M0", "uint8": "E8M0 (uint8)"}.get(
            scale_dtype, scale_dtype)
    if weight_dtype not in ("float8_e4m3fn", "float8_e4m3fnuz"):
        scaled = "without a scale" if scale_dtype is None else "with a scale"
        out["reason"] = f"{weight_dtype} weight {scaled}: unquantized, runs the BF16 chain"
        return out
    if scale_dtype is None or scale_shape is None:
        out["reason"] = f"{weight_dtype} weight has no block scale: cannot be dequantized"
        return out
    try:
        n, k, block = woa_jax.check_wo_a_weight(_Meta(weight_shape, weight_dtype),
                                                _Meta(scale_shape, scale_dtype), num_groups)
    except (TypeError, ValueError) as e:
        out["reason"] = str(e)
        return out
    out["block"] = block
    if n % block:
        out["reason"] = f"N={n} is not a multiple of the {block}-row weight block"
        return out
    notes = []
    if scale_dtype not in ("float8_e8m0fnu", "uint8"):
        try:
            woa_jax.e8m0_from_scale(load_scale())
        except (TypeError, ValueError) as e:
            out["reason"] = str(e)
            return out
        out["scale_format"] = f"{scale_dtype} powers of two"
        notes.append(f"{scale_dtype} scales are powers of two, read as E8M0")
    if block != 128:
        notes.append(f"{block}x{block} blocks: triton and torch backends only (AITER's GEMM "
                     "takes 128)")
    if tp is not None:
        g_l = num_groups // tp
        notes.append(f"tp={tp}: {g_l} group(s) per rank, weight [{g_l * n}, {k}], scale "
                     f"[{g_l * n // block}, {k // block}]")
    out["eligible"] = True
    out["reason"] = "; ".join(notes) or "ok"
    return out


def _check_tp(tp: int, groups: int, heads: int, name: str) -> None:
    bad = [f"{what}={v}" for what, v in (("o_groups", groups), ("num_heads", heads)) if v % tp]
    if bad:
        raise UsageError(f"--tp {tp} does not divide {' and '.join(bad)} of {name}; tensor "
                         "parallelism splits whole groups and heads")


def inspect_checkpoint(path: str | pathlib.Path, *, tp: int | None = None) -> dict[str, Any]:
    """Every ``wo_a`` in a checkpoint: shapes, dtypes, block, scale format, FP8 eligibility,
    NaN/Inf in weight or scale, and the RoPE kind ``config.json`` gives each layer.

    Raises:
      CheckpointError: ``path`` does not exist, a file is not readable safetensors or JSON, or
        no ``*.wo_a.weight`` tensor.
      UsageError: ``tp`` does not divide a layer's groups or heads.
    """
    from .. import checkpoint

    p = pathlib.Path(path)
    files = checkpoint.tensor_files(p)
    config = checkpoint.read_config(p) or {}
    stems = sorted((name[: -len(".weight")] for name in files if name.endswith(".wo_a.weight")),
                   key=lambda s: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)])
    if not stems:
        raise checkpoint.CheckpointError(f"no '*.wo_a.weight' tensor in checkpoint {p}")
    layers = []
    for stem in stems:
        wdtype, wshape = checkpoint.tensor_info(files, stem + ".weight")
        sname = next((f"{stem}.{s}" for s in checkpoint.SCALE_KINDS if f"{stem}.{s}" in files),
                     None)
        sdtype, sshape = checkpoint.tensor_info(files, sname) if sname else (None, None)
        groups = config.get("o_groups") or (
            wshape[0] // checkpoint.N_DEFAULT
            if len(wshape) == 2 and wshape[0] % checkpoint.N_DEFAULT == 0 else None)
        if tp is not None and groups is not None:
            _check_tp(tp, groups, config.get("num_attention_heads") or 8 * groups, stem)
        m = _LAYER.search(stem)
        layers.append({"name": stem, "weight_dtype": wdtype, "weight_shape": list(wshape),
                       "scale_name": sname, "scale_dtype": sdtype,
                       "scale_shape": list(sshape) if sshape else None, "groups": groups,
                       "layer_kind": (checkpoint.layer_kind_from_config(p, int(m[1]))
                                      if m else None)})
    for entry in layers:
        _judge(entry, files, tp)
    corrupt = [e["name"] for e in layers if e["corrupt"]]
    return {"command": "inspect", "path": str(p), "tp": tp, "config_json": bool(config),
            "layers": layers, "eligible": sum(1 for e in layers if e["eligible"]),
            "total": len(layers), "corrupt": corrupt}


def _judge(entry: dict[str, Any], files: dict, tp: int | None) -> None:
    """Add NaN/Inf findings and FP8 eligibility to one layer's entry."""
    from .. import checkpoint

    stem, sname = entry["name"], entry["scale_name"]
    try:
        checkpoint.check_wo_a_values(
            checkpoint.load_tensor(files, stem + ".weight"),
            checkpoint.load_tensor(files, sname) if sname else None, where=("weight", "scale"))
        entry["corrupt"] = None
    except checkpoint.NonFiniteTensorError as e:
        entry["corrupt"] = str(e)
    if entry["corrupt"]:
        entry.update(eligible=False, block=None, scale_format=entry["scale_dtype"] or "missing",
                     reason="corrupt: " + entry["corrupt"])
    elif entry["groups"] is None:
        entry.update(eligible=False, block=None, scale_format=entry["scale_dtype"] or "missing",
                     reason=f"cannot tell G: {entry['weight_shape'][0]} rows are not a multiple "
                            f"of {checkpoint.N_DEFAULT}; put a config.json with o_groups beside "
                            "the checkpoint")
    else:
        def load_scale():
            import torch

            return checkpoint.load_tensor(files, sname).to(torch.float64).numpy()

        entry.update(fp8_eligibility(entry["weight_dtype"], tuple(entry["weight_shape"]),
                                     entry["scale_dtype"],
                                     tuple(entry["scale_shape"]) if entry["scale_shape"] else None,
                                     num_groups=entry["groups"], tp=tp, load_scale=load_scale))


def add_parser(sub) -> None:
    """Register ``woa inspect`` with the subcommand parsers ``sub``."""
    i = sub.add_parser("inspect", help="a checkpoint's wo_a layers and their FP8 eligibility",
                       description="Read a checkpoint (safetensors file, or directory with "
                       "shards and index) and report every wo_a: shapes, dtypes, block size, "
                       "scale format, NaN/Inf in weight or scales, and whether the FP8 path can "
                       "take it. " + exit_codes_help(
                           ExitCode.OK, ExitCode.USAGE, ExitCode.CORRUPT,
                           corrupt="a wo_a holds NaN/Inf in its weight or scales") + ".")
    i.add_argument("path", help="checkpoint file or directory")
    i.add_argument("--tp", type=int, help="check this tensor-parallel split")
    i.add_argument("--json", metavar="FILE", nargs="?", const="-",
                   help="JSON to FILE, or to stdout without FILE")
    i.set_defaults(func=run)


def _cell(shape: list[int] | None, dtype: str | None) -> str:
    if dtype is None:
        return "-"
    return "x".join(map(str, shape)) + " " + _SHORT.get(dtype, dtype)


def run(args: argparse.Namespace) -> int:
    """Run ``woa inspect``: the report as text or JSON; returns the ``ExitCode``."""
    output.check_json_dest(args.json)
    if args.tp is not None and args.tp < 1:
        raise UsageError(f"--tp must be a positive integer, got {args.tp}")
    payload = inspect_checkpoint(args.path, tp=args.tp)
    output.write_json(args.json, payload)
    code = ExitCode.CORRUPT if payload["corrupt"] else ExitCode.OK
    if args.json == "-":
        return code
    layers = payload["layers"]
    rows = [[e["name"], _cell(e["weight_shape"], e["weight_dtype"]),
             _cell(e["scale_shape"], e["scale_dtype"]), "yes" if e["eligible"] else "no",
             e["reason"]] for e in layers]
    notes = [f"{payload['eligible']} of {payload['total']} layers can take the FP8 path."]
    if payload["corrupt"]:
        notes.append(f"CORRUPT: {len(payload['corrupt'])} layer(s) hold NaN/Inf in weight or "
                     f"scales: {', '.join(payload['corrupt'])}.")
    unknown = [e["name"] for e in layers if e["layer_kind"] is None]
    if unknown:
        which = "any layer" if len(unknown) == len(layers) else ", ".join(unknown)
        notes.append(f"No config.json compress_ratios gives the RoPE table of {which}: load "
                     "one with WoAProjection.from_checkpoint(path, layer, layer_kind='compress' "
                     "or 'window'), or verify it with woa verify --checkpoint PATH --layer N "
                     "--layer-kind compress|window.")
    tp = f" (tp={args.tp})" if args.tp else ""
    output.print_table(f"wo_a in {payload['path']}{tp}", ["tensor", "weight", "scale", "FP8",
                                                          "why"], rows, notes=notes)
    return code
