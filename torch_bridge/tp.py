"""Tensor-parallel ``wo_a -> wo_b`` with ``torch.distributed`` (NCCL on GPUs, gloo on CPU).

Rank ``r`` of ``tp`` holds whole ``wo_a`` groups ``[r * G_l, (r+1) * G_l)`` and the matching
``wo_b`` input columns (``woa_jax.tp.tp_shard``), runs ``wo_a`` on its heads of ``o``, then its
``wo_b`` columns, giving an fp32 partial ``[T, hidden]``; ``all_reduce`` sums the partials in fp32
and the result is cast once to bf16. A TP result therefore differs from TP1 only by the fp32
summation order. ``o_groups % tp != 0`` is a ``ValueError`` (upstream silently drops groups).

Path: when ``wo_a`` runs its FP8 chain (aiter, triton or torch), ``wo_b`` runs FP8 on the same
backend; when ``wo_a`` falls back to the BF16 chain, so does ``wo_b``.
"""

from __future__ import annotations

import pathlib

import torch
import torch.distributed as dist

import woa_jax
from woa_jax import AITER_AMAX_FLOOR, checks
from woa_jax import tp as woa_tp
from woa_jax.tp import TPShard
from woa_jax.wo_b import ProjectionPath

from . import _dispatch, checkpoint, interop, ops
from ._dispatch import BackendName
from .projection import WoAProjection
from .wo_b import WoBProjection


def wo_b_names(layer: int, naming: checkpoint.Naming = "deepseek") -> tuple[str, str]:
    """``(weight name, scale name)`` of ``wo_b`` in layer ``layer`` (``"deepseek"``/``"vllm"``)."""
    return checkpoint.projection_names(layer, "wo_b", naming)


