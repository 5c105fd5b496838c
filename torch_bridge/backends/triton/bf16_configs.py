"""Launch rules of the BF16 chain's GEMM (``bf16_kernels``): its launch shapes, the choice
between the GEMM from ``o`` and a rotated copy with cuBLAS, and the shapes it cannot tile.

Pure functions of integers (no torch, no Triton, no GPU), as are ``configs``' rules.
"""

from __future__ import annotations

import dataclasses
import math

from .configs import ONE_WAVE_TILES, _check_power_of_two, _memoized, cdiv


@dataclasses.dataclass(frozen=True)
class Bf16GemmConfig:
    """Launch shape of the BF16 chain's GEMM: the pointer kernel (``wo_a_bf16_kernel``) or,
    with ``tma``, the tensor-descriptor one where the operands allow it (groups of whole heads,
    N a multiple of ``block_n``, 16-byte aligned rows; else the pointer kernel at this shape).
    With ``rotate`` the chain is one launch (``wo_a_bf16_rotating_kernel``, groups of whole
    heads): the kernel rotates the rope tiles itself, no buffer of rotated tails."""

    block_m: int
    block_n: int
    #: K lanes per tile; must divide the head dim and the rope dim (``bf16_gemm_blocker``).
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    tma: bool = False
    rotate: bool = False
    #: The one-launch chain only: K parts, each a whole number of a group's heads.
    split_k: int = 1

    def __post_init__(self):
        for field in ("block_m", "block_n", "block_k"):  # tl.dot needs every tile dim >= 16
            _check_power_of_two(self, field, getattr(self, field), 16)
        _check_power_of_two(self, "num_warps", self.num_warps, 1)
        if self.num_stages < 1:
            raise ValueError(f"Bf16GemmConfig.num_stages must be >= 1, got {self.num_stages}")
        if self.tma and self.rotate:
            raise ValueError("Bf16GemmConfig: the one-launch chain (rotate) has pointer loads; "
                             "the TMA kernel reads the rotated tails (tma=True and rotate=True "
                             "together)")
        if self.split_k < 1 or (self.split_k > 1 and not self.rotate):
            raise ValueError(f"Bf16GemmConfig.split_k must be >= 1, and above 1 only with "
                             f"rotate=True (the one-launch chain splits K), got {self}")

    def label(self) -> str:
        return (f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.num_warps}"
                f"st{self.num_stages}{'T' if self.tma else ''}{'R' if self.rotate else ''}"
                + (f"s{self.split_k}" if self.split_k > 1 else ""))


def bf16_block_k_limit(dh: int, rd: int, k: int) -> int:
    """The widest power-of-two K tile that lies in one head and is all NoPE or all rope: the
    largest power of two dividing Dh, rd and K, at most 64."""
    common = math.gcd(math.gcd(dh, rd), k)
    return min(64, common & -common) if common else 0


