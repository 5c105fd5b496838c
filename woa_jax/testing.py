"""Comparison helpers for tests, benchmarks and other projects' CI: the one home for them.

* ``TOLERANCES`` / ``Tolerance``: the tolerance table (docs/NUMERICS.md section 11).
* ``relative_error``, ``calc_diff``: error measures in float64.
* ``assert_close``: relative error within a ``TOLERANCES`` entry, and no new NaN.
* ``assert_bitwise_equal``: same shape and bits, else the first mismatch is named.
* ``bytes_equal_fraction``: the fraction of equal elements, for reports.
* ``to_numpy``: a numpy view of numpy, JAX or torch arrays (GPU tensors are copied to the host).

Nothing here imports torch or the rest of ``woa_jax``; ``woa_jax.conformance`` builds on it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = [
    "TOLERANCES",
    "Tolerance",
    "assert_bitwise_equal",
    "assert_close",
    "bytes_equal_fraction",
    "calc_diff",
    "relative_error",
    "to_numpy",
]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """One comparison rule: ``rel`` bounds the relative Frobenius error; zero means bitwise."""

    rel: float
    why: str


#: The one tolerance table. Keys name what is compared.
TOLERANCES: dict[str, Tolerance] = {
    "scale_bytes": Tolerance(0.0, "E8M0 scale bytes are exact integer arithmetic"),
    "fp8_bytes": Tolerance(0.0, "fp8 payload is exact when the rotation precision matches"),
    # GEMM outputs: only summation order differs; bf16 output rounding is about 1.7e-3 relative
    # (Frobenius) on random data, so 4e-3 leaves room for order effects without hiding a wrong
    # scale (one E8M0 step is a 2x error).
    "gemm_bf16": Tolerance(4e-3, "bf16 output rounding of an fp32-accumulated GEMM"),
    "gemm_fp32": Tolerance(1e-5, "fp32 summation-order differences"),
    # The FP8 chain against the BF16 chain or the float64 truth: e4m3 activation rounding
    # (unit roundoff 2**-4) averaged over K = 4096 products: about 2.7e-2 on V4-Flash shapes
    # with o = randn * 0.1 (tests/woa_jax/test_chain.py); the gate leaves ~2x.
    "fp8_chain_vs_bf16": Tolerance(6e-2, "e4m3 activation quantization"),
    # The BF16 chain against the float64 truth: about 1.75e-3 on the same data; ~2x gate.
    "bf16_chain_vs_truth": Tolerance(4e-3, "bf16 rounding of activations and output"),
    # wo_a then wo_b, both FP8, against another implementation of the same pair: the first
    # GEMM's bf16 rounding may differ by summation order, which can move an e4m3 rounding of
    # the re-quantized intermediate: about 3.4e-3 between the Triton and pure-torch backends on
    # V4-Flash and V4-Pro shapes; ~3x gate.
    "fp8_wo_a_wo_b_impls": Tolerance(1e-2, "order-dependent bf16 rounding re-quantized to fp8"),
}


def to_numpy(x) -> np.ndarray:
    """numpy view of a numpy/JAX/torch array (torch fp8/e8m0/bf16 go through their raw bytes)."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        import ml_dtypes

        t = x.detach().cpu()
        name = str(t.dtype).removeprefix("torch.")
        if name in ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                    "float8_e8m0fnu"):
            import torch

            raw = t.contiguous().view(torch.uint8 if t.element_size() == 1 else torch.int16)
            return raw.numpy().view(getattr(ml_dtypes, name))
        return t.numpy()
    return np.asarray(x)


def _raw_bits(a: np.ndarray) -> np.ndarray:
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bitwise_equal(actual, expected, *, name: str = "tensor") -> None:
    """Raise ``AssertionError`` unless both arrays have the same shape, dtype width and bits.

    The message names the count of mismatches, the first mismatching coordinate and both values.
    """
    a, e = to_numpy(actual), to_numpy(expected)
    if a.shape != e.shape:
        raise AssertionError(f"{name}: shape {a.shape} != expected {e.shape}")
    if a.dtype.itemsize != e.dtype.itemsize:
        raise AssertionError(f"{name}: dtype {a.dtype} != expected {e.dtype}")
    ab, eb = _raw_bits(np.ascontiguousarray(a)), _raw_bits(np.ascontiguousarray(e))
    bad = ab != eb
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {bad.size} elements differ; first at {list(idx)}: "
            f"got {a[idx]!r} (0x{int(ab[idx]):x}), expected {e[idx]!r} (0x{int(eb[idx]):x})"
        )


def bytes_equal_fraction(actual, expected) -> float:
    """Fraction of elements whose bits are equal (1.0 for identical arrays; 1.0 when empty)."""
    a, e = to_numpy(actual), to_numpy(expected)
    if a.shape != e.shape:
        raise ValueError(f"shape {a.shape} != {e.shape}")
    if a.size == 0:
        return 1.0
    return float((_raw_bits(np.ascontiguousarray(a)) == _raw_bits(np.ascontiguousarray(e))).mean())


def _f64(x) -> np.ndarray:
    return to_numpy(x).astype(np.float64)


def calc_diff(x, y) -> float:
    """DeepGEMM's similarity gap ``1 - 2 <x, y> / (|x|^2 + |y|^2)`` (0 for identical inputs)."""
    a, b = _f64(x), _f64(y)
    denom = float((a * a + b * b).sum())
    if denom == 0.0:
        return 0.0
    return 1.0 - 2.0 * float((a * b).sum()) / denom


def relative_error(actual, reference) -> float:
    """Relative Frobenius error ``|actual - reference| / |reference|`` in float64."""
    a, r = _f64(actual), _f64(reference)
    if a.shape != r.shape:
        raise ValueError(f"shape {a.shape} != {r.shape}")
    nr = float(np.linalg.norm(r))
    diff = float(np.linalg.norm(a - r))
    if nr == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / nr


def assert_close(actual, reference, *, tolerance: str, name: str = "tensor") -> float:
    """Assert ``relative_error <= TOLERANCES[tolerance].rel`` and that no NaN slipped through."""
    a, r = _f64(actual), _f64(reference)
    if np.isnan(a).any() and not np.isnan(r).any():
        idx = tuple(int(i) for i in np.argwhere(np.isnan(a))[0])
        raise AssertionError(f"{name}: NaN at {list(idx)} where the reference is finite")
    err = relative_error(a, r)
    tol = TOLERANCES[tolerance]
    if not err <= tol.rel:
        raise AssertionError(
            f"{name}: relative error {err:.3e} exceeds {tol.rel:.1e} ({tolerance}: {tol.why})"
        )
    return err

