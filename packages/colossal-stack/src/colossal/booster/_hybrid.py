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

from collections.abc import Callable
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
    parallelize,
    split_into_stages,
)
from colossal_models.sharding import describe_sharding, original_names
from colossal_parallel import MeshConfig, ProcessMesh
from colossal_parallel.pipeline import PipelineSchedule, ScheduleKind
from colossal_zero import LazyInit, LowLevelZeroOptimizer, Precision, ZeroConfig

from .._capability import (
    Combination,
    check_combination,
    long_sequence,
    megatron_sequence,
    table_precision,
)
from .._dist import init_single_process
from ..checkpoint._layout import save_layout
from ..checkpoint._layout_load import load_layout
from ..lora._tp import parallelize_lora
from ._device import move_model, resolve_device, to_device
from ._groups import GroupMap
from ._hybrid_checks import (
    check_model_and_optimizer,
    check_settings,
    check_sizes,
    describe_mesh,
    mesh_config,
    settings,
)
from ._hybrid_grads import mesh_layout, rank_optimizer
from ._hybrid_lora import prepare_lora
from ._hybrid_pipeline import PipelineModule, pipeline_loss, pipeline_step
from ._lazy_fill import fill_lazy, sharding_lazily
from ._mesh_fields import MeshFields
from ._mesh_stats import axis_comm_bytes
from ._plugin import Plugin, _item

__all__ = ["HybridParallelPlugin", "PipelineModule"]


