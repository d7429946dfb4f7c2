"""The training loop behind ``colossal train``."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from rich.console import Console
from torch import nn

from colossal_contracts import ColossalError, ConfigError
from colossal_memtrace import estimate_step
from colossal_models import ByteTokenizer, load_corpus
from colossal_parallel import ProcessMesh

from .._dist import init_from_env, rank_and_world
from .._peers import watch_peers
from ..booster import (
    Booster,
    DDPPlugin,
    GeminiPlugin,
    HybridParallelPlugin,
    LowLevelZeroPlugin,
    PipelineModule,
    Plugin,
)
from ._config import TrainConfig
from ._display import (
    TrainDisplay,
    comm_summary,
    memory_summary,
    plot_memory_timeline,
    summary_table,
)
from ._guard import FiniteGuard
from ._mesh import PLUGINS, check_mesh, hybrid_plugin, mesh_flags, state_shards
from ._models import ModelSpec, resolve_model
from ._outdir import METRICS, check_out, trim_metrics
from ._preflight import check_fits
from ._schedule import warmup_cosine

__all__ = ["TrainResult", "build_plugin", "train"]


@dataclass(frozen=True)
class TrainResult:
    """What a run achieved. Losses are averaged over ranks."""

    losses: list[float]
    val_loss: float
    tokens_per_s: float
    num_params: int
    checkpoint: Path | None
    out: Path


def build_plugin(name: str, cfg: TrainConfig | None = None) -> Plugin:
    """The plugin called ``name`` set up from ``cfg`` (Gemini's placement, budget and
    precision; the hybrid plugin's mesh); ``ConfigError`` naming the choices when unknown.
    Constructing one creates no process group: its own checks of the settings run here."""
    if name == "ddp":
        return DDPPlugin()
    if name == "hybrid":
        return hybrid_plugin(cfg or TrainConfig(plugin="hybrid"))
    if name == "gemini":
        cfg = cfg or TrainConfig()
        return _gemini_plugin(cfg)
    if name == "zero":
        cfg = cfg or TrainConfig(plugin="zero")
        return LowLevelZeroPlugin(
            stage=cfg.zero_stage, precision=cfg.precision, max_grad_norm=cfg.max_grad_norm
        )
    raise ConfigError(f"unknown --plugin {name!r}; choose one of: {', '.join(PLUGINS)}")


def _gemini_plugin(cfg: TrainConfig) -> Plugin:
    """Gemini, with tensor parallelism inside its chunks for ``--tp N`` (ZeRO-3 with TP)."""
    return GeminiPlugin(
        placement=cfg.placement,
        accelerator_budget=cfg.accelerator_budget,
        precision=cfg.precision,
        max_grad_norm=cfg.max_grad_norm,
        host_budget=cfg.host_budget,
        disk_budget=cfg.disk_budget,
        disk_dir=cfg.disk_dir,
        tp_size=cfg.tp,
        tp_mode=cfg.tp_mode,
        tp_depth=cfg.tp_depth,
        sequence_parallel=cfg.sp if cfg.sp in ("ring", "ulysses") else None,
        sp_size=cfg.sp_size if cfg.sp in ("ring", "ulysses") else 1,
    )


def _choose_export(plugin: Plugin, cfg: TrainConfig, step: int) -> None:
    """Before saving after ``step``: whether the plugins with a sharded state write the
    consolidated model into this checkpoint too (``--export``)."""
    if isinstance(plugin, GeminiPlugin | LowLevelZeroPlugin):
        plugin.export_full_model = cfg.exports_at(step)


def _mesh_of(plugin: Plugin, cfg: TrainConfig) -> ProcessMesh | None:
    """The plugin's process mesh once boosted (hybrid; Gemini with ``--tp`` or ``--sp``); None
    without one."""
    if isinstance(plugin, HybridParallelPlugin | GeminiPlugin):
        return plugin.mesh
    return None


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    other = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


def _mean_over_ranks(value: float, group: Any = None) -> float:
    """Mean of ``value`` over ``group`` (None: every rank). Over the data-parallel group each
    replica counts once, whatever its tensor, pipeline and sequence ranks."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    nccl = dist.get_backend(group) == "nccl"  # NCCL reduces CUDA tensors only
    t = torch.tensor([value], dtype=torch.float64, device="cuda" if nccl else "cpu")
    dist.all_reduce(t, group=group)
    return float(t.item()) / dist.get_world_size(group)


def _evaluate(
    booster: Booster,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    group: Any,
) -> float:
    """Mean loss of ``batches`` (the same on every rank). A pipelined model has no forward-only
    schedule: its batches run through the pipeline (forward and backward), and the gradients
    are dropped without a step."""
    model.eval()
    losses = []
    for x, y in batches:
        x, y = booster.to_device((x, y))
        if isinstance(model, PipelineModule):
            losses.append(booster.execute_pipeline(x, y, model, optimizer).item())
            optimizer.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                losses.append(model(x, y).item())
    model.train()
    return _mean_over_ranks(sum(losses) / len(losses), group)


def train(cfg: TrainConfig, *, console: Console | None = None) -> TrainResult:
    """Train ``cfg.model`` on the corpus; write ``metrics.jsonl`` and a checkpoint under ``cfg.out``.

    In a multi-rank run a rank that dies makes the others raise ``RankFailedError`` naming it
    (see [Note: peer heartbeats]); nan/inf stops the run with ``NonFiniteError`` before saving.
    """
    init_from_env()
    with watch_peers() as watch:
        try:
            return _train(cfg, console or Console(stderr=True))
        except RuntimeError as err:
            failed = None if isinstance(err, ColossalError) else watch.explain(err)
            if failed is None:
                raise
            raise failed from err


def _train(cfg: TrainConfig, console: Console) -> TrainResult:
    rank, world = rank_and_world()
    main = rank == 0

    resume_from = check_out(cfg.out, resume=cfg.resume)  # before any work; changes nothing
    spec = resolve_model(
        cfg.model, cfg.preset, vocab_size=ByteTokenizer.vocab_size, parallel=bool(mesh_flags(cfg))
    )
    if cfg.seq_len > spec.max_seq_len:
        raise ConfigError(
            f"--seq-len {cfg.seq_len} exceeds {spec.label}'s context of "
            f"{spec.max_seq_len}; use a smaller --seq-len"
        )
    plugin = build_plugin(cfg.plugin, cfg)  # its checks of the settings: before any group
    check_mesh(cfg, spec, plugin, world)
    check_fits(
        build=spec.build,
        num_params=spec.num_params,
        label=spec.label,
        presets=spec.presets,
        batch_size=cfg.batch_size,
        seq_len=cfg.seq_len,
        sharded=cfg.plugin in ("gemini", "hybrid"),
        world=state_shards(cfg, world),
    )
    corpus = load_corpus(cfg.corpus)
    train_data, val_data = corpus.split()
    if min(len(train_data), len(val_data)) <= cfg.seq_len + 1:
        raise ConfigError(
            f"corpus {corpus.source} has {len(corpus.data):,} bytes, too few for --seq-len "
            f"{cfg.seq_len} (5% of it is held out for validation); give more text or a shorter "
            "--seq-len"
        )
    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    model = spec.build()
    # plugins that shard the model rebuild one parameter group: decay applies to every parameter
    one_group = cfg.plugin == "hybrid" or cfg.tp > 1  # Gemini with --sp keeps the groups
    params = model.parameters() if one_group else _param_groups(model, cfg.weight_decay)
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )
    if isinstance(plugin, GeminiPlugin) and cfg.accelerator_budget is not None:
        plugin.non_model_bytes = _activation_bytes(spec, cfg)
    booster = Booster(plugin)
    model, optimizer = booster.boost(model, optimizer)
    # [Note: mesh data]: one batch per data-parallel coordinate, losses averaged over dp
    mesh = _mesh_of(plugin, cfg)
    data_rank, dp = (mesh.coord("dp"), mesh.size("dp")) if mesh else (rank, world)
    dp_group = mesh.group("dp") if mesh else None

    out = cfg.out
    ckpt_root = out / "checkpoint"
    start = 0
    if resume_from is not None:
        info = booster.load(model, optimizer, resume_from)
        start = info["step"]
        if start > cfg.steps:
            raise ConfigError(
                f"--resume: the checkpoint {info['path']} is at step {start}, past --steps "
                f"{cfg.steps}; pass --steps above {start} to train on (the schedule follows "
                "--steps), or a fresh --out to start over"
            )
        if main:
            console.print(f"resumed from {info['path']} at step {start}")
        if start == cfg.steps:
            if main:
                console.print(f"nothing to do: the run in {out} already reached step {start}")
            if mesh is not None:
                plugin.close()  # type: ignore[attr-defined]
            return TrainResult([], float("nan"), 0.0, spec.num_params, info["path"], out)
    data_gen = torch.Generator()
    extra = {
        "train_config": {k: str(v) for k, v in asdict(cfg).items()},
        "model_config": spec.config,
    }
    if main:
        out.mkdir(parents=True, exist_ok=True)
        console.print(
            f"[bold]colossal train[/]: {spec.label} ({spec.num_params:,} params), "
            f"{world} rank(s), plugin {_plugin_label(cfg, plugin, mesh)}, corpus {corpus.source} "
            f"({len(corpus.data):,} bytes, {corpus.num_files} files)"
        )
    if main and cfg.resume:
        trim_metrics(out, start)
    metrics = None  # opened with the first record: a run failing in step 1 leaves no trace
    guard = FiniteGuard(precision=cfg.precision, lr=cfg.lr)
    proc = psutil.Process()
    losses: list[float] = []
    tokens_per_step = cfg.batch_size * cfg.seq_len * dp  # the global batch, counted once
    checkpoint: Path | None = None
    records: list[dict[str, Any]] = []
    run_start = time.perf_counter()
    with TrainDisplay(cfg.steps - start, enabled=main, console=console) as display:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * warmup_cosine(step, cfg.steps)
            data_gen.manual_seed(_data_seed(cfg.seed, data_rank, step))  # resumable
            x, y = corpus.batch(train_data, cfg.batch_size, cfg.seq_len, data_gen)
            x, y = booster.to_device((x, y))  # [Note: plugin device]
            if isinstance(model, PipelineModule):  # forward and backward through the schedule
                loss_value = _mean_over_ranks(
                    booster.execute_pipeline(x, y, model, optimizer).item(), dp_group
                )
                guard.check_loss(step + 1, loss_value)
            else:
                loss = model(x, y)
                loss_value = _mean_over_ranks(loss.item(), dp_group)
                guard.check_loss(step + 1, loss_value)
                booster.backward(loss, optimizer)
            guard.check_grads(step + 1, model, optimizer)
            optimizer.step()
            guard.after_step(step + 1, optimizer)
            optimizer.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            losses.append(loss_value)
            record = {
                "step": step + 1,
                "loss": loss_value,
                "tokens_per_s": tokens_per_step / dt,
                "lr": optimizer.param_groups[0]["lr"],
                "step_time_s": dt,
                "host_rss_bytes": proc.memory_info().rss,
                **booster.memory_stats(),
            }
            records.append(record)
            if main:
                if metrics is None:
                    metrics = (out / METRICS).open("a" if cfg.resume else "w")
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                display.update(
                    record, advance=cfg.log_every if (step + 1) % cfg.log_every == 0 else 1
                )
            if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
                _choose_export(plugin, cfg, step + 1)
                checkpoint = booster.save(model, optimizer, ckpt_root, step=step + 1, extra=extra)
    elapsed = time.perf_counter() - run_start
    if metrics is not None:
        metrics.close()
    if not cfg.checkpoint_every or cfg.steps % cfg.checkpoint_every:
        _choose_export(plugin, cfg, cfg.steps)
        checkpoint = booster.save(model, optimizer, ckpt_root, step=cfg.steps, extra=extra)
    gen = torch.Generator().manual_seed(cfg.seed + 10_000)
    held_out = [corpus.batch(val_data, cfg.batch_size, cfg.seq_len, gen) for _ in range(4)]
    val = _evaluate(booster, model, optimizer, held_out, dp_group)
    result = TrainResult(
        losses=losses,
        val_loss=val,
        tokens_per_s=tokens_per_step * len(losses) / elapsed if losses else 0.0,
        num_params=spec.num_params,
        checkpoint=checkpoint,
        out=out,
    )
    if main:
        summary = {
            **_summary(result, cfg, spec.label, (world, dp), proc),
            **memory_summary(records),
            **comm_summary(records),
        }
        if records and "bytes_moved" in records[-1]:
            summary["memory timeline"] = str(plot_memory_timeline(records, out))
        console.print(summary_table(summary))
    if mesh is not None:
        plugin.close()  # type: ignore[attr-defined]  # the mesh's process groups (collective)
    return result


