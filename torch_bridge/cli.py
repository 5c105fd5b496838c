"""The ``woa`` command (also ``python -m torch_bridge``).

Subcommands:

* ``woa verify``: the cross-framework correctness report. With no arguments it writes a seeded
  DeepSeek V4-Flash ``wo_a`` layer as a real safetensors checkpoint (FP8 e4m3fn weight, E8M0
  128x128 scales), loads it back through ``WoAProjection.from_checkpoint``, builds attention
  outputs with post-softmax magnitudes on the real V4 rope table, runs the FP8 chain on every
  backend that runs here, from torch and from JAX, plus the BF16 chain, and prints one table.
  Exit 1 when an FP8 backend's scale or fp8 bytes differ from the ``woa_jax`` oracle.
* ``woa bench``: the benchmark harness (``benchmarks.bench``), arguments forwarded.
* ``woa probe``: every backend, whether it runs here and why not, with versions and device.
* ``woa inspect PATH``: each layer's ``wo_a`` in a checkpoint and whether the FP8 path can take it.
* ``woa conformance MODULE:FUNCTION``: the ``woa_jax.conformance`` sweep on another project's
  implementation with AITER's signature (torch tensors in and out). Exit 1 on a contract break.

Exit codes: 0 success, 1 a correctness contract is broken, 2 a usage error (one line on stderr,
``woa: error: ...``; ``--debug`` shows the traceback instead).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import math
import os
import pathlib
import platform
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

#: Errors a user can cause (bad path, missing layer, bad shape or argument): one line, exit 2.
_USER_ERRORS = (OSError, ValueError, KeyError, TypeError, ImportError)
EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2

_FP8_BACKENDS = ("aiter", "triton", "torch")
_QUANT, _GEMM = "inverse_rope_group_quant", "batched_gemm_a8w8_mxscale"
#: safetensors dtype tags -> the names ``woa_jax.checks`` uses.
_ST_DTYPES = {"F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu", "U8": "uint8",
              "BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64",
              "I32": "int32", "I64": "int64", "F8_E5M2": "float8_e5m2"}


class UsageError(ValueError):
    """A command-line mistake the user can fix; printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``woa verify: error: ...``) instead of usage + message."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ----------------------------------------------------------------------------- output helpers


def _console(file=None):
    from rich.console import Console

    file = file or sys.stdout
    # Not a terminal (pipes, CI logs, tests): wide enough that tables never wrap.
    return Console(file=file, width=None if file.isatty() else 200, highlight=False)


def _has_rich() -> bool:
    return importlib.util.find_spec("rich") is not None


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], *,
                caption: str | None = None, right: Sequence[int] = ()) -> None:
    """One table on stdout: rich when installed, else aligned plain text."""
    if _has_rich():
        from rich import box
        from rich.markup import escape
        from rich.table import Table

        console = _console()
        console.print(f"[bold]{escape(title)}[/]", soft_wrap=True)
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for i, c in enumerate(columns):
            table.add_column(escape(c), justify="right" if i in right else "left")
        for r in rows:
            table.add_row(*(escape(str(v)) for v in r))
        console.print(table)
        if caption:
            console.print(escape(caption), soft_wrap=True)
        return
    widths = [max(len(str(c)), *(len(str(r[i])) for r in rows)) for i, c in enumerate(columns)]
    print(title)
    print("  ".join(str(c).ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)))
    if caption:
        print(caption)


def _say(text: str) -> None:
    if _has_rich():
        _console().print(text, soft_wrap=True)
    else:
        print(re.sub(r"\[/?[a-z ]+\]", "", text))


def _check_json_dest(dest: str | None) -> None:
    """Fail before the work, not after it, when ``--json FILE`` cannot be written."""
    if dest in (None, "-"):
        return
    parent = pathlib.Path(dest).resolve().parent
    if not parent.is_dir():
        raise FileNotFoundError(f"--json {dest}: directory {parent} does not exist")


def _write_json(dest: str | None, payload: dict) -> None:
    if dest is None:
        return
    text = json.dumps(payload, indent=1, default=str)
    if dest == "-":
        print(text)
    else:
        pathlib.Path(dest).write_text(text + "\n")


def _pct(frac: float | None) -> str:
    if frac is None:
        return "-"
    if frac == 1.0:
        return "100 %"
    return f"{100 * frac:.3f} %"


def _sci(v: float | None) -> str:
    return "-" if v is None else f"{v:.2e}"


def _ms(sec: float | None) -> str:
    if sec is None:
        return "-"
    return f"{sec * 1e3:.1f} ms" if sec < 10 else f"{sec:.1f} s"


# ----------------------------------------------------------------------------- environment


