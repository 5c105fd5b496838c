"""Split-K scratch of the pointer GEMM kernels: fp32 parts, and tile counters left at zero."""

from __future__ import annotations

import logging
import threading

import torch

log = logging.getLogger("woa")

#: int32 tile counters per device (4 MiB). Serial split-K's last part sets its tile's counter
#: back to 0, so eager launches on one stream (which never overlap) share one range. A launch
#: captured in a CUDA graph gets a range of its own for good: graphs captured on one stream may
#: replay concurrently on different streams.
SPLIT_COUNTERS = 1 << 20
_ALIGN = 4  # int32 counters per 16 bytes


class CounterPool:
    """One device's tile counters, handed out in ranges per stream (or per captured launch),
    and the fp32 parts buffer of each stream."""

    def __init__(self, device: torch.device):
        self.device = device
        self.counters = torch.zeros(SPLIT_COUNTERS, dtype=torch.int32, device=device)
        if self.counters.is_cuda:  # zeroed on this stream; launches on every stream use it
            torch.cuda.current_stream(device).synchronize()
        self.used = 0
        self.by_stream: dict[int, torch.Tensor] = {}
        self.parts_by_stream: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()  # threads launching on different streams get disjoint ranges

    def _take(self, tiles: int) -> torch.Tensor | None:
        # Every range starts 16-byte aligned: Triton specializes a kernel on its pointers'
        # alignment, and a new specialization met inside a CUDA-graph capture compiles and
        # loads a module there.
        start = -(-self.used // _ALIGN) * _ALIGN
        if start + tiles > SPLIT_COUNTERS:
            return None
        self.used = start + tiles
        return self.counters[start:start + tiles]

    def take(self, tiles: int, stream: int | None) -> torch.Tensor | None:
        """``tiles`` zeroed counters for a launch on ``stream`` (``None``: being captured)."""
        with self.lock:
            if stream is None:
                return self._take(tiles)
            mine = self.by_stream.get(stream)
            if mine is None or mine.numel() < tiles:
                mine = self._take(tiles)
                if mine is not None:
                    self.by_stream[stream] = mine
            return mine

    def parts(self, numel: int, stream: int) -> torch.Tensor:
        """``numel`` fp32 elements of ``stream``'s parts buffer (grown when a launch needs
        more): launches on one stream never overlap, so they share it, as they share their
        counters. A buffer given up is freed to the caching allocator on its stream."""
        with self.lock:
            mine = self.parts_by_stream.get(stream)
            if mine is None or mine.numel() < numel:
                mine = self.parts_by_stream[stream] = torch.empty(
                    numel, dtype=torch.float32, device=self.device)
            return mine[:numel]


COUNTER_POOLS: dict[torch.device, CounterPool] = {}


def check_given(given: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor, split_k: int,
                tiles: int) -> None:
    """Raise ``ValueError`` unless ``given`` is ``(parts, counters)`` a split launch can use:
    contiguous fp32 ``parts [split_k, *out.shape]`` and at least ``tiles`` contiguous int32
    counters, both on ``out``'s device and 16-byte aligned (the kernel is specialized on
    that, as for the pool's ranges). The counters must be zero: the kernel leaves them so."""
    parts, counters = given
    shape = (split_k, *out.shape)
    ok = (parts.dtype == torch.float32 and tuple(parts.shape) == shape and parts.is_contiguous()
          and counters.dtype == torch.int32 and counters.dim() == 1
          and counters.numel() >= tiles and counters.is_contiguous()
          and parts.device == counters.device == out.device
          and parts.data_ptr() % 16 == 0 and counters.data_ptr() % (4 * _ALIGN) == 0)
    if not ok:
        raise ValueError(
            f"split-K scratch must be contiguous fp32 parts {list(shape)} and >= {tiles} "
            f"contiguous int32 counters on {out.device}, 16-byte aligned; got parts "
            f"{parts.dtype} {list(parts.shape)}, counters {counters.dtype} "
            f"{list(counters.shape)}")
_FALLBACK_LOGGED: set[str] = set()


def split_scratch(out: torch.Tensor, split_k: int, tiles: int,
                  given: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``(split_k, parts, counters)`` for one launch writing ``out [M, G, N]`` in ``tiles``
    output tiles: fp32 ``parts [split_k, M, G, N]`` (the stream's buffer when eager, the
    launch's own when captured) and int32 counters; without split-K, ``(1, out, out)``
    (unused). ``given``: the caller's ``(parts, counters)`` instead, checked (``check_given``).
    Runs unsplit, logged once, when no counters can be had: the pool is created on the first
    split launch outside CUDA-graph capture, and a long run of captures can use it up."""
    if split_k == 1:
        return 1, out, out
    if given is not None:
        check_given(given, out, split_k, tiles)
        return split_k, *given
    capturing = out.is_cuda and torch.cuda.is_current_stream_capturing()
    pool = COUNTER_POOLS.get(out.device)
    if pool is None and not capturing:
        pool = COUNTER_POOLS[out.device] = CounterPool(out.device)
    stream = None if capturing else (torch.cuda.current_stream(out.device).cuda_stream
                                     if out.is_cuda else 0)
    counters = pool.take(tiles, stream) if pool is not None else None
    if counters is None:
        why = ("its counters are created on the first split launch outside CUDA-graph capture; "
               "run once before capturing" if pool is None else
               f"its {SPLIT_COUNTERS} counters are taken (each captured split launch keeps "
               f"its own)")
        if why not in _FALLBACK_LOGGED:
            _FALLBACK_LOGGED.add(why)
            log.warning("triton GEMM runs without split-K (slower at small M): %s", why)
        return 1, out, out
    shape = (split_k, *out.shape)
    if stream is None:
        return split_k, torch.empty(shape, dtype=torch.float32, device=out.device), counters
    return split_k, pool.parts(split_k * out.numel(), stream).view(shape), counters
