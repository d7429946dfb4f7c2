"""The hybrid plugin: tensor, pipeline and sequence parallelism with ZeRO-1/2 (or plain data
parallelism) on one mesh ``(pp, dp, sp, *tp)``, with ``dp = world / (tp * pp * sp)``.

[Note: hybrid gradients] With ``zero_stage=0`` the optimizer is the user's class rebuilt on the
sharded parameters, with a step pre-hook that sums gradients over ``sp`` (each sp rank holds a
part of the sequence), averages them over ``dp`` and clips by the norm over the whole mesh
(``mesh_grad_norm`` with the tensor-parallel layout plus a ``pp`` axis: every stage's
parameters are disjoint pieces, the tied embedding is counted on the first stage only). With
ZeRO-1/2 the ``LowLevelZeroOptimizer`` does the dp reduction and the mesh-wide norm itself; with
ring or Ulysses sequence parallelism it shards over ``dp_sp`` (dp and sp flattened), which
averages over dp * sp ranks, so the loss is multiplied by sp before backward (the sum over sp, the
mean over dp).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from colossal_contracts import ConfigError, ParamSharding
from colossal_models import (
    apply_activation_checkpointing,
    apply_sequence_parallel,
    describe_sharding,
    parallelize,
    split_into_stages,
)
from colossal_parallel import (
    SCHEDULES,
    TP_MODES,
    MeshConfig,
    PipelineSchedule,
    ProcessMesh,
)
from colossal_zero import LazyInit, LowLevelZeroOptimizer, ZeroConfig, adam_arguments

from .._capability import (
    PRECISIONS,
    SP_KINDS,
    Combination,
    check_combination,
    long_sequence,
    megatron_sequence,
)
from .._dist import init_single_process
from ..lora._tp import parallelize_lora
from ._device import move_model, resolve_device, to_device
from ._groups import GroupMap
from ._hybrid_checkpoint import load_layout, save_layout
from ._hybrid_grads import mesh_layout, reduce_and_clip
from ._hybrid_lora import prepare_lora
from ._hybrid_pipeline import PipelineModule, pipeline_loss, pipeline_step
from ._lazy_fill import fill_lazy, sharding_lazily
from ._mesh_stats import axis_comm_bytes

__all__ = ["HybridParallelPlugin", "PipelineModule"]

_SP_METHODS = (None, *SP_KINDS[1:])  # "ring+megatron": ring over sp, Megatron over tp


@dataclass
class HybridParallelPlugin:
    """Tensor (1d/2d/2.5d/3d), pipeline, sequence and data parallelism, ZeRO-1/2 over ``dp``.

    Every rank of one data-parallel coordinate (``data_rank``) must be given the same batch.
    Invariant: ``backward`` + ``step`` (or ``execute_pipeline`` + ``step``) equals AdamW on the
    global batch of the unsharded model, within tensor parallelism's rounding. Settings are
    checked before any process group is created.
    """

    tp_size: int = 1
    tp_mode: str = "1d"
    tp_depth: int = 1
    sequence_parallel: str | None = None
    sp_size: int = 1
    pp_size: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    num_virtual: int = 0  # 0: 2 for the interleaved schedule, else 1
    zero_stage: int = 0
    precision: str = "fp32"
    activation_checkpointing: bool = False
    max_grad_norm: float = 0.0
    bucket_numel: int = 1 << 22
    name: str = "hybrid"
    sharded_checkpoint: bool = True
    save_frozen: bool = (
        True  # a LoRA model's frozen base in checkpoints: [Note: LoRA layout checkpoint]
    )
    device: torch.device = "auto"  # type: ignore[assignment]  # [Note: plugin device]
    lazy: LazyInit | None = field(default=None, repr=False)  # the model's: [Note: lazy fill]
    mesh: ProcessMesh | None = field(default=None, repr=False)
    sharding: dict[str, ParamSharding] | None = field(default=None, repr=False)
    _stages: Any = field(default=None, repr=False)
    _optimizer: Any = field(default=None, repr=False)
    _boundary_dtype: torch.dtype = field(default=torch.float32, repr=False)
    _own_group: bool = field(default=False, repr=False)  # a one-rank group this plugin made
    _names: dict[str, str] | None = field(default=None, repr=False)  # HF LoRA: the user's names

    def __post_init__(self) -> None:
        for k in ("tp_size", "tp_depth", "sp_size", "pp_size", "microbatches"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"HybridParallelPlugin.{k} must be a positive int, got {v!r}")
        if self.zero_stage == 3:
            raise ConfigError(
                "the hybrid plugin shards up to ZeRO stage 2; for ZeRO-3 with tensor parallelism "
                "use GeminiPlugin(tp_size=...) (--plugin gemini with --tp)"
            )
        if self.zero_stage not in (0, 1, 2):
            raise ConfigError(f"zero_stage must be 0, 1 or 2, got {self.zero_stage!r}")
        if self.tp_mode not in TP_MODES:
            raise ConfigError(f"tp_mode must be one of {TP_MODES}, got {self.tp_mode!r}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.sequence_parallel not in _SP_METHODS:
            raise ConfigError(
                f"sequence_parallel must be one of {_SP_METHODS}, got {self.sequence_parallel!r}"
            )
        if self.num_virtual == 0:
            self.num_virtual = 2 if self.schedule == "interleaved" else 1
        if self.zero_stage:
            self._zero_config()  # validates precision and bucket size
        elif self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        self._check_combination()
        self.device = resolve_device(self.device)

    def combination(self) -> Combination:
        """The kinds these settings compose ([Note: capability table])."""
        return Combination(
            tp=self.tp_mode if self.tp_size > 1 else "none",
            sp=self.sequence_parallel or "none",
            pp=self.schedule if self.pp_size > 1 else "none",
            sharding=f"zero{self.zero_stage}",
            precision=self.precision if self.precision in PRECISIONS else "fp32",
            checkpointing=self.activation_checkpointing,
            lazy=self.lazy is not None,
        )

    def _check_combination(self) -> None:
        MeshConfig(tp=self.tp_size, tp_mode=self.tp_mode, tp_depth=self.tp_depth).check_tp()  # type: ignore[arg-type]
        if long_sequence(self.sequence_parallel) is None and self.sp_size != 1:
            raise ConfigError(
                f"sp_size={self.sp_size} needs sequence_parallel='ring' or 'ulysses' (Megatron "
                "sequence parallelism uses the tp ranks); set sp_size=1"
            )
        if self.pp_size == 1 and self.microbatches != 1:
            raise ConfigError("microbatches > 1 needs pp_size > 1 (pipeline micro-batches)")
        check_combination(self.combination(), what=f"HybridParallelPlugin({self._settings()})")

    def _settings(self) -> str:
        names = ("tp_size", "tp_mode", "sequence_parallel", "pp_size", "schedule", "zero_stage")
        names += ("precision", "activation_checkpointing")
        d = HybridParallelPlugin.__dataclass_fields__
        return ", ".join(
            f"{n}={getattr(self, n)!r}" for n in names if getattr(self, n) != d[n].default
        )

    def _zero_config(self) -> ZeroConfig:
        return ZeroConfig(
            stage=self.zero_stage, precision=self.precision, bucket_numel=self.bucket_numel
        )

    @property
    def sp(self) -> int:
        return self.sp_size if long_sequence(self.sequence_parallel) else 1

    def mesh_config(self, world_size: int) -> MeshConfig:
        """The mesh for ``world_size`` ranks; ``ConfigError`` when tp*pp*sp does not divide it."""
        block = self.tp_size * self.pp_size * self.sp
        if world_size % block:
            raise ConfigError(
                f"tp*pp*sp = {self.tp_size}*{self.pp_size}*{self.sp} = {block} does not divide the "
                f"world size {world_size}; launch a multiple of {block} ranks or change the sizes"
            )
        cfg = MeshConfig(
            dp=world_size // block,
            pp=self.pp_size,
            tp=self.tp_size,
            tp_mode=self.tp_mode,  # type: ignore[arg-type]
            tp_depth=self.tp_depth,
            sp=self.sp,
        )
        cfg.validate(world_size)
        return cfg

    def data_rank(self) -> tuple[int, int]:
        """``(coordinate, size)`` of this rank along ``dp``: which slice of the batch it gets."""
        if self.mesh is None:
            raise ConfigError("data_rank() is known after Booster.boost")
        return self.mesh.coord("dp"), self.mesh.size("dp")

    def describe(self) -> str:
        """The mesh as one line, e.g. ``dp2 x tp2(1d) x pp2(1f1b, m=4)``."""
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        cfg = self.mesh_config(world)
        parts = [f"dp{cfg.dp}"]
        if cfg.tp > 1:
            megatron = ", megatron sp" if megatron_sequence(self.sequence_parallel) else ""
            parts.append(f"tp{cfg.tp}({cfg.tp_mode}{megatron})")
        if cfg.pp > 1:
            parts.append(f"pp{cfg.pp}({self.schedule}, m={self.microbatches})")
        if self.sp > 1:
            parts.append(f"sp{self.sp}({long_sequence(self.sequence_parallel)})")
        return " x ".join(parts) + (f", zero{self.zero_stage}" if self.zero_stage else "")

    # --- Plugin protocol -------------------------------------------------------------------

    def configure(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Shard ``model`` in place through its plan and rebuild ``optimizer`` (Adam/AdamW) on
        this rank's parameters, each in the group of its unsharded original (``GroupMap``). A
        ``peft`` model of a Hugging Face GPT-2 or Llama in ``HFCausalLM`` trains as our GPT or
        PaLM, its adapters under their own names ([Note: Hugging Face LoRA under tp])."""
        group_map = GroupMap(model, optimizer)  # by name: the sharded model keeps the groups
        what = f"HybridParallelPlugin({self._settings()})"
        model, self._names, lora = prepare_lora(
            model, self.combination(), what=what, lazy=self.lazy
        )
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        cfg = self.mesh_config(world)  # one process: every size must be 1 (dp1)
        layers = getattr(getattr(model, "config", None), "num_layers", None)
        if layers is None:
            raise ConfigError(f"the hybrid plugin knows GPT and PaLM, got {type(model).__name__}")
        if cfg.pp * self.num_virtual > layers:
            raise ConfigError(
                f"pp={cfg.pp} x {self.num_virtual} chunk(s) = {cfg.pp * self.num_virtual} stages "
                f"for a model of {layers} blocks; use at most {layers} stages"
            )
        if self.pp_size > 1:
            PipelineSchedule(self.schedule, self.microbatches, self.num_virtual).validate(cfg.pp)  # type: ignore[arg-type]
        if self.zero_stage:  # ZeRO's Adam: no amsgrad or maximize (before any group)
            adam_arguments(optimizer, who=f"the hybrid plugin's ZeRO-{self.zero_stage}")
        elif not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
            raise ConfigError(
                f"the hybrid plugin trains with Adam or AdamW, got {type(optimizer).__name__}"
            )
        self._own_group = init_single_process()  # one process without torchrun: a 1-rank world
        self.mesh = mesh = ProcessMesh(cfg)
        tp_layout = None
        if cfg.tp > 1 and lora:  # adapters sharded beside their base: [Note: LoRA under tp]
            tp_layout = parallelize_lora(model, mesh)
        elif cfg.tp > 1:
            with sharding_lazily(self.lazy):  # a meta model's slices: recorded ([Note: lazy fill])
                parallelize(
                    model, mesh, sequence_parallel=megatron_sequence(self.sequence_parallel)
                )
        if self.sp > 1:
            apply_sequence_parallel(model, mesh, long_sequence(self.sequence_parallel))  # type: ignore[arg-type]
        if self.activation_checkpointing:
            apply_activation_checkpointing(model)
        if cfg.tp > 1 and not lora:
            tp_layout = describe_sharding(model, mesh)
        out: nn.Module = model
        names: dict[str, str] = {n: n for n, _ in model.named_parameters()}
        tied: set[int] = set()
        if cfg.pp > 1:
            self._stages = split_into_stages(model, mesh, num_virtual=self.num_virtual)
            out = PipelineModule(self._stages.chunks)
            names = {}
            for i, chunk in enumerate(self._stages.chunks):
                for n, _ in chunk.named_parameters():
                    names[f"chunks.{i}.{n}"] = n
        if self.lazy is not None:  # this rank's stages and slices only
            fill_lazy(out, self.lazy, self.device)
        swap = move_model(out, self.device)  # this rank's shards only, before ZeRO's buffers
        if self._stages is not None:
            self._stages.tied = [swap.get(id(q), q) for q in self._stages.tied]
            tied = {id(p) for p in self._stages.tied}
        self.sharding = mesh_layout(out, names, tp_layout, tied, mesh, self.pp_size)
        keep = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")
        hyper = {k: v for k, v in optimizer.defaults.items() if k in keep}
        user = self._names or {}
        named_out = [(user.get(names[n], names[n]), p) for n, p in out.named_parameters()]
        groups = group_map.groups(named_out, keep=("lr", "betas", "eps", "weight_decay"))
        params = [p for g in groups for p in g["params"]]
        # the user's optimizer on this rank's (sharded) parameters, same class and settings;
        # ZeRO converts it as it converts any Adam (amsgrad/maximize refused)
        opt: torch.optim.Optimizer
        if self.zero_stage:
            nonempty = type(optimizer)([g for g in groups if g["params"]], **hyper)
            opt = LowLevelZeroOptimizer.from_torch(
                out,
                nonempty,
                config=self._zero_config(),
                group=mesh.group("dp_sp" if self.sp > 1 else "dp"),  # [Note: hybrid gradients]
                max_grad_norm=self.max_grad_norm,
                sharding=self.sharding,
            )
        else:
            opt = type(optimizer)(groups, **hyper)
            named = [(n, p) for n, p in out.named_parameters() if p.requires_grad]
            opt.register_step_pre_hook(
                lambda *_: reduce_and_clip(
                    named, mesh, sp=self.sp, max_grad_norm=self.max_grad_norm, layout=self.sharding
                )
            )
        self._optimizer = opt
        # activations between stages have the compute dtype (after ZeRO's cast to its precision)
        self._boundary_dtype = params[0].dtype if params else torch.float32
        return out, opt

    def backward(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        if self.pp_size > 1:
            raise ConfigError("with pp_size > 1 use booster.execute_pipeline(...) for a step")
        if isinstance(optimizer, LowLevelZeroOptimizer):
            # ZeRO averages over dp x sp; the sp ranks' gradients must be summed: times sp
            optimizer.backward(loss * self.sp if self.sp > 1 else loss)
        else:
            loss.backward()

    def execute_pipeline(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> torch.Tensor:
        """Forward and backward of one batch through the schedule; the batch's mean loss (on
        every rank). Then ``optimizer.step()`` as usual."""
        inputs, targets = to_device((inputs, targets), self.device)
        if self.pp_size == 1:
            loss = model(inputs, targets)
            self.backward(loss, optimizer)
            return loss.detach()
        assert self.mesh is not None and self._stages is not None
        sched = PipelineSchedule(self.schedule, self.microbatches, self.num_virtual)  # type: ignore[arg-type]
        return pipeline_step(
            self._stages,
            self.mesh,
            inputs,
            targets,
            optimizer,
            schedule=sched,
            boundary_dtype=self._boundary_dtype,
            device=self.device,
            sp=self.sp,
            zero_stage=self.zero_stage,
        )

    def evaluate_pipeline(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The batch's mean loss through the pipeline, forward only; the same on every rank of
        the pipeline (``pipeline_loss``)."""
        if self._stages is None or self.mesh is None:
            raise ConfigError("evaluate_pipeline needs a model boosted with pp_size > 1")
        return pipeline_loss(
            self._stages,
            self.mesh,
            inputs,
            targets,
            microbatches=self.microbatches,
            boundary_dtype=self._boundary_dtype,
            device=self.device,
        )

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def close(self, *, collective: bool = True) -> None:
        """Destroy the mesh's process groups (with ``collective``: every rank calls it); the
        plugin keeps no threads, and cannot train after it."""
        if collective and self.mesh is not None:
            self.mesh.close()
            self.mesh = None
        if self._own_group:
            dist.destroy_process_group()
            self._own_group = False

    def memory_stats(self) -> dict[str, Any]:
        """The mesh and the bytes counted per axis since construction."""
        if self.mesh is None:
            return {}
        out: dict[str, Any] = {"mesh": self.describe(), **axis_comm_bytes(self.mesh)}
        if isinstance(self._optimizer, LowLevelZeroOptimizer):  # ZeRO counts its own dp bytes
            out["comm_dp_bytes_total"] = sum(self._optimizer.comm_bytes.values())
        return out

    def save_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        """Every rank writes the blocks it alone holds, in the unsharded model's names and
        shapes ([Note: layout checkpoint]): any layout, or one process, loads it. Collective."""
        save_layout(
            model, optimizer, self.mesh, Path(path), layout=self.describe(),
            frozen_values=self.save_frozen, rename=self._names,
        )  # fmt: skip

    def load_checkpoint(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, path: Path
    ) -> None:
        """Read the blocks this layout holds from a checkpoint of any layout."""
        load_layout(model, optimizer, self.mesh, Path(path), rename=self._names)
