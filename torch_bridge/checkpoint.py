"""Read (and write, for tests and ``woa verify``) the ``wo_a`` tensors of safetensors checkpoints.

Names understood:

* DeepSeek native: ``layers.{i}.attn.wo_a.weight`` and ``layers.{i}.attn.wo_a.scale``;
* vLLM / HF: ``model.layers.{i}.self_attn.wo_a.weight`` with ``weight_scale_inv`` (block FP8) or
  ``weight_scale`` (ModelOpt exports); any prefix before ``layers.`` is accepted.

Weights are F8_E4M3 (or BF16/F16/F32 for checkpoints that keep ``wo_a`` unquantized, with no
scale); scales F8_E8M0, U8 (E8M0 bytes) or F32. A checkpoint is one ``.safetensors`` file, or a
directory with ``model.safetensors.index.json`` (``weight_map``: tensor name -> shard file), or a
directory whose ``*.safetensors`` files are all scanned.

Tensor parallelism slices whole groups: rank ``r`` of ``tp`` keeps output rows
``[r * G_l * N, (r + 1) * G_l * N)`` of the ``[G * N, K]`` weight (``G_l = G / tp``) and the
matching whole scale rows. ``G % tp != 0`` is an error, never a truncation.

A missing path, a file that is not readable safetensors, an index or ``config.json`` that is not
valid JSON, a layer the checkpoint does not have (the message lists those it has) and a ``wo_a``
tensor holding NaN/Inf raise ``CheckpointError`` (a ``ValueError``) naming the file and tensor,
so bad data is never mistaken for a backend fault or hidden by a fallback. A layer index that is
not an integer is a ``TypeError``; a config that does not tile the stored weight a ``ValueError``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import operator
import os
import pathlib
import re
from collections.abc import Iterator
from typing import Literal

import torch

from . import _shapes

Naming = Literal["deepseek", "vllm"]
INDEX_FILE = "model.safetensors.index.json"
#: ``o_lora_rank`` (N, outputs per group) of every released DeepSeek V4 config; the group count of
#: a checkpoint without a config is inferred as ``rows / N_DEFAULT``.
N_DEFAULT = 1024

Projection = Literal["wo_a", "wo_b"]
_NAMES = {
    proj: re.compile(
        r"^(?P<prefix>(?:.*\.)?)layers\.(?P<layer>\d+)\.(?P<attn>attn|self_attn)\." + proj
        + r"\.(?P<kind>weight|scale|weight_scale_inv|weight_scale)$")
    for proj in ("wo_a", "wo_b")
}
#: Scale tensor suffixes in order of preference (DeepSeek, then vLLM / ModelOpt names).
SCALE_KINDS = ("scale", "weight_scale_inv", "weight_scale")
#: safetensors dtype tags -> torch / ``woa_jax.checks`` dtype names.
DTYPE_NAMES = {"F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "F8_E5M2": "float8_e5m2",
               "U8": "uint8", "BF16": "bfloat16", "F16": "float16", "F32": "float32",
               "F64": "float64", "I32": "int32", "I64": "int64"}


class CheckpointError(ValueError):
    """A checkpoint file cannot be read, or a ``wo_a`` tensor in it holds impossible values.

    The message names the file (and the tensor and first bad element where there is one).
    """


class NonFiniteTensorError(CheckpointError):
    """A weight or scale holds NaN/Inf (or a float scale is not positive): corrupt data.

    The message names the file, the tensor, the first bad element and what was expected.
    """


@contextlib.contextmanager
def open_shard(file: str | pathlib.Path) -> Iterator:
    """``safetensors.safe_open`` of one shard, with ``CheckpointError`` for unreadable files."""
    from safetensors import SafetensorError, safe_open

    file = pathlib.Path(file)
    if not file.is_file():
        raise CheckpointError(f"{file}: shard file does not exist")
    try:
        fh = safe_open(str(file), framework="pt")
    except SafetensorError as e:
        raise CheckpointError(f"{file}: not a readable safetensors file ({e})") from None
    with fh:
        yield fh


def _read_json(file: pathlib.Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def check_index(value, what: str, *, low: int = 0) -> int:
    """``value`` as an int, else ``TypeError`` (a string ``'0'``, a float, a bool) or, below
    ``low``, ``ValueError``: a layer or rank of the wrong type must not read as a missing one."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    try:
        index = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, got {type(value).__name__} "
                        f"{value!r}") from None
    if index < low:
        raise ValueError(f"{what} must be at least {low}, got {index}")
    return index


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    out, start = [], None
    for i, v in enumerate(values):
        start = v if start is None else start
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(str(v) if v == start else f"{start}-{v}")
            start = None
    return ", ".join(out)


