"""The Gemini plugin: ZeRO-3 over chunks with a memory budget, from colossal-zero."""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from colossal_contracts import ConfigError, ParamSharding
from colossal_memtrace import MomentRecorder
from colossal_models import apply_sequence_parallel
from colossal_models.sharding import ShardMap
from colossal_parallel import ProcessMesh
from colossal_zero import (
    GeminiConfig,
    GeminiModule,
    GeminiOptimizer,
    LazyInit,
    apply_gemini,
    check_disk_dir,
    load_sharded,
    save_sharded,
)
from colossal_zero.checkpoint import INDEX_FILE

from .._capability import Combination, check_combination, long_sequence, table_precision
from .._sizes import parse_bytes
from ..checkpoint._layout import save_layout
from ..checkpoint._layout_load import load_layout
from ._device import resolve_device
from ._full_model import FULL_MODEL_FILE, export_gemini
from ._gemini_tp import (
    check_sp,
    check_tp_inputs,
    shard_for_tp,
    sp_mesh_config,
    tp_folder,
    tp_mesh_config,
    tp_shard_maps,
    world_size,
)
from ._groups import GroupMap
from ._mesh_fields import MeshFields
from ._mesh_stats import axis_comm_bytes
from ._plugin import Plugin

__all__ = ["FULL_MODEL_FILE", "GeminiConfig", "GeminiPlugin", "export_gemini"]