@dataclass(kw_only=True)  # by name: a positional tp_size (the old first field) fails loudly
class HybridParallelPlugin(MeshFields, Plugin):
    """Tensor (1d/2d/2.5d/3d), pipeline, sequence and data parallelism, ZeRO-1/2 over ``dp``.

    Every rank of one data-parallel coordinate (``data_rank``) must be given the same batch.
    Invariant: ``backward`` + ``step`` (or ``execute_pipeline`` + ``step``) equals AdamW on the
    global batch of the unsharded model, within tensor parallelism's rounding. Settings are
    checked before any process group is created.

    Attributes:
        tp_size, tp_mode, tp_depth, sequence_parallel, sp_size: tensor and sequence
            parallelism, as ``MeshFields`` says (every kind of ``sequence_parallel``). Every
            setting is keyword-only.
        pp_size: pipeline stages; ``microbatches`` per batch, run by ``schedule`` ("1f1b",
            "interleaved", "gpipe") with ``num_virtual`` model chunks per rank (0: 2 for the
            interleaved schedule, else 1).
        zero_stage: 0 (the user's optimizer, [Note: hybrid gradients]), 1 or 2 (ZeRO over
            ``dp``, in flat buckets of ``bucket_numel`` elements).
        precision: "fp32", "bf16", "fp16" (fp32 masters; fp16 with loss scaling) or "fp64".
        activation_checkpointing: recompute every block in backward.
        max_grad_norm: clip the norm over the whole mesh (0: no clipping).
        name: the plugin's label; ``sharded_checkpoint``: every rank writes its blocks.
        save_frozen: write frozen parameters' values into checkpoints ([Note: LoRA layout
            checkpoint]: ``colossal train`` clears it for LoRA runs).
        device: where this rank's shards live ([Note: plugin device]); "auto": its CUDA
            device, else the CPU.
        lazy: the ``colossal.lazy_init()`` context the model was built in ([Note: lazy fill]).
        mesh, sharding: the process mesh and the parameters' tensor-parallel layout, set by
            ``Booster.boost``.
    """

    pp_size: int = 1
    microbatches: int = 1
    schedule: ScheduleKind = "1f1b"
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
        check_settings(self)
        if self.num_virtual == 0:
            self.num_virtual = 2 if self.schedule == "interleaved" else 1
        if self.zero_stage:
            self._zero_config()  # validates precision and bucket size
        spec = Precision.parse(self.precision)  # ConfigError naming the choices
        check_sizes(self)
        check_combination(self.combination(), what=f"HybridParallelPlugin({settings(self)})")
        self.device = resolve_device(self.device)
        spec.check_device(self.device)  # fp64 needs float64

    def combination(self) -> Combination:
        """The kinds these settings compose ([Note: capability table])."""
        return Combination(
            tp=self.tp_mode if self.tp_size > 1 else "none",
            sp=self.sequence_parallel or "none",
            pp=self.schedule if self.pp_size > 1 else "none",
            sharding=f"zero{self.zero_stage}",
            precision=table_precision(self.precision),
            checkpointing=self.activation_checkpointing,
            lazy=self.lazy is not None,
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
        return mesh_config(self, world_size)

    def data_rank(self) -> tuple[int, int]:
        """``(coordinate, size)`` of this rank along ``dp``: which slice of the batch it gets."""
        if self.mesh is None:
            raise ConfigError("data_rank() is known after Booster.boost")
        return self.mesh.coord("dp"), self.mesh.size("dp")

    def describe(self) -> str:
        """The mesh as one line, e.g. ``dp2 x tp2(1d) x pp2(1f1b, m=4)``."""
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        return describe_mesh(
            self.mesh_config(world),
            self.sequence_parallel,
            self.schedule,
            self.microbatches,
            self.zero_stage,
        )

    def label(self) -> str:
        return f"{self.name} ({self.describe()})" if self.mesh is not None else self.name

    @property
    def num_stages(self) -> int:
        return self.pp_size * self.num_virtual

    def check_world(self, world_size: int) -> None:
        """tp * pp * sp must divide ``world_size`` (``mesh_config``)."""
        self.mesh_config(world_size)

    # --- Plugin protocol -------------------------------------------------------------------

    def configure(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Shard ``model`` in place through its plan and rebuild ``optimizer`` (Adam/AdamW) on
        this rank's parameters, each in the group of its unsharded original (``GroupMap``). A
        ``peft`` model of a Hugging Face GPT-2 or Llama in ``HFCausalLM`` trains as our GPT or
        PaLM, its adapters under their own names ([Note: Hugging Face LoRA under tp])."""
        group_map = GroupMap(model, optimizer)  # by name: the sharded model keeps the groups
        what = f"HybridParallelPlugin({settings(self)})"
        model, self._names, lora = prepare_lora(
            model, self.combination(), what=what, lazy=self.lazy
        )
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        cfg = self.mesh_config(world)  # one process: every size must be 1 (dp1)
        check_model_and_optimizer(
            model,
            optimizer,
            cfg,
            (self.schedule, self.microbatches, self.num_virtual),
            zero_stage=self.zero_stage,
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
        long = long_sequence(self.sequence_parallel)
        if long is not None and self.sp > 1:
            apply_sequence_parallel(model, mesh, long)
        if self.activation_checkpointing:
            apply_activation_checkpointing(model)
        if cfg.tp > 1 and not lora:
            tp_layout = describe_sharding(model, mesh)
        out: nn.Module = model
        names: dict[str, str] = {n: n for n, _ in model.named_parameters()}
        before = original_names(model)  # the names the optimizer's groups know
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
        if self.precision == "fp64":  # float64 throughout ([Note: fp64 precision]): exact cast
            out.to(torch.float64)  # in place: the parameter objects stay (tied ones too)
        if self._stages is not None:
            self._stages.tied = [swap.get(id(q), q) for q in self._stages.tied]
            tied = {id(p) for p in self._stages.tied}
        self.sharding = mesh_layout(out, names, tp_layout, tied, mesh, self.pp_size)
        opt, params = rank_optimizer(
            out,
            optimizer,
            group_map,
            {
                n: (self._names or {}).get(o := before.get(names[n], names[n]), o)
                for n, _ in out.named_parameters()
            },
            mesh,
            zero=self._zero_config() if self.zero_stage else None,
            sp=self.sp,
            max_grad_norm=self.max_grad_norm,
            sharding=self.sharding,
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
        sched = PipelineSchedule(self.schedule, self.microbatches, self.num_virtual)
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

    def train_step(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        microbatches: int = 1,
        on_loss: Callable[[torch.Tensor], float] | None = None,
    ) -> float:
        """A pipelined model: the whole batch through ``execute_pipeline`` (``microbatches``
        are the schedule's, set at construction), one loss reported; else the default."""
        if isinstance(model, PipelineModule):
            loss = self.execute_pipeline(inputs, targets, model, optimizer)
            return (on_loss or _item)(loss)
        return super().train_step(
            inputs, targets, model, optimizer, microbatches=microbatches, on_loss=on_loss
        )

    def evaluate(
        self, inputs: torch.Tensor, targets: torch.Tensor, model: nn.Module
    ) -> torch.Tensor:
        """A pipelined model through ``evaluate_pipeline``; else the default."""
        if isinstance(model, PipelineModule):
            return self.evaluate_pipeline(inputs, targets)
        return super().evaluate(inputs, targets, model)

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

    def choose_checkpoint_contents(self, *, export_full_model: bool, save_frozen: bool) -> None:
        """``save_frozen`` as given; the layout checkpoint is readable as a full model already."""
        self.save_frozen = save_frozen

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