def _activation_bytes(spec: ModelSpec, cfg: TrainConfig) -> int:
    """Peak non-model (activation) bytes of one step on the accelerator, from memtrace's static
    estimate on the meta device: what Gemini keeps free of chunks under ``--accelerator-budget``."""
    shape = (cfg.batch_size, cfg.seq_len)
    stats = estimate_step(
        spec.build,
        lambda dev: (torch.zeros(shape, dtype=torch.long, device=dev),) * 2,
        target="cuda" if torch.cuda.is_available() else "cpu",
    )
    return stats.peak_non_model("accelerator")


def _plugin_label(cfg: TrainConfig, plugin: Plugin, mesh: ProcessMesh | None) -> str:
    if mesh is not None:
        return f"{cfg.plugin} ({plugin.describe()})"  # type: ignore[attr-defined]
    if not isinstance(plugin, GeminiPlugin):
        return str(cfg.plugin)
    budget = cfg.accelerator_budget or "whole accelerator"
    label = f"gemini ({cfg.placement}, {cfg.precision}, budget {budget}"
    if plugin.non_model_bytes:
        label += f", {int(plugin.non_model_bytes) / 2**20:,.1f} MiB kept for activations"
    return label + ")"


def _data_seed(seed: int, rank: int, step: int) -> int:
    """Distinct for every (seed, rank, step) with rank < 2**16 and step < 2**24."""
    return (seed << 40) + (rank << 24) + step


def _summary(
    result: TrainResult,
    cfg: TrainConfig,
    label: str,
    ranks: tuple[int, int],
    proc: psutil.Process,
) -> dict:
    first, last = (result.losses[0], result.losses[-1]) if result.losses else (float("nan"),) * 2
    (world, dp), shape = ranks, f"{cfg.batch_size} x {cfg.seq_len}"
    global_batch = {} if dp == world else {"global batch (dp x batch x seq)": f"{dp} x {shape}"}
    return {
        "model": f"{label} ({result.num_params:,} params)",
        "ranks x batch x seq": f"{world} x {shape}",
        **global_batch,
        "steps run": len(result.losses),
        "first loss": first,
        "last loss": last,
        "validation loss": result.val_loss,
        "tokens/s": result.tokens_per_s,
        "host RSS": f"{proc.memory_info().rss / 2**20:,.0f} MiB",
        "checkpoint": str(result.checkpoint) if result.checkpoint else "-",
        "metrics": str(cfg.out / "metrics.jsonl"),
    }