def projection_names(layer: int, proj: Projection = "wo_a",
                     naming: Naming = "deepseek") -> tuple[str, str]:
    """``(weight name, scale name)`` of attention projection ``proj`` of layer ``layer``."""
    if naming == "deepseek":
        return f"layers.{layer}.attn.{proj}.weight", f"layers.{layer}.attn.{proj}.scale"
    if naming == "vllm":
        base = f"model.layers.{layer}.self_attn.{proj}"
        return f"{base}.weight", f"{base}.weight_scale_inv"
    raise ValueError(f"naming must be 'deepseek' or 'vllm', got {naming!r}")


def wo_a_names(layer: int, naming: Naming = "deepseek") -> tuple[str, str]:
    """``(weight name, scale name)`` of layer ``layer``'s ``wo_a`` in the given naming."""
    return projection_names(layer, "wo_a", naming)


def tensor_files(path: str | pathlib.Path) -> dict[str, pathlib.Path]:
    """Map every tensor name of a checkpoint to the shard file holding it."""
    p = pathlib.Path(path)
    if p.is_file():
        files = [p]
    elif (p / INDEX_FILE).is_file():
        weight_map = _read_json(p / INDEX_FILE).get("weight_map")
        if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{p / INDEX_FILE}: no 'weight_map' object of tensor name -> "
                                  "shard file name")
        return {name: p / fname for name, fname in weight_map.items()}
    elif p.is_dir():
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"no *.safetensors files and no {INDEX_FILE} in {p}")
    else:
        raise CheckpointError(f"checkpoint {p} does not exist")
    out: dict[str, pathlib.Path] = {}
    for f in files:
        with open_shard(f) as fh:
            out.update(dict.fromkeys(fh.keys(), f))
    return out


def tensor_info(files: dict[str, pathlib.Path], name: str) -> tuple[str, tuple[int, ...]]:
    """``(dtype name, shape)`` of tensor ``name`` without reading its data."""
    with open_shard(files[name]) as fh:
        sl = fh.get_slice(name)
        tag = sl.get_dtype()
        return DTYPE_NAMES.get(tag, tag), tuple(int(d) for d in sl.get_shape())


def load_tensor(files: dict[str, pathlib.Path], name: str) -> torch.Tensor:
    """Tensor ``name`` on the CPU."""
    with open_shard(files[name]) as fh:
        return fh.get_tensor(name)


def check_wo_a_values(weight: torch.Tensor, scale: torch.Tensor | None, *,
                      where: tuple[str, str | None]) -> None:
    """Raise ``NonFiniteTensorError`` when a ``wo_a`` weight or its scale holds corrupt values.

    An fp8 weight with a scale is checked by ``woa_jax.checks.check_wo_a_weight_values`` (NaN
    fp8 bytes, the E8M0 NaN byte, NaN/Inf/non-positive float scales); an unquantized float weight
    must be finite. Such data has no right answer on any path, so it is an error, not a fallback.

    Args:
      weight: ``[R, K]`` as read from the checkpoint.
      scale: its block scale, or ``None``.
      where: how to name the weight and the scale in the message (file and tensor name).
    """
    from woa_jax import checks

    try:
        if scale is not None and weight.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
            checks.check_wo_a_weight_values(weight, scale, names=(where[0], where[1] or "scale"))
        elif scale is None and weight.is_floating_point() and weight.element_size() > 1:
            bad = ~torch.isfinite(weight)
            if bool(bad.any()):
                idx = [int(i) for i in bad.nonzero()[0]]
                raise ValueError(f"{where[0]}: element {idx} = {float(weight[tuple(idx)])!r}; "
                                 "expected finite values, so the checkpoint is corrupt")
    except ValueError as e:
        raise NonFiniteTensorError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class WoATensors:
    """One rank's ``wo_a`` slice as read from a checkpoint."""

    #: ``[G_l * N, K]`` (fp8 or an unquantized float dtype).
    weight: torch.Tensor
    #: ``[G_l * N / B, K / B]`` scale (F8_E8M0 / U8 / F32), ``None`` for unquantized weights.
    scale: torch.Tensor | None
    #: Groups of the whole layer (all ranks) and of this rank.
    num_groups: int
    local_groups: int
    weight_name: str
    scale_name: str | None