def versions() -> dict[str, str | None]:
    """Python and package versions (``None`` when a package is absent); imports nothing heavy."""
    from importlib import metadata

    from . import _capability

    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("woa", "torch", "jax", "jaxlib", "triton", "numpy", "ml_dtypes", "safetensors"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    out["aiter"] = _capability.aiter_version()
    return out


def device_info() -> dict[str, Any]:
    """The accelerator torch sees (name, arch, runtime), or the CPU."""
    import torch

    from . import _capability

    info: dict[str, Any] = {"cpu": platform.machine(), "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        info.update(
            device="cuda",
            name=torch.cuda.get_device_name(0),
            count=torch.cuda.device_count(),
            arch=_capability.gpu_arch(),
            runtime=(f"ROCm {torch.version.hip}" if _capability.is_rocm_build()
                     else f"CUDA {torch.version.cuda}"),
        )
    else:
        info.update(device="cpu", name=f"{platform.machine()} CPU, {os.cpu_count()} cores",
                    count=0, arch=None, runtime=None)
    return info


def _env_gates() -> dict[str, str]:
    from ._capability import ENV_VARS

    names = sorted(set(ENV_VARS) | {k for k in os.environ if k.startswith("WOA_")}
                   | {"TRITON_INTERPRET"})
    return {k: os.environ.get(k, "(unset)") for k in names}


# ----------------------------------------------------------------------------- FP8 eligibility


def fp8_eligibility(weight_dtype: str, weight_shape: tuple[int, ...], scale_dtype: str | None,
                    scale_shape: tuple[int, ...] | None, *, num_groups: int,
                    num_heads: int | None = None, tp: int | None = None,
                    load_scale: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Whether a checkpoint ``wo_a`` can take the FP8 path, and why not.

    Args:
      weight_dtype, weight_shape: the weight's dtype name (``woa_jax.checks`` spelling) and
        ``[G * N, K]`` shape.
      scale_dtype, scale_shape: the block scale's, or ``None`` when the checkpoint has none.
      num_groups: G of the whole layer.
      num_heads: H of the whole layer (default ``8 * G``, every released config).
      tp: check this tensor-parallel split too.
      load_scale: returns the scale values; called only for float scales, which must be exact
        powers of two to be restated as E8M0.

    Returns:
      ``{"eligible", "block", "scale_format", "reason"}``.
    """
    import woa_jax

    class _Meta:  # the checks read .shape and .dtype only
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, dtype

    out: dict[str, Any] = {"eligible": False, "block": None, "scale_format": "missing",
                           "reason": ""}
    if scale_dtype is not None:
        out["scale_format"] = {"float8_e8m0fnu": "E8M0", "uint8": "E8M0 (uint8)"}.get(
            scale_dtype, scale_dtype)
    if weight_dtype not in ("float8_e4m3fn", "float8_e4m3fnuz"):
        out["reason"] = (f"{weight_dtype} weight" + (" without a scale" if scale_dtype is None
                                                     else " with a scale")
                         + ": unquantized, runs the BF16 chain")
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
    if scale_dtype not in ("float8_e8m0fnu", "uint8"):
        try:
            woa_jax.e8m0_from_scale(load_scale())
            out["scale_format"] = f"{scale_dtype} powers of two"
        except (TypeError, ValueError) as e:
            out["reason"] = str(e)
            return out
    notes = []
    if block != 128:
        notes.append(f"{block}x{block} blocks: triton and torch backends only (AITER's GEMM "
                     "takes 128)")
    if tp is not None:
        heads = num_heads if num_heads is not None else 8 * num_groups
        bad = [f"{what}={v}" for what, v in (("o_groups", num_groups), ("num_heads", heads))
               if v % tp]
        if bad:
            out["reason"] = (f"tp={tp} does not divide {' and '.join(bad)}; tensor parallelism "
                             "splits whole groups and heads")
            return out
        g_l = num_groups // tp
        notes.append(f"tp={tp}: {g_l} group(s) per rank, weight [{g_l * n}, {k}], scale "
                     f"[{g_l * n // block}, {k // block}]")
    out["eligible"] = True
    out["reason"] = "; ".join(notes) or "ok"
    return out


# ----------------------------------------------------------------------------- verify


def _attention_outputs(rng, tokens: int, heads: int, positions, cos32, sin32, *,
                       head_dim: int = 512, keys: int = 256):
    """``o [T, H, Dh]`` bf16 as attention produces it: softmax-weighted sums of cached values.

    DeepSeek V4 attention has one KV head shared by all query heads, and each cached entry is both
    key and value, so its rope tail carries the forward rotation of its own position. Query ``t``
    attends causally to the entries at positions ``<= positions[t]``; its logits are random with
    a spread that gives peaked softmax rows.
    """
    import jax.numpy as jnp
    import numpy as np

    import woa_jax

    key_pos = np.sort(rng.integers(0, max(int(positions.max()), 1) + 1, size=keys))
    key_pos[0] = 0
    kv = rng.standard_normal((keys, 1, head_dim), dtype=np.float32)
    rows = jnp.asarray(key_pos.astype(np.int32))  # gather the table rows once: [L, rd / 2]
    kv = woa_jax.forward_rope(jnp.asarray(kv, jnp.bfloat16), jnp.arange(keys, dtype=jnp.int32),
                              cos32[rows], sin32[rows], out_dtype=jnp.float32)
    kv = np.asarray(kv)[:, 0, :]
    logits = rng.standard_normal((tokens, heads, keys), dtype=np.float32) * np.float32(3.0)
    logits = np.where(key_pos[None, None, :] > positions[:, None, None], -np.inf, logits)
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("thl,ld->thd", p, kv).astype(np.float32)


def _embedded_checkpoint(directory: pathlib.Path, cfg, layer: int, seed: int) -> None:
    """A seeded ``wo_a`` layer of ``cfg``'s full shape, quantized the way checkpoints are.

    Real-valued weights ``~ N(0, 0.02)`` are cut into 128x128 (V4.1: 32x32) blocks; each block
    gets the round-up E8M0 scale of its amax and an e4m3fn payload. Written as F8_E4M3 +
    F8_E8M0 tensors named ``layers.{layer}.attn.wo_a.{weight,scale}``.
    """
    import numpy as np
    import torch

    import woa_jax

    from .checkpoint import save_wo_a_layer

    rows, k, b = cfg.o_groups * cfg.o_lora_rank, cfg.group_in_features, cfg.block_size
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, k, generator=gen) * 0.02
    w *= torch.exp2(torch.randint(-2, 3, (rows // b, 1, k // b, 1), generator=gen)).expand(
        -1, b, -1, b).reshape(rows, k)  # blocks differ in magnitude, as trained weights do
    blocks = w.reshape(rows // b, b, k // b, b)
    amax = blocks.abs().amax(dim=(1, 3))
    _, byte = woa_jax.e8m0_scale(amax.numpy())
    scale = torch.from_numpy(np.array(byte))  # uint8 [rows / b, k / b], on the host
    inv = torch.exp2(127.0 - scale.to(torch.float32))[:, None, :, None]
    payload = (blocks * inv).reshape(rows, k).to(torch.float8_e4m3fn)
    save_wo_a_layer(directory, layer, payload, scale.view(torch.float8_e8m0fnu))


def _sync(x) -> None:
    if hasattr(x, "block_until_ready"):
        x.block_until_ready()
    elif type(x).__module__.startswith("torch") and x.device.type == "cuda":
        import torch

        torch.cuda.synchronize()


def _timed(fn: Callable[[], tuple]) -> tuple[tuple, float]:
    """Run once (compile, caches, result), then time a second run."""
    out = fn()
    _sync(out[0])
    t0 = time.perf_counter()
    _sync(fn()[0])
    return out, time.perf_counter() - t0


def run_verify(args) -> dict[str, Any]:
    """The work of ``woa verify``; returns the JSON payload (``payload["ok"]`` is the verdict)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    import woa_jax
    from woa_jax.conformance import raised_summary
    from woa_jax.testing import TOLERANCES, bytes_equal_fraction, relative_error, to_numpy

    from . import _dispatch, checkpoint, ops
    from ._dispatch import BackendUnavailableError
    from .interop import to_jax, to_torch
    from .projection import WoAProjection

    t_start = time.perf_counter()
    if args.tokens < 1:
        raise UsageError(f"--tokens must be at least 1, got {args.tokens}")
    if args.layer < 0:
        raise UsageError(f"--layer must be non-negative, got {args.layer}")
    wanted = _backend_list(args.backends, _FP8_BACKENDS + ("bf16",))
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no GPU")
    cfg = woa_jax.get_config(args.config) if args.config else None
    with tempfile.TemporaryDirectory(prefix="woa-verify-") as tmp:
        if args.checkpoint is None:
            cfg = cfg or woa_jax.get_config("v4-flash")
            woa_jax.local_shapes(cfg, args.tp)  # a bad --tp fails before the checkpoint is built
            path = pathlib.Path(tmp)
            _embedded_checkpoint(path, cfg, args.layer, args.seed)
            layer_kind = args.layer_kind or "compress"
            source = f"embedded seeded {cfg.name} checkpoint (safetensors, F8_E4M3 + F8_E8M0)"
        else:
            path = pathlib.Path(args.checkpoint)
            if not path.exists():
                raise FileNotFoundError(f"checkpoint {path} does not exist")
            layer_kind = args.layer_kind or checkpoint.layer_kind_from_config(path, args.layer)
            if layer_kind is None:
                raise UsageError(
                    f"layer {args.layer}: no config.json with compress_ratios beside {path} "
                    "tells its RoPE table; pass --layer-kind compress or --layer-kind window")
            source = str(path)
        num_groups = cfg.o_groups if cfg is not None else None
        raw = checkpoint.read_wo_a(path, args.layer, tp_rank=0, tp_size=args.tp,
                                   num_groups=num_groups)
        if raw.scale is None:
            raise UsageError(
                f"layer {args.layer}: wo_a is {str(raw.weight.dtype).removeprefix('torch.')} "
                "without a scale, so there is no FP8 chain to verify (`woa inspect` lists every "
                "layer)")
        proj = WoAProjection.from_checkpoint(path, args.layer, 0, args.tp, config=cfg,
                                             num_groups=num_groups, layer_kind=layer_kind,
                                             device=device)
    g, n, k, p_rows = proj.num_groups, proj.n, proj.k, int(proj.cos_cache.shape[0])
    head_dim = 512
    heads = g * k // head_dim
    rng = np.random.default_rng(args.seed)
    # A decode batch from requests of all context lengths: log-uniform over [1, P), plus 0.
    positions = np.exp(rng.uniform(0, math.log(p_rows - 1), size=args.tokens)).astype(np.int64)
    positions[0] = 0
    jax_device = jax.devices()[0]

    def jx(t):  # torch -> JAX array on JAX's default device, where o lives
        return jax.device_put(to_jax(t.cpu()), jax_device)

    cos32_j, sin32_j = jx(proj.cos_cache), jx(proj.sin_cache)
    o32 = _attention_outputs(rng, args.tokens, heads, positions, cos32_j, sin32_j,
                             head_dim=head_dim)
    o_j = jax.device_put(jnp.asarray(o32, jnp.bfloat16), jax_device)
    pos_j = jax.device_put(jnp.asarray(positions.astype(np.int32)), jax_device)
    # AITER's FP8 path rotates with bf16 cos/sin (vLLM converts the table once); every FP8 row
    # uses them, which also makes the bytes independent of FMA contraction.
    cos_bf_j, sin_bf_j = cos32_j.astype(jnp.bfloat16), sin32_j.astype(jnp.bfloat16)
    w2d_j, s2d_j = jx(raw.weight), jx(raw.scale)
    jax_dev = str(jax_device.platform)

    fp8_ok = fp8_eligibility(
        str(raw.weight.dtype).removeprefix("torch."), tuple(raw.weight.shape),
        str(raw.scale.dtype).removeprefix("torch."), tuple(raw.scale.shape), num_groups=g,
        load_scale=lambda: raw.scale.to(torch.float64).numpy())
    # The float64 truth reads only the T table rows in use (converting all P rows to float64
    # would dominate the run).
    truth = woa_jax.wo_a_truth(o_j, jnp.arange(args.tokens, dtype=jnp.int32), cos32_j[pos_j],
                               sin32_j[pos_j], w2d_j, s2d_j, g)
    # References run jitted: one compile instead of one per primitive (seconds on a small CPU).
    bf16_ref = jax.jit(woa_jax.wo_a_bf16, static_argnums=6)
    (y_bf16_ref,), t_bf16_ref = _timed(lambda: (bf16_ref(o_j, pos_j, cos32_j, sin32_j, w2d_j,
                                                         s2d_j, g),))
    rows: list[dict[str, Any]] = []

    def row(backend, framework, dev, chain, **kw) -> dict[str, Any]:
        r = {"backend": backend, "framework": framework, "device": dev, "chain": chain,
             "scale_bytes_equal": None, "fp8_bytes_equal": None, "rel_err_vs_truth": None,
             "fp8_vs_bf16": None, "rel_err_vs_oracle": None, "seconds": None, "status": "ok"}
        r.update(kw)
        rows.append(r)
        return r

    gemm_tol = TOLERANCES["gemm_bf16"].rel
    row("oracle bf16", "jax", jax_dev, "bf16", rel_err_vs_truth=relative_error(y_bf16_ref, truth),
        seconds=t_bf16_ref, status="BF16 reference")
    ref = None
    if fp8_ok["eligible"]:
        w_j, ws_j = woa_jax.wo_a_weight_e8m0(w2d_j, s2d_j, g)
        block = fp8_ok["block"]

        # bf16 cos/sin make every rotation product exact in fp32, so the bytes are the same
        # jitted or eager, with or without FMA contraction. Quant and GEMM are two jitted calls
        # on purpose: fused into one, XLA on GPUs may feed the GEMM the unrounded activations
        # (xla_allow_excess_precision), i.e. skip the fp8 rounding being verified.
        quant = jax.jit(functools.partial(woa_jax.inverse_rope_group_quant, num_groups=g,
                                          quant_group_size=block, fp8_dtype=w_j.dtype))
        gemm = jax.jit(woa_jax.batched_gemm_a8w8_mxscale)

        def oracle():
            x, xs = quant(o_j, pos_j, cos_bf_j, sin_bf_j)
            return gemm(x, w_j, xs, ws_j), x, xs

        ref, t_ref = _timed(oracle)
        row("oracle", "jax", jax_dev, "fp8", scale_bytes_equal=1.0, fp8_bytes_equal=1.0,
            rel_err_vs_truth=relative_error(ref[0], truth),
            fp8_vs_bf16=relative_error(ref[0], y_bf16_ref), rel_err_vs_oracle=0.0,
            seconds=t_ref, status="byte reference")
    else:
        row("oracle", "jax", jax_dev, "fp8", status=f"not run: {fp8_ok['reason']}")

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
            try:
                (y, x, xs), sec = _timed(fp8_chain(name, framework))
            except BackendUnavailableError as e:
                why = "not run: " + str(e).split(": ", 1)[-1]
                if framework == "torch":  # the backend cannot run here at all: one row
                    row(name, "-", "-", "fp8", status=why)
                    break
                row(name, framework, dev, "fp8", status=why)
                continue
            except Exception as e:  # noqa: BLE001 - an available backend that fails breaks
                row(name, framework, dev, "fp8", status=f"BREAK: {raised_summary(e)}")
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
            row(name, framework, dev, "fp8", scale_bytes_equal=scale_eq, fp8_bytes_equal=fp8_eq,
                rel_err_vs_truth=relative_error(y, truth),
                fp8_vs_bf16=relative_error(y, y_bf16_ref), rel_err_vs_oracle=vs_oracle,
                seconds=sec, status=("BREAK: " + ", ".join(problems)) if problems else "ok")

    if "bf16" in wanted:
        # The same checkpoint tensors with the BF16 chain forced (fp32 cos/sin, as upstream).
        bf16_proj = WoAProjection.from_tensors(raw.weight.to(device), raw.scale.to(device), g,
                                               proj.cos_cache.to(device),
                                               proj.sin_cache.to(device), backend="bf16")
        for framework, o_in, pos_in in (("torch", o_t, pos_t), ("jax", o_j, pos_j)):
            dev = device if framework == "torch" else jax_dev
            try:
                (y,), sec = _timed(lambda o_in=o_in, pos_in=pos_in: (bf16_proj(o_in, pos_in),))
            except BackendUnavailableError as e:
                row("bf16", framework, dev, "bf16", status="not run: " + str(e))
                continue
            y = to_numpy(y)
            vs_ref = relative_error(y, y_bf16_ref)
            row("bf16", framework, dev, "bf16", rel_err_vs_truth=relative_error(y, truth),
                rel_err_vs_oracle=vs_ref, seconds=sec,
                status="ok" if vs_ref <= gemm_tol else
                f"BREAK: output {vs_ref:.1e} from the oracle's BF16 chain (> {gemm_tol:g})")

    broken = [r for r in rows if r["status"].startswith("BREAK")]
    auto = {"path": proj.path, "reason": proj.fallback_reason}
    return {
        "command": "verify",
        "ok": not broken,
        "source": source,
        "config": getattr(cfg, "name", None) or _config_name(proj),
        "layer": args.layer,
        "layer_kind": layer_kind,
        "tp": args.tp,
        "tp_rank": 0,
        "shapes": {"tokens": args.tokens, "heads": heads, "head_dim": head_dim, "groups": g,
                   "n": n, "k": k, "block": proj.block, "rope_rows": p_rows},
        "positions": {"min": int(positions.min()), "max": int(positions.max())},
        "seed": args.seed,
        "fp8_eligible": fp8_ok,
        "auto_path": auto,
        "rows": rows,
        "versions": versions(),
        "device": device_info(),
        "backends_known": list(_dispatch.BACKENDS),
        "seconds_total": time.perf_counter() - t_start,
    }


def _config_name(proj) -> str | None:
    import woa_jax

    for cfg in woa_jax.DSV4_CONFIGS.values():
        if cfg.group_in_features == proj.k and cfg.o_lora_rank == proj.n \
                and cfg.block_size == proj.block:
            return cfg.name
    return None


def _backend_list(spec: str | None, allowed: Sequence[str]) -> tuple[str, ...]:
    if spec is None:
        return tuple(allowed)
    names = tuple(s.strip().lower() for s in spec.split(",") if s.strip())
    bad = [s for s in names if s not in allowed]
    if bad or not names:
        raise UsageError(f"--backends {spec!r}: expected a comma-separated subset of "
                         f"{', '.join(allowed)}")
    return names


def _cmd_verify(args) -> int:
    _check_json_dest(args.json)
    payload = run_verify(args)
    _write_json(args.json, payload)
    if args.json == "-":
        return EXIT_OK if payload["ok"] else EXIT_BROKEN
    sh = payload["shapes"]
    title = (f"woa verify: {payload['config']} wo_a, layer {payload['layer']} "
             f"({payload['layer_kind']} rope), tp={payload['tp']} rank 0: G={sh['groups']} "
             f"N={sh['n']} K={sh['k']} block {sh['block']}, {sh['tokens']} tokens at positions "
             f"{payload['positions']['min']}..{payload['positions']['max']}")
    columns = ["backend", "framework", "device", "scale bytes =", "fp8 bytes =",
               "rel err vs f64", "FP8 vs BF16", "time", "status"]
    table_rows = [[r["backend"], r["framework"], r["device"], _pct(r["scale_bytes_equal"]),
                   _pct(r["fp8_bytes_equal"]), _sci(r["rel_err_vs_truth"]),
                   _sci(r["fp8_vs_bf16"]), _ms(r["seconds"]), r["status"]]
                  for r in payload["rows"]]
    auto = payload["auto_path"]
    caption = (f"source: {payload['source']}. Byte columns compare with the woa_jax oracle "
               f"(fused, bf16 cos/sin, amax floor 1e-8); errors are relative Frobenius norms. "
               f"WoAProjection's auto path here: {auto['path']}. "
               f"Total {payload['seconds_total']:.1f} s.")
    print_table(title, columns, table_rows, caption=caption, right=(3, 4, 5, 6, 7))
    broken = [r for r in payload["rows"] if r["status"].startswith("BREAK")]
    if broken:
        _say(f"[bold red]FAIL[/]: {len(broken)} backend(s) break the byte contract")
        return EXIT_BROKEN
    _say("[bold green]PASS[/]: every FP8 backend that ran matches the oracle's bytes")
    return EXIT_OK


# ----------------------------------------------------------------------------- probe


def _cmd_probe(args) -> int:
    _check_json_dest(args.json)
    import torch_bridge

    dev = device_info()
    device_type = args.device or dev["device"]
    table = torch_bridge.explain(device_type=device_type)
    avail = torch_bridge.available_backends()
    payload = {"command": "probe", "device": dev, "device_type": device_type,
               "versions": versions(), "env": _env_gates(),
               "available": {b: {"ok": ok, "reason": why} for b, (ok, why) in avail.items()},
               "ops": {op: {b: {"ok": ok, "reason": why} for b, (ok, why) in per.items()}
                       for op, per in table.items()}}
    _write_json(args.json, payload)
    if args.json == "-":
        return EXIT_OK
    ver = payload["versions"]
    _say(f"[bold]woa probe[/] on {dev['name']}"
         + (f" ({dev['arch']}, {dev['runtime']})" if dev.get("arch") else "")
         + ": " + ", ".join(f"{k} {v}" for k, v in ver.items() if v is not None)
         + "; not installed: " + (", ".join(k for k, v in ver.items() if v is None) or "none"))
    rows = []
    for op, per in table.items():
        for backend, (ok, why) in per.items():
            rows.append([op, backend, "yes" if ok else "no", why])
    env = ", ".join(f"{k}={v}" for k, v in payload["env"].items())
    print_table(f"Backends for a DeepSeek V4 call on {device_type}",
                ["op", "backend", "runs here", "why"], rows, caption=f"environment: {env}")
    return EXIT_OK


# ----------------------------------------------------------------------------- inspect


def inspect_checkpoint(path: str | pathlib.Path, *, tp: int | None = None) -> dict[str, Any]:
    """Every ``wo_a`` in a checkpoint: shapes, dtypes, block, scale format, FP8 eligibility."""
    from safetensors import safe_open

    from .checkpoint import N_DEFAULT, SCALE_KINDS, tensor_files

    p = pathlib.Path(path)
    if not p.exists():
        raise FileNotFoundError(f"checkpoint {p} does not exist")
    files = tensor_files(p)
    config = {}
    cfg_file = (p if p.is_dir() else p.parent) / "config.json"
    if cfg_file.is_file():
        config = json.loads(cfg_file.read_text())
    stems = sorted((name[: -len(".weight")] for name in files if name.endswith(".wo_a.weight")),
                   key=_natural_key)
    if not stems:
        raise KeyError(f"no '*.wo_a.weight' tensor in checkpoint {p}")

    def meta(name: str) -> tuple[str, tuple[int, ...]]:
        with safe_open(str(files[name]), framework="pt") as fh:
            sl = fh.get_slice(name)
            tag = sl.get_dtype()
            return _ST_DTYPES.get(tag, tag), tuple(int(d) for d in sl.get_shape())

    def loader(name: str):
        def load():
            with safe_open(str(files[name]), framework="pt") as fh:
                import torch

                return fh.get_tensor(name).to(torch.float64).numpy()
        return load

    layers = []
    for stem in stems:
        wdtype, wshape = meta(stem + ".weight")
        sname = next((f"{stem}.{s}" for s in SCALE_KINDS if f"{stem}.{s}" in files), None)
        sdtype, sshape = meta(sname) if sname else (None, None)
        groups = config.get("o_groups") or (wshape[0] // N_DEFAULT if len(wshape) == 2 and
                                            wshape[0] % N_DEFAULT == 0 else None)
        entry: dict[str, Any] = {"name": stem, "weight_dtype": wdtype, "weight_shape": list(wshape),
                                 "scale_name": sname, "scale_dtype": sdtype,
                                 "scale_shape": list(sshape) if sshape else None,
                                 "groups": groups}
        if groups is None:
            entry.update(eligible=False, block=None, scale_format=sdtype or "missing",
                         reason=f"weight {list(wshape)} is not [G * {N_DEFAULT}, K]; cannot tell G "
                                "(no config.json with o_groups)")
        else:
            entry.update(fp8_eligibility(wdtype, wshape, sdtype, sshape, num_groups=groups,
                                         num_heads=config.get("num_attention_heads"), tp=tp,
                                         load_scale=loader(sname) if sname else None))
        layers.append(entry)
    return {"command": "inspect", "path": str(p), "tp": tp, "config_json": bool(config),
            "layers": layers,
            "eligible": sum(1 for e in layers if e["eligible"]), "total": len(layers)}


def _natural_key(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _cmd_inspect(args) -> int:
    _check_json_dest(args.json)
    if args.tp is not None and args.tp < 1:
        raise UsageError(f"--tp must be a positive integer, got {args.tp}")
    payload = inspect_checkpoint(args.path, tp=args.tp)
    _write_json(args.json, payload)
    if args.json == "-":
        return EXIT_OK
    rows = [[e["name"], f"{e['weight_shape']} {e['weight_dtype']}",
             "-" if e["scale_dtype"] is None else f"{e['scale_shape']} {e['scale_dtype']}",
             "-" if e["block"] is None else f"{e['block']}x{e['block']}", e["scale_format"],
             "yes" if e["eligible"] else "no", e["reason"]] for e in payload["layers"]]
    print_table(f"wo_a in {payload['path']}" + (f" (tp={args.tp})" if args.tp else ""),
                ["tensor", "weight", "scale", "block", "scale format", "FP8 path", "why"], rows,
                caption=f"{payload['eligible']} of {payload['total']} layers can take the FP8 "
                        "path")
    return EXIT_OK


# ----------------------------------------------------------------------------- conformance


def load_target(spec: str) -> Callable:
    """``module:function`` (or ``path/to/file.py:function``) to the callable it names."""
    if ":" not in spec:
        raise UsageError(f"{spec!r} is not MODULE:FUNCTION (e.g. "
                         "mypkg.ops:inverse_rope_group_quant)")
    mod_name, _, attr = spec.rpartition(":")
    if not mod_name or not attr:
        raise UsageError(f"{spec!r} is not MODULE:FUNCTION")
    if mod_name.endswith(".py") or os.sep in mod_name:
        file = pathlib.Path(mod_name)
        if not file.is_file():
            raise FileNotFoundError(f"{spec}: file {file} does not exist")
        mspec = importlib.util.spec_from_file_location(file.stem, file)
        module = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # like `python -m`: modules in the working directory
        try:
            module = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name and mod_name.startswith(e.name):
                raise UsageError(f"{spec}: no module named {e.name!r}") from None
            raise
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise UsageError(f"{spec}: module {mod_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise UsageError(f"{spec}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def _numpy_to_torch(a, device):
    """numpy (ml_dtypes bf16/fp8 included) to a torch tensor on ``device``, bytes unchanged."""
    import numpy as np
    import torch

    name = a.dtype.name
    a = np.ascontiguousarray(a)
    with warnings.catch_warnings():
        # The sweep's inputs (the 64 MiB rope tables) are shared read-only numpy arrays; an
        # implementation that writes into its inputs is wrong anyway.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        if name in ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e8m0fnu"):
            carrier = np.int16 if a.dtype.itemsize == 2 else np.uint8
            t = torch.from_numpy(a.view(carrier)).view(getattr(torch, name))
        else:
            t = torch.from_numpy(a)
    return t.to(device)


def torch_adapter(fn: Callable, op: str, device: str) -> Callable:
    """Wrap a torch function with AITER's signature into the sweep's numpy-in callable.

    Outputs stay torch tensors; ``woa_jax.testing.to_numpy`` reads them (GPU ones included).
    """
    if op == _QUANT:
        def quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size):
            t = [_numpy_to_torch(a, device) for a in (o, positions, cos_cache, sin_cache)]
            return fn(*t, num_groups, quant_group_size)
        return quant

    def gemm(x, w, x_scale, w_scale):
        return fn(*(_numpy_to_torch(a, device) for a in (x, w, x_scale, w_scale)))
    return gemm


def _cmd_conformance(args) -> int:
    _check_json_dest(args.json)
    from woa_jax import conformance

    floors = {"aiter": (1e-8,), "cuda": (1e-10,), "any": conformance.DEFAULT_FLOORS}[args.floor]
    targets = [(spec, load_target(spec)) for spec in args.targets]
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    reports = []
    for spec, fn in targets:
        try:
            op = conformance.ConformanceOp(args.op) if args.op else conformance.detect_op(fn)
        except ValueError:
            raise UsageError(f"{spec}: cannot tell from its name or parameters which op it "
                             f"implements; pass --op {_QUANT} or --op {_GEMM}") from None
        impl = fn if args.numpy else torch_adapter(fn, op.value, device)
        t0 = time.perf_counter()
        report = conformance.run_conformance(
            impl, op=op, floors=floors, quick=args.quick, select=args.select, seed=args.seed,
            group_sizes=tuple(args.group_size), name=spec)
        reports.append((report, time.perf_counter() - t0))
    payload = {"command": "conformance", "passed": all(r.passed for r, _ in reports),
               "device": device, "quick": args.quick,
               "reports": [r.to_dict() | {"seconds": sec} for r, sec in reports]}
    _write_json(args.json, payload)
    if args.json != "-":
        for report, sec in reports:
            _print_conformance(report, sec, verbose=args.verbose)
    return EXIT_OK if payload["passed"] else EXIT_BROKEN


def _print_conformance(report, seconds: float, *, verbose: bool) -> None:
    quant = report.op == _QUANT
    shown = report.failures if report.failures and not verbose else report.cases
    if quant:
        columns = ["case", "scale bytes =", "fp8 bytes =", "matches floor", "time", "result"]
        rows = [[c.name, _pct(c.scale_bytes_equal), _pct(c.fp8_bytes_equal),
                 ", ".join(f"{f:g}" for f in c.floors) or "none", _ms(c.seconds),
                 "ok" if c.passed else "FAIL: " + c.detail] for c in shown]
        right = (1, 2, 4)
    else:
        columns = ["case", "rel err vs fp32 ref", "time", "result"]
        rows = [[c.name, _sci(c.rel_error), _ms(c.seconds),
                 "ok" if c.passed else "FAIL: " + c.detail] for c in shown]
        right = (1, 2)
    floor = ""
    if quant:
        floor = " amax floor: " + (f"{report.amax_floor:g}." if report.amax_floor is not None
                                   else "not determined.")
    caption = (f"{len(report.cases) - len(report.failures)} of {len(report.cases)} cases "
               f"conform.{floor} {seconds:.1f} s.")
    print_table(f"woa conformance: {report.impl} ({report.op})", columns, rows, caption=caption,
                right=right)
    for p in report.problems:
        _say(f"[bold red]problem[/]: {p}")
    _say("[bold green]PASS[/]" if report.passed else "[bold red]FAIL[/]: contract broken")


# ----------------------------------------------------------------------------- bench


def _cmd_bench(args) -> int:
    try:
        bench = importlib.import_module("benchmarks.bench")
    except ModuleNotFoundError:
        # The harness lives beside the package in a source checkout; an editable install does not
        # put the repository root on sys.path for the console script.
        root = pathlib.Path(__file__).resolve().parent.parent
        if not (root / "benchmarks" / "bench.py").is_file():
            raise UsageError("woa bench needs the benchmarks/ directory of a source checkout "
                             "(it is not part of the installed package)") from None
        sys.path.insert(0, str(root))
        bench = importlib.import_module("benchmarks.bench")
    try:
        return int(bench.main(list(args.rest)) or 0)
    except SystemExit as e:  # the harness reports its usage errors as SystemExit(message)
        if isinstance(e.code, str):
            raise UsageError(e.code) from None
        raise
    except _USER_ERRORS as e:  # anything else from inside the harness is a bug: keep the trace
        raise RuntimeError(f"woa bench failed: {type(e).__name__}: {e}") from e


# ----------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="woa", description="DeepSeek V4 wo_a in FP8: verify, benchmark, "
                     "probe backends, inspect checkpoints, check other implementations.")
    parser.add_argument("--version", action="version", version=f"woa {_own_version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    v = sub.add_parser("verify", help="cross-framework correctness report (no arguments needed)",
                       description="Run the FP8 wo_a chain on every backend that runs here, in "
                       "torch and JAX, plus the BF16 chain, against the woa_jax oracle and the "
                       "float64 truth. Exit 1 if an FP8 backend's bytes differ from the oracle.")
    v.add_argument("--config", choices=("v4-flash", "v4-pro", "v4.1-flash"),
                   help="model shapes (default v4-flash; inferred from --checkpoint)")
    v.add_argument("--tokens", type=int, default=32, help="tokens in the batch (default 32)")
    v.add_argument("--tp", type=int, default=8,
                   help="tensor-parallel degree; rank 0's slice runs (default 8: one group)")
    v.add_argument("--checkpoint", metavar="PATH", help="a real checkpoint (file or directory)")
    v.add_argument("--layer", type=int, default=0, help="layer index (default 0)")
    v.add_argument("--layer-kind", choices=("compress", "window"),
                   help="RoPE table of the layer (default: config.json's compress_ratios; "
                        "compress for the embedded layer)")
    v.add_argument("--backends", metavar="LIST",
                   help="comma-separated subset of aiter,triton,torch,bf16 (default all)")
    v.add_argument("--device", choices=("cpu", "cuda"), help="torch device (default: GPU if any)")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--json", metavar="FILE", help="write the report as JSON ('-': stdout only)")
    v.set_defaults(func=_cmd_verify)

    b = sub.add_parser("bench", help="benchmark harness (arguments go to benchmarks.bench)",
                       description="Forward to the benchmark harness; try `woa bench --help`.",
                       add_help=False)
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(func=_cmd_bench)

    p = sub.add_parser("probe", help="which backend runs here, and why not",
                       description="Each backend per op: can it run here, and the reason.")
    p.add_argument("--device", choices=("cpu", "cuda"), help="judge for this device type")
    p.add_argument("--json", metavar="FILE", nargs="?", const="-",
                   help="JSON to FILE, or to stdout without FILE")
    p.set_defaults(func=_cmd_probe)

    i = sub.add_parser("inspect", help="a checkpoint's wo_a layers and their FP8 eligibility",
                       description="Read a checkpoint (safetensors file, or directory with "
                       "shards and index) and report every wo_a: shapes, dtypes, block size, "
                       "scale format, and whether the FP8 path can take it.")
    i.add_argument("path", help="checkpoint file or directory")
    i.add_argument("--tp", type=int, help="check this tensor-parallel split")
    i.add_argument("--json", metavar="FILE", nargs="?", const="-",
                   help="JSON to FILE, or to stdout without FILE")
    i.set_defaults(func=_cmd_inspect)

    c = sub.add_parser("conformance", help="check another implementation against the oracle",
                       description="Import MODULE:FUNCTION, an implementation with AITER's "
                       "signature of inverse_rope_group_quant or batched_gemm_a8w8_mxscale "
                       "(torch tensors in and out), and run the standard DeepSeek V4 sweep "
                       "against woa_jax. Exit 1 on a contract break.")
    c.add_argument("targets", nargs="+", metavar="MODULE:FUNCTION",
                   help="e.g. aiter:inverse_rope_group_quant, or path/to/file.py:fn")
    c.add_argument("--op", choices=(_QUANT, _GEMM), help="which op (default: from the name)")
    c.add_argument("--quick", action="store_true", help="each input pattern once (seconds)")
    c.add_argument("--floor", choices=("any", "aiter", "cuda"), default="any",
                   help="accepted amax floor: aiter 1e-8, cuda 1e-10, any (default: one of them,"
                        " consistently)")
    c.add_argument("--group-size", type=int, nargs="+", default=[128], choices=(32, 64, 128),
                   help="quant group sizes to sweep (default 128)")
    c.add_argument("-k", dest="select", metavar="SUBSTRING", help="only cases whose id has it")
    c.add_argument("--device", choices=("cpu", "cuda"),
                   help="where inputs go (default: GPU if any)")
    c.add_argument("--numpy", action="store_true",
                   help="pass numpy arrays (for JAX/numpy implementations) instead of torch")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--verbose", "-v", action="store_true", help="list passing cases too")
    c.add_argument("--json", metavar="FILE", nargs="?", const="-",
                   help="JSON to FILE, or to stdout without FILE")
    c.set_defaults(func=_cmd_conformance)
    return parser


def _own_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("woa")
    except metadata.PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``woa`` console script; returns the exit code."""
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    parser = build_parser()
    first = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if first is not None and argv[first] == "bench":
        # Everything after `bench` belongs to the harness's own parser (including --help).
        args = parser.parse_args(argv[: first + 1])
        args.rest = argv[first + 1:]
    else:
        args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `woa probe --json | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except _USER_ERRORS as e:
        if args.debug:
            raise
        message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        if isinstance(e, OSError) and e.filename and str(e.filename) not in message:
            message = f"{message}: {e.filename}"
        print(f"woa: error: {message}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