@dataclass
class GeminiPlugin(MeshFields, Plugin):
    """Gemini: parameters, gradients and Adam states in chunks that move between the accelerator
    (within ``config.accelerator_bytes``), the host and the disk, sharded across data-parallel
    ranks.

    Attributes:
        config: how Gemini places, shards and computes the model: precision, placement and the
            budgets of each tier (colossal-zero's ``GeminiConfig``, ints of bytes: sizes such
            as "512MiB" go through ``parse_bytes`` first). Its ``disk_bytes`` follows [Note:
            budgets]: 0 (the default) is no disk tier, None a disk tier without a limit; a disk
            tier is checked at construction (``disk_dir`` must exist, be writable and have
            ``disk_bytes`` free) and keeps its files in a folder of its own under ``disk_dir``.
        lazy: the ``colossal.lazy_init()`` context the model was built in: its meta parameters
            are materialized chunk by chunk straight into their tier (bit-identical to eager).
        max_grad_norm: clip the global gradient norm (0: no clipping).
        export_full_model: also write the consolidated fp32 model beside the shards of each
            checkpoint, loadable by plain PyTorch and Hugging Face (``model-0000i-of-0000N
            .safetensors`` and ``model.safetensors.index.json``, streamed one chunk at a time:
            see ``save_checkpoint``). ``colossal train`` sets it per save (``--export``).
        export_shard_bytes: the largest shard of that export ("2GiB", or bytes; an int after
            construction).
        save_frozen: write the values of frozen (``requires_grad=False``) parameters into
            checkpoints; ``colossal train`` clears it for LoRA runs, whose base is rebuilt
            from its source on resume and checked against its fingerprint.
        sharded_checkpoint: every rank writes its shard into the checkpoint directory.
        sharding: parameter name -> tensor-parallel layout (``colossal_models.sharding.describe_sharding``)
            so the norm and fp16 overflow agree over the whole mesh; None: data parallelism only.
            Filled by the plugin when ``tp_size > 1``.
        tp_size, tp_mode, tp_depth: tensor parallelism under Gemini (GPT and PaLM), as
            ``MeshFields`` says (keyword-only): the plugin builds the mesh ``dp = world /
            tp_size``, shards the model through its plan, and shards Gemini's chunks over
            ``dp`` (ZeRO-3 with tp; see [Note: Gemini with tp]).
        sequence_parallel, sp_size: "ring" or "ulysses" over ``sp_size`` ranks (GPT and PaLM,
            with or without 1D tp): the mesh ``dp = world / (sp_size * tp_size)``; Gemini
            shards its chunks over dp and sp together ([Note: Gemini with sp]).
    """

    config: GeminiConfig = field(default_factory=GeminiConfig)
    max_grad_norm: float = 0.0
    export_full_model: bool = True
    save_frozen: bool = True
    export_shard_bytes: int | str = "2GiB"
    name: str = "gemini"
    sharded_checkpoint: bool = True
    sharding: Mapping[str, ParamSharding] | None = field(default=None, repr=False)
    lazy: LazyInit | None = field(default=None, repr=False)
    mesh: ProcessMesh | None = field(default=None, repr=False)
    _tp_maps: list[dict[str, ShardMap]] | None = field(default=None, repr=False)
    _model: GeminiModule | None = field(default=None, repr=False)
    _moved: int = field(default=0, repr=False)
    _disk_io: Any = field(default=None, repr=False)  # the previous call's disk I/O totals
    _faulted: int = field(default=0, repr=False)
    _unwritten: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.config, GeminiConfig):
            raise ConfigError(
                f"GeminiPlugin(config=...) takes a colossal_zero.GeminiConfig, got "
                f"{type(self.config).__name__}; e.g. GeminiPlugin(config=GeminiConfig("
                "precision='bf16', accelerator_bytes=parse_bytes('512MiB')))"
            )
        if not (
            isinstance(self.max_grad_norm, int | float)
            and math.isfinite(self.max_grad_norm)
            and self.max_grad_norm >= 0
        ):
            raise ConfigError(
                f"max_grad_norm must be a finite number >= 0 (0 is off), got {self.max_grad_norm!r}"
            )
        shard = parse_bytes(self.export_shard_bytes, what="export_shard_bytes")
        if not shard:
            raise ConfigError(
                f"export_shard_bytes must be a positive size such as '2GiB', got "
                f"{self.export_shard_bytes!r}"
            )
        self.export_shard_bytes = shard  # parsed once
        self.check_mesh_fields((None, "ring", "ulysses"))  # [Note: mesh fields]
        check_sp(self.sequence_parallel, self.sp_size)
        self._check_combination()
        if self.config.disk_bytes != 0:  # [Note: budgets]: 0 is no disk tier
            check_disk_dir(self.config.disk_dir, self.config.disk_bytes)

    def combination(self) -> Combination:
        """The kinds these settings compose ([Note: capability table])."""
        return Combination(
            tp=self.tp_mode if self.tp_size > 1 else "none",
            sp=self.sequence_parallel or "none",
            sharding="gemini",
            precision=table_precision(self.config.precision),  # fp64 composes as fp32
            lazy=self.lazy is not None,
        )

    def _check_combination(self) -> None:
        what = f"GeminiPlugin(tp_size={self.tp_size}, tp_mode={self.tp_mode!r}"
        what += f", sequence_parallel={self.sequence_parallel!r}"
        what += f", precision={self.config.precision!r}"
        what += f", lazy={'a lazily built model' if self.lazy else None})"
        check_combination(self.combination(), what=what)

    @property
    def precision(self) -> str:
        """The precision the chunks compute in: ``config.precision`` (``Booster.compute()``)."""
        return self.config.precision

    @precision.setter
    def precision(self, value: str) -> None:
        self.config = replace(self.config, precision=value)

    def _runtime_config(self) -> GeminiConfig:
        """``config`` with the disk tier's files in a folder of this model's own."""
        if self.config.disk_bytes == 0:
            return self.config
        return replace(self.config, disk_dir=_disk_subdir(self.config.disk_dir))

    def configure(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Apply Gemini to ``model`` and turn ``optimizer`` (Adam/AdamW, built on the plain
        model's parameters) into a ``GeminiOptimizer`` with the same groups."""
        cfg = self._runtime_config()
        group: Any = "default"
        self._check_combination()  # ``lazy`` may have been set after construction
        lazy = self.lazy
        if self.tp_size > 1:  # [Note: Gemini with tp]
            check_tp_inputs(model, optimizer)
            group_map = GroupMap(model, optimizer)  # by name, before parameters are replaced
            mesh_cfg = tp_mesh_config(
                world_size(), self.tp_size, self.tp_mode, self.tp_depth, self.sp_size
            )
            self.mesh = ProcessMesh(mesh_cfg)
            # a lazy model is sharded on the meta device: its slices fill the chunks
            optimizer, self.sharding = shard_for_tp(model, optimizer, self.mesh, group_map, lazy)
            self._tp_maps = tp_shard_maps(model, self.mesh)  # for the streamed export
            group = self.mesh.group("dp") if mesh_cfg.dp > 1 else None
        elif self.sp_size > 1:
            check_tp_inputs(model, optimizer)
            self.mesh = ProcessMesh(sp_mesh_config(world_size(), self.sp_size))
        long = long_sequence(self.sequence_parallel)  # ring or ulysses when sp_size > 1
        if self.sp_size > 1 and long is not None:  # [Note: Gemini with sp], after tp as hybrid
            assert self.mesh is not None
            apply_sequence_parallel(model, self.mesh, long)
            group = self.mesh.group("dp_sp")
        # the warmup step measures non-model bytes per moment (memtrace, through the contract)
        cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        recorder = MomentRecorder("cuda" if cuda else "cpu") if cfg.placement == "auto" else None
        gm = apply_gemini(model, cfg, group=group, recorder=recorder, lazy=lazy)
        opt = GeminiOptimizer.from_torch(
            gm, optimizer, max_grad_norm=self.max_grad_norm, sharding=self.sharding
        )
        self._model = gm
        return gm, opt

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        if isinstance(optimizer, GeminiOptimizer):  # times sp: [Note: Gemini with sp]
            optimizer.backward(loss * self.sp_size if self.sp_size > 1 else loss)
        else:
            loss.backward()

    def accumulating(self, optimizer: torch.optim.Optimizer) -> AbstractContextManager[Any]:
        """``GeminiOptimizer.accumulating`` (colossal-zero's [Note: update in backward])."""
        if isinstance(optimizer, GeminiOptimizer):
            return optimizer.accumulating()
        return nullcontext()

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, GeminiModule) else model

    def memory_stats(self) -> dict[str, Any]:
        """Per-tier bytes (now, and peak since the previous call) and bytes moved since the
        previous call and in total; with a disk tier, since the previous call, the bytes its
        reader read ahead (``disk_read_bytes``) and its writer wrote out, their in-flight
        seconds, and the bytes of disk payloads used without a read-ahead
        (``disk_faulted_bytes``, read by page faults on use), and the bytes moved back to disk
        without a write (``disk_unwritten_bytes``: colossal-chunk's [Note: disk copies])."""
        if self._model is None:
            return {}
        stats = self._model.memory_stats()
        out: dict[str, Any] = {}
        for name, t in stats.tiers.items():
            out[f"{name}_bytes"] = t.used_bytes
            out[f"{name}_peak_bytes"] = t.peak_bytes
        out["accelerator_emulated"] = stats.tiers["accelerator"].emulated
        out["non_model_reserved_bytes"] = self.config.non_model_bytes
        total = stats.bytes_moved
        out["bytes_moved"], self._moved = total - self._moved, total
        out["bytes_moved_total"] = total
        if stats.disk_io is not None:  # background disk I/O since the previous call
            io = stats.disk_io if self._disk_io is None else stats.disk_io - self._disk_io
            self._disk_io = stats.disk_io
            out["disk_read_bytes"], out["disk_written_bytes"] = io.bytes_read, io.bytes_written
            out["disk_read_s"], out["disk_write_s"] = io.read_s, io.write_s
            out["disk_busy_s"] = io.busy_s  # either in flight (colossal-chunk's [Note: busy time])
            # disk payloads used without a read-ahead: read by page faults on the step's path,
            # not in disk_read_bytes (colossal-chunk's [Note: disk fault-ins])
            faulted = stats.disk_faulted_bytes or 0
            out["disk_faulted_bytes"], self._faulted = faulted - self._faulted, faulted
            kept = stats.disk_unwritten_bytes
            out["disk_unwritten_bytes"], self._unwritten = kept - self._unwritten, kept
        self._model.reset_peaks()  # the next call reports the next step's peaks
        if self.mesh is not None:
            out["mesh"] = self.describe()
            # the tp axes' counted bytes; Gemini's own dp gathers are not counted by the mesh
            tp = axis_comm_bytes(self.mesh)
            out.update({k: v for k, v in tp.items() if k != "comm_dp_bytes_total"})
        return out

    @property
    def device(self) -> torch.device:
        """Where chunks compute: the accelerator tier's device (CUDA, or the CPU emulating it);
        Gemini moves each batch there itself."""
        if self._model is not None:
            return self._model.compute_device
        cuda = self.config.device != "cpu" and torch.cuda.is_available()
        return resolve_device("auto") if cuda else torch.device("cpu")

    def describe(self) -> str:
        """The mesh as one line, e.g. ``dp2 x tp2(1d), gemini``."""
        dp = world_size() // (self.tp_size * self.sp_size)
        tp = f" x tp{self.tp_size}({self.tp_mode})" if self.tp_size > 1 else ""
        if self.sp_size > 1:
            tp += f" x sp{self.sp_size}({self.sequence_parallel})"
        return f"dp{dp}{tp}, gemini"

    def label(self) -> str:
        """The mesh (with ``--tp``/``--sp``), else placement, precision and budget."""
        if self.mesh is not None:
            return f"{self.name} ({self.describe()})"
        c = self.config
        budget = "whole accelerator" if c.accelerator_bytes is None else _mib(c.accelerator_bytes)
        label = f"{self.name} ({c.placement}, {c.precision}, budget {budget}"
        if c.non_model_bytes:
            label += f", {_mib(c.non_model_bytes)} kept for activations"
        return label + ")"

    def reserve_activations(self, estimate: Callable[[], int]) -> None:
        """Under an accelerator budget: ``config.non_model_bytes = estimate()`` (the warmup
        keeps that much free of chunks; see ``GeminiConfig.non_model_bytes``)."""
        if self.config.accelerator_bytes is not None:
            self.config = replace(self.config, non_model_bytes=estimate())

    def choose_checkpoint_contents(self, *, export_full_model: bool, save_frozen: bool) -> None:
        self.export_full_model = export_full_model
        self.save_frozen = save_frozen

    def close(self, *, collective: bool = True) -> None:
        """Join the chunk manager's background work (prefetch copies, disk readers and writer)
        and remove its disk files; with ``collective`` first finish the chunk collectives in
        flight and destroy the tensor-parallel mesh's process groups. No training after."""
        if self._model is not None:  # collectives and copies in flight finish first when
            self._model.close(settle=collective)  # collective ([Note: clean exit])
        if collective and self.mesh is not None:
            self.mesh.close()
            self.mesh = None

    def save_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        """Every rank streams its shard (see colossal-zero's sharded layout); with
        ``export_full_model`` rank 0 also writes the consolidated fp32 model in bounded
        safetensors shards with a Hugging Face index. Collective.

        The export gathers one chunk at a time over dp and rank 0 writes its tensors before the
        next is gathered, so no process holds the model (``iter_full_state``). With tp each of
        those tensors is assembled over tp on rank 0 alone before it is written
        (``tp_stream_state``): no process holds the model either."""
        gm = _gemini_module(model)
        opt = optimizer if isinstance(optimizer, GeminiOptimizer) else None
        if self.mesh is not None:  # [Note: layout checkpoint]: any tp size or plugin resumes it
            save_layout(gm, opt, self.mesh, Path(path), layout=self.describe())
        else:
            save_sharded(gm, opt, Path(path), frozen_values=self.save_frozen)
        if self.export_full_model:
            limit = int(self.export_shard_bytes)
            tp_mesh = self.mesh if self.tp_size > 1 else None
            export_gemini(gm, Path(path), max_shard_bytes=limit, mesh=tp_mesh, maps=self._tp_maps)

    def load_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        gm = _gemini_module(model)
        opt = optimizer if isinstance(optimizer, GeminiOptimizer) else None
        saved_tp = sorted(p.name for p in Path(path).glob("tp*-0-of-*"))
        if saved_tp:  # an older Gemini-tp checkpoint: a folder per tp coordinate
            folder = self._shard_folder(path)
            if self.mesh is None or not folder.is_dir():
                raise ConfigError(
                    f"checkpoint {path} was saved with another tensor-parallel layout (folders "
                    f"{saved_tp}); resume with the tp_size and tp_mode it was saved with, or "
                    "load its consolidated export (model.safetensors.index.json) into a plain "
                    "model"
                )
            load_sharded(gm, opt, folder)
        elif self.mesh is None and (Path(path) / INDEX_FILE).is_file():  # its own format
            load_sharded(gm, opt, Path(path))  # streamed, chunk by chunk
        else:  # [Note: one reader]: any other layout's or plugin's
            load_layout(gm, opt, self.mesh, Path(path))

    def _shard_folder(self, path: Path) -> Path:
        return Path(path) if self.mesh is None else tp_folder(path, self.mesh)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


def _disk_subdir(disk_dir: str | Path | None) -> Path | None:
    """A folder of this model's disk tier under ``disk_dir`` (None: a temporary one), created
    and removed by the disk tier, so ranks, runs and models of one process sharing a directory
    never share or leave files."""
    if disk_dir is None:
        return None
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    return Path(disk_dir) / f"colossal-chunks-{os.getpid()}-rank{rank}-{uuid.uuid4().hex[:8]}"


def _gemini_module(model: nn.Module) -> GeminiModule:
    if not isinstance(model, GeminiModule):
        raise ConfigError("GeminiPlugin checkpoints need the model that Booster.boost returned")
    return model