def read_wo_b(path: str | pathlib.Path, layer: int, shard: TPShard
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Read only ``shard``'s ``wo_b`` columns (and scale columns) of layer ``layer``, on the CPU.

    Names: ``layers.{i}.attn.wo_b.{weight,scale}`` (DeepSeek) or any ``...layers.{i}.self_attn.
    wo_b.{weight,weight_scale_inv,weight_scale}`` (vLLM / ModelOpt). Returns ``(weight [hidden,
    G_l * N], scale [hidden / B, G_l * N / B] or None for an unquantized weight)``.
    """
    files = checkpoint.tensor_files(path)
    wname, sname = checkpoint.find_projection(files, layer, "wo_b")
    with checkpoint.open_shard(files[wname]) as fh:
        sl = fh.get_slice(wname)
        shape = tuple(sl.get_shape())
        gn = shard.local.num_groups * shard.local.group_out_features * shard.tp
        if len(shape) != 2 or shape[1] != gn:
            raise ValueError(f"{wname} has shape {shape}; expected [hidden, G * N] with "
                             f"G * N = {gn}")
        weight = sl[:, shard.wo_b_cols].contiguous()
    scale = None
    if sname is not None:
        with checkpoint.open_shard(files[sname]) as fh:
            sl = fh.get_slice(sname)
            sshape, block = tuple(sl.get_shape()), shard.local.block_size
            if len(sshape) != 2 or sshape[1] * block != gn:  # the config's block, not another
                raise ValueError(f"{sname} has shape {sshape}; the config's {block}x{block} "
                                 f"blocks of [hidden, {gn}] give {gn // block} columns")
            scale = sl[:, shard.wo_b_scale_cols].contiguous()
    return weight, scale


def _world(group, tp_rank: int | None, tp_size: int | None) -> tuple[int, int]:
    """``(rank, size)``: as given, else from the initialised process group, else TP1."""
    if dist.is_available() and dist.is_initialized():
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        if tp_size is not None and tp_size != size:
            raise ValueError(f"tp_size={tp_size} but the process group has {size} ranks")
        if tp_rank is not None and tp_rank != rank:
            raise ValueError(f"tp_rank={tp_rank} but this process is rank {rank} of the group")
        return rank, size
    if tp_size not in (None, 1) or tp_rank not in (None, 0):
        raise ValueError(
            f"tp_size={tp_size}, tp_rank={tp_rank} need torch.distributed: call "
            "dist.init_process_group (NCCL on GPUs, gloo on CPU) first"
        )
    return 0, 1


def _check_full_weights(cfg: woa_jax.DSV4Config, wo_a_weight, wo_b_weight) -> None:
    """Require the full (TP1) weights to have the shapes ``cfg`` implies (scales not needed)."""
    gn = cfg.o_groups * cfg.o_lora_rank
    for what, t, shape in (("wo_a weight", wo_a_weight, (gn, cfg.group_in_features)),
                           ("wo_b weight", wo_b_weight, (cfg.hidden_size, gn))):
        got = tuple(int(d) for d in t.shape)
        if got != shape:
            raise ValueError(f"{cfg.name}: {what} has shape {got}, expected {shape}")


class TPOutputProjection:
    """``wo_a -> wo_b`` of one layer on one tensor-parallel rank, reduced over ``group``.

    Build it with ``from_tensors`` (full TP1 tensors, sliced here) or ``from_checkpoint`` (reads
    only this rank's slices). Call it with this rank's heads of ``o`` (``o_full[:, self.heads]``).

    Args:
      wo_a: this rank's ``WoAProjection`` (``G_l`` groups).
      wo_b: this rank's ``WoBProjection`` (``G_l * N`` input columns).
      shard: the ``woa_jax.tp.TPShard`` the two were cut with.
      group: the ``torch.distributed`` process group of the TP ranks (default: the world).
    """

    def __init__(self, wo_a: WoAProjection, wo_b: WoBProjection, shard: TPShard, *, group=None):
        if wo_b.in_features != wo_a.num_groups * wo_a.n:
            raise ValueError(
                f"wo_b has {wo_b.in_features} input columns but wo_a gives G_l * N = "
                f"{wo_a.num_groups} * {wo_a.n} = {wo_a.num_groups * wo_a.n}"
            )
        if wo_a.num_groups != shard.local.num_groups:
            raise ValueError(f"wo_a has {wo_a.num_groups} groups; the shard holds "
                             f"{shard.local.num_groups}")
        self.wo_a, self.wo_b, self.shard, self.group = wo_a, wo_b, shard, group

    @property
    def heads(self) -> slice:
        """This rank's heads of the full ``o [T, H, Dh]``."""
        return self.shard.heads

    @property
    def tp(self) -> int:
        return self.shard.tp

    @property
    def rank(self) -> int:
        return self.shard.rank

    @classmethod
    @interop.jax_io()
    def from_tensors(cls, wo_a_weight, wo_a_weight_scale, wo_b_weight, wo_b_weight_scale,
                     config: woa_jax.DSV4Config | str, cos_cache, sin_cache, *,
                     tp_rank: int | None = None, tp_size: int | None = None, group=None,
                     device: torch.device | str | None = None,
                     backend: BackendName = "auto",
                     amax_floor: float = AITER_AMAX_FLOOR) -> TPOutputProjection:
        """Slice the full (TP1) checkpoint tensors for this rank and build the projection.

        Args:
          wo_a_weight, wo_a_weight_scale: ``[G * N, K]`` fp8 and ``[G * N / B, K / B]``
            scales, or an unquantized bf16/fp16/fp32 weight and ``None`` (BF16 chain only).
          wo_b_weight, wo_b_weight_scale: ``[hidden, G * N]`` fp8 and
            ``[hidden / B, G * N / B]``, or an unquantized weight and ``None``.
          config: the model config (``o_groups``, shapes, block); the tensors must match it.
          cos_cache, sin_cache: ``[P, rd / 2]`` RoPE tables of this layer.
          tp_rank, tp_size: default from the initialised process ``group``; without
            ``torch.distributed`` only TP1 is possible.
          device: where the rank's weights go (default: where they are).
          backend, amax_floor: as for ``WoAProjection``.
        """
        cfg = woa_jax.get_config(config)
        device = None if device is None else ops.usable_device(device)
        rank, size = _world(group, tp_rank, tp_size)
        shard = woa_tp.tp_shard(cfg, size, rank)
        ops.require_torch(wo_a_weight=wo_a_weight, wo_a_weight_scale=wo_a_weight_scale,
                          wo_b_weight=wo_b_weight, wo_b_weight_scale=wo_b_weight_scale,
                          cos_cache=cos_cache, sin_cache=sin_cache,
                          optional=("wo_a_weight_scale", "wo_b_weight_scale"))
        wa, sa, wb, sb = wo_a_weight, wo_a_weight_scale, wo_b_weight, wo_b_weight_scale
        if sa is not None and sb is not None:
            woa_tp.check_tp_weights(cfg, wa, sa, wb, sb)
            parts = woa_tp.shard_wo_a_wo_b(wa, sa, wb, sb, shard)
        else:
            # An unquantized weight has no scale (as in from_checkpoint): check the weights here;
            # a scale that is given is checked against its weight slice by the projection.
            _check_full_weights(cfg, wa, wb)
            parts = (wa[shard.wo_a_rows], None if sa is None else sa[shard.wo_a_scale_rows],
                     wb[:, shard.wo_b_cols], None if sb is None else sb[:, shard.wo_b_scale_cols])
        # Copies when tp > 1, so a rank does not keep the full tensors alive through views.
        wa, sa, wb, sb = (None if t is None
                          else (t.clone(memory_format=torch.contiguous_format) if size > 1
                                else t.contiguous()) for t in parts)
        if device is not None:
            wa, sa, wb, sb = (None if t is None else t.to(device) for t in (wa, sa, wb, sb))
            cos_cache, sin_cache = cos_cache.to(device), sin_cache.to(device)
        wo_a = WoAProjection.from_tensors(wa, sa, shard.local.num_groups, cos_cache, sin_cache,
                                          backend=backend, amax_floor=amax_floor, config=cfg)
        return cls(wo_a, WoBProjection(wb, sb, amax_floor=amax_floor), shard, group=group)

    @classmethod
    def from_checkpoint(cls, path: str | pathlib.Path, layer: int,
                        config: woa_jax.DSV4Config | str, *, tp_rank: int | None = None,
                        tp_size: int | None = None, group=None,
                        device: torch.device | str | None = None,
                        backend: BackendName = "auto", amax_floor: float = AITER_AMAX_FLOOR,
                        **wo_a_kwargs) -> TPOutputProjection:
        """Read this rank's ``wo_a`` rows and ``wo_b`` columns of layer ``layer`` from disk.

        Args:
          path: ``.safetensors`` file or checkpoint directory (``torch_bridge.checkpoint``).
          layer: layer index ``i`` of ``layers.{i}.attn.wo_{a,b}``.
          config: the model config; ``o_groups % tp_size`` is checked before anything is read.
          tp_rank, tp_size, group, device, backend, amax_floor: see ``from_tensors``.
          **wo_a_kwargs: passed to ``WoAProjection.from_checkpoint`` (``layer_kind``,
            ``cos_cache``/``sin_cache``, ``max_positions``).
        """
        cfg = woa_jax.get_config(config)
        rank, size = _world(group, tp_rank, tp_size)
        shard = woa_tp.tp_shard(cfg, size, rank)
        wo_a = WoAProjection.from_checkpoint(path, layer, rank, size, config=cfg,
                                             num_groups=cfg.o_groups, device=device,
                                             backend=backend, amax_floor=amax_floor,
                                             **wo_a_kwargs)
        wb, sb = read_wo_b(path, layer, shard)
        if wb.shape[0] != cfg.hidden_size:
            raise ValueError(f"layer {layer} wo_b has {wb.shape[0]} rows; {cfg.name} has "
                             f"hidden_size={cfg.hidden_size}")
        if device is not None:
            wb = wb.to(device)
            sb = sb.to(device) if sb is not None else None
        return cls(wo_a, WoBProjection(wb, sb, amax_floor=amax_floor), shard, group=group)

    def _wo_b_route(self) -> tuple[ProjectionPath, str]:
        """``wo_b``'s path and backend, following the chain ``wo_a`` just ran."""
        name = self.wo_a.path
        if "wo_a_bf16" in _dispatch.get_backend(name).ops:
            return ProjectionPath.BF16, name
        return ProjectionPath.FP8, name

    def partial(self, o, positions) -> torch.Tensor:
        """This rank's fp32 ``[T, hidden]`` partial: ``wo_b_r(wo_a_r(o).flatten(1))``.

        Args:
          o: ``[T, H_l, Dh]`` this rank's heads (``o_full[:, self.heads]``), bf16.
          positions: ``[>= T]`` int32/int64.
        """
        ops.require_torch(o=o, positions=positions)
        _, h, _ = checks.check_rank(o, 3, "o", "[T, H_l, Dh]")
        if h != self.shard.local.num_heads:
            raise ValueError(f"o has {h} heads; rank {self.rank} of tp={self.tp} holds "
                             f"{self.shard.local.num_heads} (pass o_full[:, proj.heads])")
        z = self.wo_a(o, positions)  # [T, G_l, N] bf16
        path, backend = self._wo_b_route()
        return self.wo_b(z.flatten(1), path=path, backend=backend, dtype=torch.float32)

    @interop.jax_io()
    def __call__(self, o, positions, *, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The layer's attention output ``[T, hidden]`` in ``dtype``, identical on every rank.

        The fp32 partials are summed with ``dist.all_reduce`` (skipped at TP1) and cast once.

        Args:
          o: ``[T, H_l, Dh]`` this rank's heads (``o_full[:, self.heads]``).
          positions: ``[>= T]`` int32/int64.
          dtype: ``torch.bfloat16`` (default) or ``torch.float32``.

        Raises:
          TypeError: a non-tensor argument or a wrong dtype.
          ValueError: a wrong shape (the heads of another rank included).
        """
        if dtype not in (torch.bfloat16, torch.float32):
            raise TypeError(f"dtype must be torch.bfloat16 or torch.float32, got {dtype}")
        y = self.partial(o, positions)
        if self.tp > 1:
            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError(f"tp={self.tp} needs an initialised torch.distributed group")
            dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
        return y.to(dtype)

    def __repr__(self) -> str:
        return (f"TPOutputProjection(rank={self.rank}, tp={self.tp}, {self.wo_a!r}, "
                f"{self.wo_b!r})")