def find_projection(files: dict[str, pathlib.Path], layer: int,
                    proj: Projection = "wo_a") -> tuple[str, str | None]:
    """The weight and scale names of layer ``layer``'s ``proj`` (scale ``None`` when absent).

    Accepts DeepSeek names (``layers.{i}.attn.{proj}.{weight,scale}``) and vLLM / ModelOpt names
    (``...layers.{i}.self_attn.{proj}.{weight,weight_scale_inv,weight_scale}``).

    Raises:
      TypeError: ``layer`` is not an integer.
      CheckpointError: no ``proj`` weight for ``layer``; the message lists the layers that have
        one.
    """
    layer = check_index(layer, "layer")
    weights, scales, present = {}, {}, set()
    for name in files:
        m = _NAMES[proj].match(name)
        if m is not None and m["kind"] == "weight":
            present.add(int(m["layer"]))
        if m is None or int(m["layer"]) != layer:
            continue
        stem = name.rsplit(".", 1)[0]
        if m["kind"] == "weight":
            weights[stem] = name
        else:
            scales.setdefault(stem, {})[m["kind"]] = name
    if not weights:
        expect = " or ".join(projection_names(layer, proj, n)[0] for n in ("deepseek", "vllm"))
        have = (f"layers with one: {_ranges(sorted(present))}" if present
                else f"it has none (expected names like {expect})")
        raise CheckpointError(f"no {proj} weight for layer {layer} in the checkpoint; {have}")
    if len(weights) > 1:
        raise ValueError(f"layer {layer} has several {proj} weights: {sorted(weights.values())}")
    stem, wname = next(iter(weights.items()))
    found = scales.get(stem, {})
    sname = next((found[k] for k in SCALE_KINDS if k in found), None)
    return wname, sname


def find_wo_a(files: dict[str, pathlib.Path], layer: int) -> tuple[str, str | None]:
    """``find_projection`` for ``wo_a``."""
    return find_projection(files, layer, "wo_a")


