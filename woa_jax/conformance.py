"""The conformance sweep: another implementation of AITER's two ``wo_a`` ops against the oracle.

This is the oracle offered as a service for other projects' CI. The implementation under test is a
callable with AITER's argument order, taking and returning numpy arrays (ml_dtypes ``bfloat16``,
``float8_e4m3fn``; E8M0 scales as ``uint8`` or ``float8_e8m0fnu``). Results may also be JAX arrays
or torch tensors (read through ``woa_jax.testing.to_numpy``); ``torch_bridge.cli`` wraps a torch
function with AITER's signature into such a callable. This module never imports torch.

* ``inverse_rope_group_quant(o, positions, cos_cache, sin_cache, num_groups, quant_group_size)
  -> (x_fp8 [S, G, D], x_scale [S, G, D / GS])``: scale bytes and fp8 bytes must equal the oracle's
  (fused rotation, bf16 cos/sin, so the bytes do not depend on FMA contraction; docs/NUMERICS.md
  sections 2, 4, 5). AITER's signature has no floor argument, so every case is compared against
  the oracle at each accepted amax floor; the floor only changes the bytes of groups whose amax is
  below it. An implementation passes when every case matches one accepted floor and one floor
  explains all cases.
* ``batched_gemm_a8w8_mxscale(x, w, x_scale, w_scale) -> y [M, G, N]``: relative Frobenius error
  against the fp32-accumulated reference within ``TOLERANCES["gemm_bf16"]`` (bf16 output) or
  ``TOLERANCES["gemm_fp32"]`` (fp32 output). Test data follows AITER's GEMM test: randn operands,
  every 128-wide K block scaled by its own power of two, which exposes permuted scales.

Cases are DeepSeek V4 per-rank shapes ``(H_l, G_l)`` = (64, 8), (16, 2), (8, 1) with S = M in
{1, 7, 33}, the real 1,048,576-row YaRN rope table in bf16, positions including 0 and P - 1, and
named input patterns (randn, all-zero groups, groups below the amax floors, amax exactly on
``448 * 2**k`` and one ulp above in NoPE and in rotated lanes, huge magnitudes).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from ._spec import AITER_AMAX_FLOOR, CUDA_AMAX_FLOOR, RopeKind, as_enum
from .config import local_shapes, rope_cos_sin
from .gemm import batched_gemm_a8w8_mxscale
from .quant import inverse_rope_group_quant
from .testing import TOLERANCES, relative_error, to_numpy


class ConformanceOp(str, enum.Enum):
    """The two AITER ops the sweep can check."""

    INVERSE_ROPE_GROUP_QUANT = "inverse_rope_group_quant"
    BATCHED_GEMM_A8W8_MXSCALE = "batched_gemm_a8w8_mxscale"


#: Per-rank shapes swept: (config, tp) -> (H_l, G_l) = (64, 8), (16, 2), (8, 1).
SHAPES: tuple[tuple[str, int], ...] = (("v4-flash", 1), ("v4-pro", 8), ("v4-flash", 8))
#: Token counts S (= GEMM M) swept: one decode row, an odd count, one past a multiple of 32.
TOKENS: tuple[int, ...] = (1, 7, 33)
#: Named quant input patterns; each is one case per shape and token count.
QUANT_PATTERNS: tuple[str, ...] = (
    "randn", "zero-groups", "below-floor", "pow2-nope", "pow2-rope", "large",
)
#: Named GEMM input patterns.
GEMM_PATTERNS: tuple[str, ...] = ("randn", "wide-scales")
#: The accepted amax floors by default: AITER's (zero group -> byte 92) and vLLM CUDA's (85).
DEFAULT_FLOORS: tuple[float, ...] = (AITER_AMAX_FLOOR, CUDA_AMAX_FLOOR)

_HEAD_DIM = 512
_GEMM_N = 1024


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """The outcome of one case.

    Attributes:
      op: the op checked.
      name: the case id, e.g. ``v4-flash-tp8-H8G1-S7-gs128-pow2-rope``.
      passed: whether the case meets the contract.
      detail: why it failed (the first mismatching coordinate and both values), else ``""``.
      scale_bytes_equal: fraction of equal scale bytes against the closest floor (quant only).
      fp8_bytes_equal: fraction of equal fp8 bytes against that floor's oracle (quant only).
      floors: the accepted amax floors whose oracle scale bytes this case matches exactly.
      rel_error: relative Frobenius error against the fp32 reference (GEMM only).
      seconds: wall time of the implementation's call.
    """

    op: str
    name: str
    passed: bool
    detail: str = ""
    scale_bytes_equal: float | None = None
    fp8_bytes_equal: float | None = None
    floors: tuple[float, ...] = ()
    rel_error: float | None = None
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class ConformanceReport:
    """All cases of one sweep, plus sweep-level problems (an inconsistent amax floor).

    Attributes:
      op: the op checked.
      impl: a readable name of the implementation.
      cases: one ``CaseResult`` per case, in sweep order.
      amax_floor: the one floor that explains every quant case, ``None`` for the GEMM or when no
        case depended on the floor.
      problems: failures that belong to no single case.
      tolerance: the GEMM tolerance key used (``"gemm_bf16"`` or ``"gemm_fp32"``), else ``None``.
    """

    op: str
    impl: str
    cases: tuple[CaseResult, ...]
    amax_floor: float | None = None
    problems: tuple[str, ...] = ()
    tolerance: str | None = None

    @property
    def passed(self) -> bool:
        return not self.problems and all(c.passed for c in self.cases)

    @property
    def failures(self) -> tuple[CaseResult, ...]:
        return tuple(c for c in self.cases if not c.passed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "impl": self.impl,
            "passed": self.passed,
            "amax_floor": self.amax_floor,
            "tolerance": self.tolerance,
            "problems": list(self.problems),
            "cases": [dataclasses.asdict(c) | {"floors": list(c.floors)} for c in self.cases],
        }

    def summary(self) -> str:
        """A few plain-text lines: verdict, counts, floor, then each failure with its reason."""
        n_bad = len(self.failures)
        verdict = "PASS" if self.passed else "FAIL"
        lines = [f"{verdict}: {self.impl} ({self.op}): {len(self.cases) - n_bad} of "
                 f"{len(self.cases)} cases conform"]
        if self.op == ConformanceOp.INVERSE_ROPE_GROUP_QUANT.value:
            lines.append("amax floor: " + (f"{self.amax_floor:g}" if self.amax_floor is not None
                                           else "not determined"))
        lines += [f"  {p}" for p in self.problems]
        lines += [f"  {c.name}: {c.detail}" for c in self.failures]
        return "\n".join(lines)


def detect_op(fn: Callable) -> ConformanceOp:
    """Which op ``fn`` implements, from its name, else from its parameter names.

    Raises:
      ValueError: neither the name nor the signature tells.
    """
    name = getattr(fn, "__name__", type(fn).__name__).lower()
    if "quant" in name or "rope" in name:
        return ConformanceOp.INVERSE_ROPE_GROUP_QUANT
    if "gemm" in name or "bmm" in name:
        return ConformanceOp.BATCHED_GEMM_A8W8_MXSCALE
    try:
        params = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = set()
    if {"positions", "cos_cache"} <= params:
        return ConformanceOp.INVERSE_ROPE_GROUP_QUANT
    if {"x_scale", "w_scale"} <= params:
        return ConformanceOp.BATCHED_GEMM_A8W8_MXSCALE
    raise ValueError(
        f"cannot tell which op {name!r} implements from its name or parameters; expected "
        f"{ConformanceOp.INVERSE_ROPE_GROUP_QUANT.value} or "
        f"{ConformanceOp.BATCHED_GEMM_A8W8_MXSCALE.value} (pass op=)"
    )


# ----------------------------------------------------------------------------- case lists


@dataclasses.dataclass(frozen=True)
class _Case:
    config: str
    tp: int
    tokens: int
    pattern: str
    group_size: int = 128

    def name(self, op: ConformanceOp) -> str:
        shapes = local_shapes(self.config, self.tp)
        h, g = shapes.num_heads, shapes.num_groups
        if op is ConformanceOp.INVERSE_ROPE_GROUP_QUANT:
            return (f"{self.config}-tp{self.tp}-H{h}G{g}-S{self.tokens}-gs{self.group_size}-"
                    f"{self.pattern}")
        k = shapes.group_in_features
        return f"{self.config}-tp{self.tp}-G{g}-M{self.tokens}-N{_GEMM_N}-K{k}-{self.pattern}"


def _cases(op: ConformanceOp, quick: bool, group_sizes: Sequence[int]) -> list[_Case]:
    patterns = QUANT_PATTERNS if op is ConformanceOp.INVERSE_ROPE_GROUP_QUANT else GEMM_PATTERNS
    if op is ConformanceOp.BATCHED_GEMM_A8W8_MXSCALE:
        group_sizes = (128,)  # AITER's GEMM is built for 128-wide blocks only
    cases = []
    for gs in group_sizes:
        if quick:
            # Every pattern once; shapes and token counts rotate so that each still appears.
            for i, pattern in enumerate(patterns):
                config, tp = SHAPES[i % len(SHAPES)]
                tokens = TOKENS[(i + i // len(SHAPES)) % len(TOKENS)]
                cases.append(_Case(config, tp, tokens, pattern, gs))
            if op is ConformanceOp.BATCHED_GEMM_A8W8_MXSCALE:
                cases.append(_Case(*SHAPES[2], TOKENS[2], patterns[0], gs))
        else:
            cases += [_Case(c, tp, s, p, gs) for (c, tp) in SHAPES for s in TOKENS
                      for p in patterns]
    return cases


def list_cases(op: ConformanceOp | str, *, quick: bool = False,
               group_sizes: Sequence[int] = (128,)) -> list[str]:
    """The case ids ``run_conformance`` would run for ``op``."""
    op = as_enum(ConformanceOp, op, "op")
    return [c.name(op) for c in _cases(op, quick, group_sizes)]


# ----------------------------------------------------------------------------- quant inputs

# The oracle compiled once per shape (eager dispatch compiles every primitive per shape, ~1 s).
# Jitting cannot change its bytes here: with bf16 cos/sin every rotation product is exact in fp32,
# so FMA contraction is moot, and the rest is exact bit arithmetic and single roundings.
_quant_oracle = jax.jit(inverse_rope_group_quant, static_argnums=(4, 5),
                        static_argnames=("fp8_dtype", "amax_floor"))
_gemm_oracle = jax.jit(batched_gemm_a8w8_mxscale, static_argnames=("dtype",))



@functools.lru_cache(maxsize=2)
def _rope_table_bf16(config: str):
    """The real compressed-layer YaRN table (P = 1,048,576 rows) in bf16, built once (~1 s).

    Returns ``(cos, sin)`` as numpy (for the implementation) and as JAX arrays (for the oracle, so
    that the 64 MiB tables are not copied to the device on every oracle call).
    """
    cos, sin = rope_cos_sin(config, RopeKind.COMPRESS, dtype=jnp.bfloat16)
    return (np.asarray(cos), np.asarray(sin)), (cos, sin)


def _bf16(x) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)


def _bf16_neighbors(x: np.ndarray, n: int) -> np.ndarray:
    """bf16 values within ``n`` ulps of ``bf16(x)`` (same sign), shape ``x.shape + (2n + 1,)``."""
    bits = _bf16(x).view(np.uint16).astype(np.int32)
    mag = (bits & 0x7FFF)[..., None] + np.arange(-n, n + 1)
    mag = np.clip(mag, 0, 0x7F7F)  # stay finite
    return ((mag | (bits & 0x8000)[..., None]).astype(np.uint16)).view(ml_dtypes.bfloat16)


def _rope_pair_hitting(target: np.float32, c: np.float32, s: np.float32):
    """bf16 ``(a, b)`` with ``fp32(a*c + b*s) == target`` exactly, or ``None``.

    With bf16 inputs both products are exact in fp32, so only the one sum rounds: the result is the
    same with or without FMA contraction, and it can hit any fp32 value, e.g. one ulp above a power
    of two, which no bf16 NoPE lane can hold.
    """
    a = _bf16_neighbors(np.float64(target) / np.float64(c), 64).astype(np.float32)  # [129]
    rest = np.float64(target) - a.astype(np.float64) * np.float64(c)
    b = _bf16_neighbors(rest / np.float64(s), 8).astype(np.float32)  # [129, 17]
    total = (a[:, None] * c) + (b * s)  # fp32: exact products, one rounding
    hit = np.argwhere(total == target)
    if hit.size == 0:
        return None
    i, j = hit[0]
    return a[i], b[i, j]


def _quant_inputs(case: _Case, rng: np.random.Generator, cos: np.ndarray, sin: np.ndarray,
                  fp8_max: float) -> tuple[np.ndarray, np.ndarray]:
    """``o [S, H_l, 512]`` bf16 and ``positions [S]`` int64 for one quant case."""
    shapes = local_shapes(case.config, case.tp)
    s, h, gs = case.tokens, shapes.num_heads, case.group_size
    rd = 2 * cos.shape[1]
    rows = cos.shape[0]
    positions = rng.integers(0, rows, size=s, dtype=np.int64)
    positions[-1] = rows - 1  # the last table row ...
    if s > 1:
        positions[0] = 0  # ... and the first (cos 1, sin 0)
    # AITER's test distribution: randn / 10.
    o = rng.standard_normal((s, h, _HEAD_DIM), dtype=np.float32) * np.float32(0.1)
    chunks = o.reshape(s, h * _HEAD_DIM // gs, gs)  # view: quant groups along the flat row
    n_chunks = chunks.shape[1]
    lane0 = (np.arange(n_chunks) * gs) % _HEAD_DIM  # first lane of each chunk within its head
    nope_lanes = np.clip(_HEAD_DIM - rd - lane0, 0, gs)  # leading NoPE lanes of each chunk
    pick = rng.random((s, n_chunks))

    if case.pattern == "zero-groups":
        chunks[pick < 0.2] = 0.0
        chunks[0] = 0.0  # a whole token, rope lanes included
    elif case.pattern == "below-floor":
        # amax under both floors, and between 1e-10 and 1e-8: the floor decides these bytes.
        chunks[pick < 0.15] *= np.float32(1e-11)
        chunks[(pick >= 0.15) & (pick < 0.3)] *= np.float32(1e-8)
    elif case.pattern == "pow2-nope":
        # One NoPE lane exactly at fp8_max * 2**k (no bump), one bf16 ulp above (bump) or below.
        for t, c in np.argwhere(pick < 0.5):
            if nope_lanes[c] == 0:
                continue
            k = int(rng.integers(-30, 31))
            chunks[t, c] *= np.float32(2.0**k * 0.1)
            base = _bf16_neighbors(np.float32(fp8_max * 2.0**k), 1)[int(rng.integers(0, 3))]
            lane = int(rng.integers(0, nope_lanes[c]))
            chunks[t, c, lane] = np.float32(base) * rng.choice([-1, 1])
    elif case.pattern == "pow2-rope":
        _place_rope_boundaries(o, positions, cos, sin, rng, fp8_max)
    elif case.pattern == "large":
        chunks[pick < 0.25] *= np.float32(2.0**100)
        # The largest bf16 in a NoPE lane: byte 247, the largest a finite group can produce.
        t, c = int(rng.integers(0, s)), int(np.flatnonzero(nope_lanes)[0])
        chunks[t, c, 0] = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    elif case.pattern != "randn":
        raise ValueError(f"unknown quant pattern {case.pattern!r}")
    return _bf16(o), positions


def _place_rope_boundaries(o: np.ndarray, positions: np.ndarray, cos: np.ndarray,
                           sin: np.ndarray, rng: np.random.Generator, fp8_max: float) -> None:
    """Make one rotated lane of some heads land exactly on ``fp8_max * 2**k`` or one fp32 ulp above.

    Everything else in the head's rope chunk is scaled far below, so that lane is the group amax.
    """
    s, h, dh = o.shape
    rd = 2 * cos.shape[1]
    for t in range(s):
        c_row = cos[positions[t]].astype(np.float32)
        s_row = sin[positions[t]].astype(np.float32)
        # Columns where the partner lane b' = b c - a s stays below a' (|s| < |c|), s != 0.
        cols = np.flatnonzero((np.abs(s_row) < 0.9 * np.abs(c_row)) & (s_row != 0))
        for head in rng.permutation(h)[: max(1, h // 2)]:
            if cols.size == 0:
                break
            k = int(rng.integers(-20, 21))
            target = np.float32(fp8_max * 2.0**k)
            if rng.random() < 0.5:
                target = np.nextafter(target, np.float32(np.inf))
            for j in rng.permutation(cols)[:8]:
                pair = _rope_pair_hitting(target, c_row[j], s_row[j])
                if pair is None:
                    continue
                o[t, head] *= np.float32(2.0**k * 1e-3)  # the whole head: NoPE lanes too
                o[t, head, dh - rd + 2 * j] = pair[0]
                o[t, head, dh - rd + 2 * j + 1] = pair[1]
                break


# ----------------------------------------------------------------------------- result handling


def _u8(x, what: str, fp8_dtype) -> np.ndarray:
    a = to_numpy(x)
    if a.dtype.itemsize != 1:
        raise TypeError(f"{what} has dtype {a.dtype}; expected a 1-byte dtype")
    if what == "x_fp8" and a.dtype != np.uint8 and a.dtype != np.dtype(fp8_dtype):
        raise TypeError(f"x_fp8 has dtype {a.dtype}; the sweep checks {np.dtype(fp8_dtype)} "
                        "(pass fp8_dtype=)")
    return np.ascontiguousarray(a).view(np.uint8)


def raised_summary(e: BaseException) -> str:
    """``raised Type: message`` on one line; a multi-line message (a compiler's) keeps its first
    and last lines (also the CLI's ``verify`` table)."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    msg = lines[0] if len(lines) < 2 else f"{lines[0]} ... {lines[-1]}"
    return f"raised {type(e).__name__}: {msg[:300]}"


def _first_mismatch(got: np.ndarray, ref: np.ndarray, what: str) -> str:
    bad = got != ref
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"{what}: {int(bad.sum())} of {bad.size} bytes differ; first at {list(idx)}: got "
            f"0x{int(got[idx]):02x}, expected 0x{int(ref[idx]):02x}")


def _check_quant_case(impl, case: _Case, rng, floors, fp8_dtype) -> CaseResult:
    op = ConformanceOp.INVERSE_ROPE_GROUP_QUANT
    name = case.name(op)
    (cos, sin), (cos_j, sin_j) = _rope_table_bf16(case.config)
    fp8_max = float(ml_dtypes.finfo(fp8_dtype).max)
    o, positions = _quant_inputs(case, rng, cos, sin, fp8_max)
    g = local_shapes(case.config, case.tp).num_groups
    t0 = time.perf_counter()
    try:
        out = impl(o, positions, cos, sin, g, case.group_size)
        seconds = time.perf_counter() - t0
        x_fp8, x_scale = out
        x_fp8 = _u8(x_fp8, "x_fp8", fp8_dtype)
        x_scale = _u8(x_scale, "x_scale", fp8_dtype)
    except Exception as e:  # noqa: BLE001 - an implementation that raises fails the case
        return CaseResult(op.value, name, False, raised_summary(e))
    d = o.shape[1] * o.shape[2] // g
    expect_x, expect_s = (o.shape[0], g, d), (o.shape[0], g, d // case.group_size)
    if x_fp8.shape != expect_x or x_scale.shape != expect_s:
        return CaseResult(op.value, name, False,
                          f"returned x_fp8 {x_fp8.shape} and x_scale {x_scale.shape}; expected "
                          f"{expect_x} and {expect_s} (row layout)", seconds=seconds)
    refs = {}
    o_j = jnp.asarray(o)
    for floor in floors:
        rx, rs = _quant_oracle(o_j, positions, cos_j, sin_j, g, case.group_size,
                                          fp8_dtype=fp8_dtype, amax_floor=floor)
        refs[floor] = (np.asarray(rx).view(np.uint8), np.asarray(rs).view(np.uint8))
    matched = tuple(f for f in floors if np.array_equal(x_scale, refs[f][1]))
    best = matched[0] if matched else max(floors, key=lambda f: (x_scale == refs[f][1]).mean())
    rx, rs = refs[best]
    scale_eq = float((x_scale == rs).mean())
    fp8_eq = float((x_fp8 == rx).mean()) if x_fp8.size else 1.0
    details = []
    if not matched:
        details.append(_first_mismatch(x_scale, rs, f"scale bytes (closest floor {best:g})"))
    if fp8_eq < 1.0:
        details.append(_first_mismatch(x_fp8, rx, f"fp8 bytes (floor {best:g})"))
    return CaseResult(op.value, name, not details, "; ".join(details), scale_bytes_equal=scale_eq,
                      fp8_bytes_equal=fp8_eq, floors=matched, seconds=seconds)


def _floor_problems(results: Sequence[CaseResult], floors) -> tuple[float | None, tuple[str, ...]]:
    """The floor that explains every matching case, or a problem naming cases that rule out each
    accepted floor (any number of floors; no two cases need to disagree outright)."""
    matching = [r for r in results if r.floors]
    common = set(floors).intersection(*(r.floors for r in matching))
    if common:
        floor = next(f for f in floors if f in common)
        return (floor if len(common) == 1 else None), ()
    # Each floor fails some matching case; name the first such case per floor, once each.
    witnesses = dict.fromkeys(next(r for r in matching if f not in r.floors) for f in floors)
    why = "; ".join(f"{r.name} matches only floor{'s' if len(r.floors) > 1 else ''} "
                    + ", ".join(f"{f:g}" for f in r.floors) for r in witnesses)
    return None, (f"inconsistent amax floor: no accepted floor matches every case ({why}); an "
                  "implementation must use one floor",)


def _gemm_inputs(case: _Case, rng: np.random.Generator, fp8_dtype):
    shapes = local_shapes(case.config, case.tp)
    m, g, n, k = case.tokens, shapes.num_groups, _GEMM_N, shapes.group_in_features
    b = case.group_size
    spread = 4 if case.pattern == "randn" else 40
    if case.pattern not in GEMM_PATTERNS:
        raise ValueError(f"unknown GEMM pattern {case.pattern!r}")
    x = rng.standard_normal((m, g, k), dtype=np.float32).astype(fp8_dtype)
    w = rng.standard_normal((g, n, k), dtype=np.float32).astype(fp8_dtype)
    xs = (127 + rng.integers(-spread, spread + 1, size=(m, g, k // b))).astype(np.uint8)
    ws = (127 + rng.integers(-spread, spread + 1, size=(g, -(-n // b), k // b))).astype(np.uint8)
    return x, w, xs, ws


def _check_gemm_case(impl, case: _Case, rng, fp8_dtype) -> tuple[CaseResult, str | None]:
    op = ConformanceOp.BATCHED_GEMM_A8W8_MXSCALE
    name = case.name(op)
    x, w, xs, ws = _gemm_inputs(case, rng, fp8_dtype)
    t0 = time.perf_counter()
    try:
        y = to_numpy(impl(x, w, xs, ws))
    except Exception as e:  # noqa: BLE001 - an implementation that raises fails the case
        return CaseResult(op.value, name, False, raised_summary(e)), None
    seconds = time.perf_counter() - t0
    expect = (x.shape[0], x.shape[1], w.shape[1])
    if y.shape != expect:
        return CaseResult(op.value, name, False, f"returned shape {y.shape}; expected {expect}",
                          seconds=seconds), None
    key = {"bfloat16": "gemm_bf16", "float32": "gemm_fp32"}.get(y.dtype.name)
    if key is None:
        return CaseResult(op.value, name, False,
                          f"returned dtype {y.dtype}; expected bfloat16 or float32",
                          seconds=seconds), None
    ref = np.asarray(_gemm_oracle(x, w, xs, ws, dtype=jnp.float32))
    yf = y.astype(np.float64)
    if not np.isfinite(yf).all():
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(yf))[0])
        return CaseResult(op.value, name, False, f"non-finite output at {list(idx)}",
                          seconds=seconds), key
    err = relative_error(yf, ref)
    tol = TOLERANCES[key].rel
    detail = "" if err <= tol else (
        f"relative error {err:.3e} exceeds {tol:.1e} ({key}); worst element "
        f"{list(int(i) for i in np.unravel_index(np.argmax(np.abs(yf - ref)), y.shape))}"
    )
    return CaseResult(op.value, name, not detail, detail, rel_error=err, seconds=seconds), key


# ----------------------------------------------------------------------------- entry points


def run_conformance(impl: Callable, *, op: ConformanceOp | str | None = None,
                    floors: Sequence[float] = DEFAULT_FLOORS, quick: bool = False,
                    group_sizes: Sequence[int] = (128,), fp8_dtype=ml_dtypes.float8_e4m3fn,
                    select: str | None = None, seed: int = 0,
                    name: str | None = None) -> ConformanceReport:
    """Run the standard DeepSeek V4 sweep on ``impl`` and report, case by case.

    Args:
      impl: the implementation, with AITER's positional arguments and numpy in/out (see the module
        docstring). Exceptions it raises fail the case; they are not propagated.
      op: which op ``impl`` implements; ``None`` detects it (``detect_op``).
      floors: the accepted amax floors (quant only). Pass one floor to require it.
      quick: run each pattern once instead of every shape x token count x pattern (a few seconds
        on a CPU instead of about a minute).
      group_sizes: quant group sizes GS to sweep (AITER's released op builds 128; main also 32
        and 64). The GEMM always uses 128.
      fp8_dtype: ``float8_e4m3fn`` (gfx950, Hopper) or ``float8_e4m3fnuz`` (gfx942).
      select: run only cases whose id contains this substring.
      seed: seed of the random inputs.
      name: the implementation's name in the report (default: its ``__qualname__``).

    Returns:
      A ``ConformanceReport``; ``report.passed`` is the verdict.

    Raises:
      ValueError: unknown op, floor, group size, or no case matches ``select``.
    """
    op = detect_op(impl) if op is None else as_enum(ConformanceOp, op, "op")
    floors = tuple(float(f) for f in floors)
    if not floors or any(not (f > 0) for f in floors):
        raise ValueError(f"floors must be positive numbers, got {floors}")
    bad_gs = [gs for gs in group_sizes if gs not in (32, 64, 128)]
    if bad_gs or not group_sizes:
        raise ValueError(f"group_sizes must be drawn from 32, 64, 128, got {tuple(group_sizes)}")
    fp8_dtype = np.dtype(fp8_dtype)
    if fp8_dtype not in (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e4m3fnuz)):
        raise TypeError(f"fp8_dtype must be float8_e4m3fn or float8_e4m3fnuz, got {fp8_dtype}")
    cases = _cases(op, quick, group_sizes)
    if select is not None:
        cases = [c for c in cases if select in c.name(op)]
        if not cases:
            raise ValueError(f"no {op.value} case id contains {select!r}")
    rng = np.random.default_rng(seed)
    impl_name = name or getattr(impl, "__qualname__", None) or type(impl).__name__
    results: list[CaseResult] = []
    if op is ConformanceOp.INVERSE_ROPE_GROUP_QUANT:
        for c in cases:
            results.append(_check_quant_case(impl, c, rng, floors, fp8_dtype))
        floor, problems = _floor_problems(results, floors)
        return ConformanceReport(op.value, impl_name, tuple(results), floor, problems)
    keys = set()
    for c in cases:
        result, key = _check_gemm_case(impl, c, rng, fp8_dtype)
        results.append(result)
        keys.add(key)
    keys.discard(None)
    return ConformanceReport(op.value, impl_name, tuple(results),
                             tolerance=",".join(sorted(keys)) or None)


def assert_conformance(impl: Callable, **kwargs) -> ConformanceReport:
    """``run_conformance`` for pytest: raises ``AssertionError`` with the summary on failure.

    Keyword arguments are those of ``run_conformance``. Returns the (passing) report.
    """
    report = run_conformance(impl, **kwargs)
    if not report.passed:
        raise AssertionError(report.summary())
    return report