def bf16_gemm_blocker(dh: int, rd: int, k: int,
                      config: Bf16GemmConfig | None = None) -> str | None:
    """Why the BF16 GEMM cannot read A from ``o`` and the rotated tails for head dim ``dh``,
    rope dim ``rd`` and group width ``k`` at ``config`` (``None`` when it can)."""
    if not 0 < rd <= dh:
        return f"rope dim {rd} is not in (0, head_dim {dh}]"
    limit = bf16_block_k_limit(dh, rd, k)
    if limit < 16:
        return (f"no K tile of >= 16 lanes lies in one head and on one side of the rope "
                f"boundary (head_dim {dh}, rope dim {rd}, K {k})")
    if config is not None and limit % config.block_k:
        return (f"block_k {config.block_k} must divide head_dim {dh}, rope dim {rd} and K {k} "
                f"(at most {limit} here)")
    if config is not None and config.rotate and k % dh:
        return (f"the one-launch chain (rotate=True) needs groups of whole heads: K {k} is not "
                f"a multiple of head_dim {dh}")
    if config is not None and (k // dh) % config.split_k:
        return (f"split_k {config.split_k} must divide the {k // dh} heads of a group "
                f"(K {k} / head_dim {dh}): the one-launch chain splits K by heads")
    return None


#: ``wo_a_bf16`` runs the BF16 GEMM from ``o`` (its TMA kernel) from this many tokens and
#: (token, group) rows of A, and copies ``o`` for cuBLAS below (``bf16_gemm_chosen``).
BF16_GEMM_MIN_TOKENS = 128
BF16_GEMM_MIN_ROWS = 2048
#: ``wo_a_bf16`` runs the one-launch chain (``Bf16GemmConfig.rotate``) up to this many tokens,
#: and up to ``BF16_ROTATING_WIDE_TOKENS`` from ``BF16_ROTATING_WIDE_GROUPS`` groups, or where
#: its 64-row tiles are at most ``BF16_SPLIT_TILES`` (G = 2), K split by heads into one wave
#: (``bf16_gemm_chosen``, ``bf16_gemm_config``).
BF16_ROTATING_MAX_TOKENS = 16
BF16_ROTATING_WIDE_TOKENS = 64
BF16_ROTATING_WIDE_GROUPS = 16
BF16_SPLIT_TILES = ONE_WAVE_TILES // 4


def bf16_gemm_chosen(s: int, g: int, n: int, k: int, *, tma: bool,
                     dh: int | None = None) -> bool:
    """Whether ``wo_a_bf16`` (not in place) runs the BF16 GEMM from ``o`` rather than a rotated
    copy of ``o`` and cuBLAS, on a device with tensor-memory loads (``tma``: Hopper, where the
    rule is measured). For groups of whole heads of ``dh`` lanes, up to
    ``BF16_ROTATING_MAX_TOKENS`` tokens (``BF16_ROTATING_WIDE_TOKENS`` with enough groups to
    fill the GPU with its larger token tiles, or with K split where those tiles are few:
    ``bf16_split``) the one-launch chain: it streams the weight as fast as cuBLAS, and saves
    the second launch's host time. From ``BF16_GEMM_MIN_TOKENS`` tokens and
    ``BF16_GEMM_MIN_ROWS`` rows the TMA kernel. Between, those tiles make too few programs and
    copying ``o`` is cheap."""
    if s <= BF16_ROTATING_MAX_TOKENS or (s <= BF16_ROTATING_WIDE_TOKENS and (
            g >= BF16_ROTATING_WIDE_GROUPS or bf16_split(s, g, n, k, dh) > 1)):
        return tma and dh is not None and k % dh == 0
    return tma and s >= BF16_GEMM_MIN_TOKENS and s * g >= BF16_GEMM_MIN_ROWS


def _bf16_tile_ladder(target: str) -> tuple[Bf16GemmConfig, ...]:
    """Tiles from the largest down: Hopper's 128 x 256 x 64 wgmma tile first. ROCm keeps two
    stages of 128 x 128 x 32 tiles (32 KiB of LDS, half of gfx942's 64 KiB)."""
    if target == "hip":
        return (Bf16GemmConfig(128, 128, 32, num_warps=4, num_stages=2),
                Bf16GemmConfig(64, 128, 32, num_warps=4, num_stages=2),
                Bf16GemmConfig(64, 64, 32, num_warps=4, num_stages=2))
    return (Bf16GemmConfig(128, 256, 64, num_warps=8, num_stages=3),
            Bf16GemmConfig(128, 128, 64, num_warps=8, num_stages=4),
            Bf16GemmConfig(64, 128, 64, num_warps=4, num_stages=4),
            Bf16GemmConfig(64, 64, 64, num_warps=4, num_stages=4))


#: The TMA kernel's tiles from the largest down (Hopper). The one-wave 128 x 128 grids (G = 8 at
#: 256 tokens, G = 16 at 128) stream the weight: five stages keep more of it in flight.
_BF16_TMA_LADDER = (Bf16GemmConfig(128, 256, 64, num_warps=8, num_stages=3, tma=True),
                    Bf16GemmConfig(128, 128, 64, num_warps=4, num_stages=5, tma=True),
                    Bf16GemmConfig(64, 128, 64, num_warps=4, num_stages=4, tma=True))


def bf16_split(s: int, g: int, n: int, k: int, dh: int | None) -> int:
    """K parts of the one-launch chain from ``BF16_ROTATING_MAX_TOKENS + 1`` to
    ``BF16_ROTATING_WIDE_TOKENS`` tokens: where its 64-row tiles number at most
    ``BF16_SPLIT_TILES`` (G = 2), as many as make one wave (``ONE_WAVE_TILES``), at most 8, a
    divisor of the group's ``k / dh`` heads; else 1. Splitting K keeps each program's tile
    wide: narrowing it instead re-reads ``o`` once per narrow tile, and measured slower than
    cuBLAS there, as did the split at four times as many tiles (G = 4)."""
    if not (BF16_ROTATING_MAX_TOKENS < s <= BF16_ROTATING_WIDE_TOKENS) or not dh or k % dh:
        return 1
    tiles = _bf16_programs(Bf16GemmConfig(min(64, 1 << (s - 1).bit_length()), 64), s, g, n)
    if tiles > BF16_SPLIT_TILES:
        return 1
    split = min(8, ONE_WAVE_TILES // tiles)
    while (k // dh) % split:
        split //= 2
    return split


@_memoized
def bf16_gemm_config(s: int, g: int, n: int, k: int, block_k: int = 64,
                     target: str = "cuda", tma: bool = False,
                     dh: int | None = None) -> Bf16GemmConfig:
    """The BF16 GEMM's launch shape for ``[S, G, N]`` outputs (``target``: ``"cuda"``,
    ``"hip"`` or ``"interpreter"``); ``block_k`` caps the K tile (``bf16_block_k_limit``);
    ``dh``: the head dim, which K splits respect (``bf16_split``).

    With ``tma`` (Hopper) above 64 tokens: the TMA kernel's largest tile that still makes one
    wave of programs (``ONE_WAVE_TILES``), 64-lane K tiles.

    Above 64 tokens the largest tile of the ladder that still makes two waves of programs
    (``ONE_WAVE_TILES`` each; the last tile whatever it makes). Up to 64 tokens the problem
    streams the weight, and the tile is the one-launch chain's (``rotate``): the token tile
    is the tokens rounded up to a power of two (16 to 64), 64 weight rows per program, halved
    down to 16 until the programs fill one wave (G = 2 up to 16 tokens; above, on CUDA, K is
    split instead where ``bf16_split`` says so). Where they make more than a wave, 5 stages;
    in one wave each program streams more of the weight, with 8 stages, 12 for 16-row tiles,
    which keep fewer bytes in flight per stage.
    """
    if s <= 64:
        cfg = Bf16GemmConfig(min(64, max(16, 1 << max(0, s - 1).bit_length())), 64,
                             min(block_k, 32 if target == "hip" else 64), num_warps=4,
                             num_stages=5, rotate=True)
        split = bf16_split(s, g, n, k, dh) if target == "cuda" else 1
        if split > 1:
            return dataclasses.replace(cfg, num_stages=8, split_k=split)
        while cfg.block_n > 16 and _bf16_programs(cfg, s, g, n) < ONE_WAVE_TILES:
            cfg = dataclasses.replace(cfg, block_n=cfg.block_n // 2)
        if target == "hip":
            return dataclasses.replace(cfg, num_stages=2)
        if _bf16_programs(cfg, s, g, n) > ONE_WAVE_TILES:
            return cfg
        return dataclasses.replace(cfg, num_stages=12 if cfg.block_n == 16 else 8)
    if tma and block_k == 64:
        for cfg in _BF16_TMA_LADDER:
            if _bf16_programs(cfg, s, g, n) >= ONE_WAVE_TILES:
                break
        return cfg
    ladder = _bf16_tile_ladder(target)
    for cfg in ladder:
        if _bf16_programs(cfg, s, g, n) >= 2 * ONE_WAVE_TILES:
            break
    return dataclasses.replace(cfg, block_k=min(cfg.block_k, block_k))


def _bf16_programs(cfg: Bf16GemmConfig, s: int, g: int, n: int) -> int:
    return cdiv(s, cfg.block_m) * cdiv(n, cfg.block_n) * g