def read_wo_a(path: str | pathlib.Path, layer: int, *, tp_rank: int = 0, tp_size: int = 1,
              num_groups: int | None = None, config=None) -> WoATensors:
    """Read one tensor-parallel rank's ``wo_a`` weight and scale of layer ``layer``.

    Only the rank's rows are read from disk (safetensors slices), after the shapes are checked.

    Args:
      path: checkpoint file or directory (see the module docstring).
      layer: layer index ``i`` in ``layers.{i}``.
      tp_rank, tp_size: the rank and the tensor-parallel degree; ``tp_size`` must divide G.
      num_groups: G of the stored weight; default ``config.o_groups``, else ``o_groups`` of a
        ``config.json`` beside the checkpoint, else ``rows / 1024`` (``N_DEFAULT``, every
        released V4 config). Pass it for scaled-down checkpoints.
      config: a ``woa_jax.DSV4Config`` or name the stored weight must match (``_shapes``).

    Returns:
      A ``WoATensors`` on the CPU.

    Raises:
      TypeError: ``layer``, ``tp_rank``, ``tp_size`` or ``num_groups`` is not an integer.
      CheckpointError: a missing path, a file that is not readable safetensors, an index that
        is not valid JSON, or no ``wo_a`` weight for ``layer`` (the layers present are listed).
      NonFiniteTensorError: the weight or scale slice holds NaN/Inf, or a float scale is not
        positive (a ``CheckpointError``).
      ValueError: shapes that do not split into ``num_groups`` groups or ``tp_size`` ranks, or
        that disagree with ``config``.
    """
    tp_size = check_index(tp_size, "tp_size", low=1)
    tp_rank = check_index(tp_rank, "tp_rank")
    if tp_rank >= tp_size:
        raise ValueError(f"tp_rank must be an integer in [0, {tp_size}), got {tp_rank!r}")
    cfg = None if config is None else _config(config)
    if num_groups is not None:
        num_groups = check_index(num_groups, "num_groups", low=1)
    files = tensor_files(path)
    wname, sname = find_wo_a(files, layer)
    what = f"{files[wname]}: {wname}"
    with open_shard(files[wname]) as fh:
        shape = tuple(fh.get_slice(wname).get_shape())
    if len(shape) != 2:
        raise ValueError(f"{what} must be 2-D [G * N, K], got shape {shape}")
    rows, k = shape
    block = None
    if sname is not None:
        with open_shard(files[sname]) as fh:
            sshape = tuple(fh.get_slice(sname).get_shape())
        if len(sshape) != 2 or sshape[1] < 1 or k % sshape[1] != 0:
            raise ValueError(f"{sname} of shape {sshape} does not tile {wname} {shape}")
        block = k // sshape[1]
    g, source = _stored_groups(path, rows, num_groups, cfg)
    if rows % g != 0:
        raise ValueError(f"{what} has {rows} rows, which is not {source}={g} whole groups"
                         + ("; pass num_groups=" if num_groups is None else ""))
    _shapes.check_wo_a(rows, k, block, g, cfg, what=what)
    if g % tp_size != 0:
        raise ValueError(
            f"o_groups={g} is not divisible by tp_size={tp_size}; tensor parallelism splits "
            f"whole groups, so tp_size must divide {g}"
        )
    g_l = g // tp_size
    r0, r1 = tp_rank * g_l * (rows // g), (tp_rank + 1) * g_l * (rows // g)
    # A rank must own whole scale blocks; TP1 keeps a ragged last block as it is.
    if block is not None and tp_size > 1 and (r0 % block or (r1 - r0) % block):
        raise ValueError(f"a tp_size={tp_size} rank holds {r1 - r0} weight rows, not whole "
                         f"{block}-row scale blocks")
    with open_shard(files[wname]) as fh:
        weight = fh.get_slice(wname)[r0:r1]
    scale = None
    if sname is not None:
        with open_shard(files[sname]) as fh:
            scale = fh.get_slice(sname)[r0 // block:-(-r1 // block)]
    check_wo_a_values(weight, scale, where=(f"{files[wname]}: {wname}",
                                            sname and f"{files[sname]}: {sname}"))
    return WoATensors(weight=weight, scale=scale, num_groups=g, local_groups=g_l,
                      weight_name=wname, scale_name=sname)


def load_wo_a_layer(path: str | pathlib.Path, layer: int, tp_rank: int = 0, tp_size: int = 1, *,
                    config=None, num_groups: int | None = None, layer_kind: str | None = None,
                    cos_cache=None, sin_cache=None, max_positions: int | None = None,
                    device=None) -> tuple[WoATensors, torch.Tensor, torch.Tensor, object]:
    """What ``WoAProjection.from_checkpoint`` builds a layer from (its arguments and errors):
    ``(tensors, cos_cache, sin_cache, config)``, on ``device``. ``config`` is the one given,
    else the released config the stored shapes match when the RoPE tables are built here."""
    import woa_jax

    from . import interop, ops

    device = None if device is None else ops.usable_device(device)
    cfg = None if config is None else _config(config)
    t = read_wo_a(path, layer, tp_rank=tp_rank, tp_size=tp_size, num_groups=num_groups,
                  config=cfg)
    if (cos_cache is None) != (sin_cache is None):
        raise ValueError("pass both cos_cache and sin_cache, or neither")
    if cos_cache is None:
        if cfg is None:
            rows, k = t.num_groups * t.weight.shape[0] // t.local_groups, int(t.weight.shape[1])
            cfg = _shapes.infer_config(rows, k, k // int(t.scale.shape[1])
                                       if t.scale is not None else None)
        kind = layer_kind or layer_kind_from_config(path, layer)
        if kind is None:
            raise ValueError(f"layer {layer}: cannot tell its RoPE table; pass "
                             "layer_kind='compress' or 'window' (or cos_cache/sin_cache), or put "
                             "a config.json with compress_ratios beside the checkpoint")
        cos_j, sin_j = woa_jax.rope_cos_sin(cfg, kind, max_positions)
        cos_cache, sin_cache = interop.to_torch(cos_j), interop.to_torch(sin_j)
    if device is not None:
        t = dataclasses.replace(t, weight=t.weight.to(device),
                                scale=None if t.scale is None else t.scale.to(device))
        cos_cache = interop.to_torch(cos_cache).to(device)
        sin_cache = interop.to_torch(sin_cache).to(device)
    return t, cos_cache, sin_cache, cfg


def _config(config):
    import woa_jax

    return woa_jax.get_config(config)


def _stored_groups(path, rows: int, num_groups: int | None, cfg) -> tuple[int, str]:
    """G of the stored weight and where it came from (named in errors)."""
    if num_groups is not None:
        return num_groups, "num_groups"
    if cfg is not None:
        return cfg.o_groups, f"{cfg.name}'s o_groups"
    stored = (read_config(path) or {}).get("o_groups")
    if isinstance(stored, int) and not isinstance(stored, bool) and stored > 0:
        return stored, "config.json's o_groups"
    if rows % N_DEFAULT:
        raise ValueError(f"{rows} weight rows are not whole groups of N={N_DEFAULT}; pass "
                         "num_groups=")
    return rows // N_DEFAULT, f"rows / {N_DEFAULT}"


def layer_kind_from_config(path: str | pathlib.Path, layer: int) -> str | None:
    """``"compress"``/``"window"`` from a ``config.json`` beside the checkpoint, if it says.

    Reads ``compress_ratios[layer]`` (ratio > 1: compressed-attention layer); ``None`` when there
    is no config or no such field.

    Raises:
      CheckpointError: ``config.json`` is not a valid JSON object.
    """
    cfg = read_config(path)
    if cfg is None:
        return None
    ratios = cfg.get("compress_ratios")
    if not isinstance(ratios, list) or not 0 <= layer < len(ratios):
        return None
    return "compress" if (ratios[layer] or 1) > 1 else "window"


def read_config(path: str | pathlib.Path) -> dict | None:
    """The ``config.json`` beside a checkpoint (file or directory), or ``None`` without one.

    Raises:
      CheckpointError: the file is not a valid JSON object.
    """
    p = pathlib.Path(path)
    cfg = (p if p.is_dir() else p.parent) / "config.json"
    return _read_json(cfg) if cfg.is_file() else None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_checkpoint(path: str | pathlib.Path, tensors: dict[str, torch.Tensor], *,
                    shards: int = 1) -> list[pathlib.Path]:
    """Write ``tensors`` as safetensors into directory ``path``, round-robin over ``shards`` files.

    With ``shards > 1`` the files are ``model-0000i-of-0000n.safetensors`` plus
    ``model.safetensors.index.json``; with one shard, ``model.safetensors``. Shards get the mode
    of any file this process creates (``0o666`` less the umask), like the index; safetensors
    alone would leave them private to the owner.
    """
    from safetensors.torch import save_file

    if not isinstance(shards, int) or not 1 <= shards <= max(1, len(tensors)):
        raise ValueError(f"shards must be in [1, {max(1, len(tensors))}], got {shards!r}")
    p = pathlib.Path(path)
    p.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    if shards == 1:
        out = p / "model.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out))
        out.chmod(0o666 & ~_umask())
        return [out]
    written, weight_map = [], {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k].contiguous() for k in names[i::shards]}
        save_file(part, str(p / fname))
        (p / fname).chmod(0o666 & ~_umask())
        weight_map.update({k: fname for k in part})
        written.append(p / fname)
    (p / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return written


def save_wo_a_layer(path: str | pathlib.Path, layer: int, weight: torch.Tensor,
                    scale: torch.Tensor | None, *, naming: Naming = "deepseek",
                    shards: int = 1, scale_name: str | None = None,
                    extra: dict[str, torch.Tensor] | None = None) -> list[pathlib.Path]:
    """Write one layer's ``wo_a`` weight (and scale) as a small checkpoint in directory ``path``.

    Args:
      path: output directory (created).
      layer: layer index.
      weight: ``[G * N, K]``, usually float8_e4m3fn; scale: ``[G * N / B, K / B]``
        float8_e8m0fnu / uint8 / float32, or ``None`` for an unquantized weight.
      naming: ``"deepseek"`` or ``"vllm"`` (``weight_scale_inv``).
      shards: split over this many files with an index JSON (``> 1`` needs ``extra`` tensors or a
        scale to fill the shards).
      scale_name: override the scale tensor's name (e.g. a ``...weight_scale`` export).
      extra: further tensors written alongside (e.g. unrelated layers).

    Returns:
      The files written.
    """
    wname, sname = wo_a_names(layer, naming)
    tensors = {wname: weight}
    if scale is not None:
        tensors[scale_name or sname] = scale
    tensors.update(extra or {})
    return save_checkpoint(path, tensors, shards=shards)
