"""The training loop behind ``colossal train``: set up (``_setup``), resume, the steps, the
final save, export and summary, each a function of its own."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch.distributed as dist
from rich.console import Console

from colossal_contracts import ColossalError, ConfigError
from colossal_models.data import TextTokenizer

from .._dist import init_from_env, rank_and_world
from .._lifeline import stop_on_signals
from .._peers import PeerWatch, watch_peers
from ..export import export_after_training
from ._config import TrainConfig
from ._data import describe_data, resolve_tokenizer
from ._display import (
    TrainDisplay,
    comm_summary,
    memory_summary,
    plot_memory_timeline,
    summary_table,
)
from ._guard import FiniteGuard
from ._outdir import METRICS, Claim, claim_out_on_rank0, trim_metrics
from ._plugin import _choose_export, build_plugin
from ._result import TrainResult, _summary
from ._resume import restore_position, save_with_state
from ._schedule import warmup_cosine
from ._setup import Run, set_up
from ._step import _checked_loss, _evaluate
from ._tensorboard import TensorBoardLog

__all__ = ["TrainResult", "build_plugin", "train"]


def train(cfg: TrainConfig, *, console: Console | None = None) -> TrainResult:
    """Train ``cfg.model`` on ``cfg.data``; write ``metrics.jsonl`` and a checkpoint under
    ``cfg.checkpoint.out``.

    In a multi-rank run a rank that dies makes the others raise ``RankFailedError`` naming it
    (see [Note: peer heartbeats]); nan/inf stops the run with ``NonFiniteError`` before saving.
    """
    ours = not (dist.is_available() and dist.is_initialized())
    init_from_env()
    rank, world = rank_and_world()
    with watch_peers() as watch, stop_on_signals(rank, world):
        try:
            claim = claim_out_on_rank0(
                cfg.checkpoint.out,
                cfg.checkpoint.resume,
                cfg.checkpoint.restart,
                rank=rank,
                world=world,
            )  # [Note: run lock]: held until the run ends
            try:
                result = _train(cfg, console or Console(stderr=True), claim, watch)
            finally:
                if claim.lock is not None:
                    claim.lock.release(undo_mkdir=True)  # a run that wrote nothing: no trace
        except RuntimeError as err:
            failed = None if isinstance(err, ColossalError) else watch.explain(err)
            if failed is None:
                raise
            raise failed from err
    if ours and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # after the Booster closed and the heartbeat stopped
    return result


def _train(cfg: TrainConfig, console: Console, claim: Claim, watch: PeerWatch) -> TrainResult:
    rank, world = rank_and_world()
    main = rank == 0
    if main and claim.moved_aside is not None:
        console.print(
            f"--restart: moved the old run in {cfg.checkpoint.out} to {claim.moved_aside}"
        )
    tokenizer = resolve_tokenizer(cfg)
    run = set_up(cfg, tokenizer, claim.resume_from, rank=rank, world=world)
    start = 0
    if claim.resume_from is not None:
        start, path = _resume(cfg, run, claim.resume_from, rank, console)
        if start == cfg.training.steps:
            if main:
                console.print(
                    f"nothing to do: the run in {cfg.checkpoint.out} already reached step {start}"
                )
            run.booster.close()  # [Note: clean exit]
            nan = float("nan")
            return TrainResult([], nan, 0.0, run.spec.num_params, path, cfg.checkpoint.out)
    extra = {
        "train_config": {k: str(v) for k, v in cfg.flags().items()},
        "model_config": run.spec.config,
        "tokenizer": tokenizer.spec,
        **({"lora": run.lora} if run.lora else {}),
    }
    if main:
        _announce(cfg, run, tokenizer, world, console)
    if main and cfg.checkpoint.resume:
        trim_metrics(cfg.checkpoint.out, start)
    steps = _run_steps(cfg, run, start, extra, watch, console, main)
    return _finish(cfg, run, steps, extra, watch, console, main=main, world=world)


def _resume(
    cfg: TrainConfig, run: Run, resume_from: Path, rank: int, console: Console
) -> tuple[int, Path]:
    """Load the checkpoint under ``resume_from`` and the data position; its step and path."""
    info = run.booster.load(run.model, run.optimizer, resume_from)
    start = info["step"]
    restore_position(run.loader, info, rank, console if rank == 0 else None)
    if start > cfg.training.steps:
        raise ConfigError(
            f"--resume: the checkpoint {info['path']} is at step {start}, past --steps "
            f"{cfg.training.steps}; pass --steps above {start} to train on (the schedule follows "
            "--steps), or a fresh --out to start over"
        )
    if rank == 0:
        console.print(f"resumed from {info['path']} at step {start}")
    return start, info["path"]


def _announce(
    cfg: TrainConfig, run: Run, tokenizer: TextTokenizer, world: int, console: Console
) -> None:
    """Rank 0's banner: model, ranks, plugin, data (and LoRA); creates ``out``."""
    cfg.checkpoint.out.mkdir(parents=True, exist_ok=True)
    spec, lora = run.spec, run.lora
    console.print(
        f"[bold]colossal train[/]: {spec.label} ({spec.num_params:,} params), "
        f"{world} rank(s), plugin {run.plugin.label()}, "
        f"{describe_data(run.shards, tokenizer)}"
    )
    if run.booster.matmul_note is not None:
        console.print(run.booster.matmul_note)
    if lora:
        console.print(
            f"LoRA r{lora['rank']} on {', '.join(lora['target_modules'])}: "
            f"{lora['trainable_params']:,} trainable parameters, the base frozen"
        )


@dataclass
class _Steps:
    """What the step loop leaves: losses, step records, the last checkpoint, the held-out
    batches, the seconds it ran and the tokens of one step (global)."""

    losses: list[float]
    records: list[dict[str, Any]]
    checkpoint: Path | None
    held_out: list[Any]
    elapsed: float
    tokens_per_step: int


def _run_steps(
    cfg: TrainConfig,
    run: Run,
    start: int,
    extra: dict[str, Any],
    watch: PeerWatch,
    console: Console,
    main: bool,
) -> _Steps:
    """Steps ``start + 1 .. steps``: one record each in metrics.jsonl, the periodic saves."""
    t, out, booster, optimizer = cfg.training, cfg.checkpoint.out, run.booster, run.optimizer
    metrics = None  # opened with the first record: a run failing in step 1 leaves no trace
    guard = FiniteGuard(precision=cfg.memory.precision, lr=t.lr)
    proc = psutil.Process()
    losses: list[float] = []
    tokens_per_step = cfg.data.batch_size * t.grad_accum * cfg.data.seq_len * run.dp  # global
    held_out = run.loader.val_batches(4)  # the same on resume: not drawn from the training order
    tensorboard = TensorBoardLog(out) if main and cfg.logging.log == "tensorboard" else None
    checkpoint: Path | None = None
    records: list[dict[str, Any]] = []
    every, log_every = cfg.checkpoint.every, cfg.logging.log_every
    run_start = time.perf_counter()
    with TrainDisplay(t.steps - start, enabled=main, console=console) as display:
        for step in range(start, t.steps):
            t0 = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = t.lr * warmup_cosine(step, t.steps)
            x, y = run.loader.next_batch()  # [Note: data order]; batch_size * grad_accum rows
            x, y = booster.to_device((x, y))  # [Note: plugin device]
            # grad_accum micro-batches (a pipeline's are in its schedule), each loss averaged
            # over dp and checked before its backward
            with booster.compute():  # [Note: cpu matmul] in colossal_zero
                loss_value = booster.train_step(
                    x,
                    y,
                    run.model,
                    optimizer,
                    microbatches=t.grad_accum,
                    on_loss=lambda loss, s=step + 1: _checked_loss(guard, s, loss, run.dp_group),
                )
            guard.check_grads(step + 1, run.model, optimizer)
            optimizer.step()
            guard.after_step(step + 1, optimizer)
            optimizer.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            watch.step_done(dt)  # [Note: watchdog]
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
            if cfg.parallel.layout is not None:
                record["layout"] = cfg.parallel.layout
            eval_every = cfg.logging.eval_every
            if eval_every and (step + 1) % eval_every == 0 and held_out:
                with booster.compute():
                    record["val_loss"] = _evaluate(booster, run.model, held_out, run.dp_group)
            records.append(record)
            if tensorboard is not None:
                tensorboard.add(record)
            if main:
                if metrics is None:
                    metrics = (out / METRICS).open("a" if cfg.checkpoint.resume else "w")
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
            if (step + 1) % log_every == 0 or step + 1 == t.steps:
                display.update(record, advance=log_every if (step + 1) % log_every == 0 else 1)
            if every and (step + 1) % every == 0:
                checkpoint = _save(cfg, run, step + 1, extra, watch)
    elapsed = time.perf_counter() - run_start
    watch.training_over()  # [Note: watchdog]: saves and the end are not watched for stalls
    if metrics is not None:
        metrics.close()
    if tensorboard is not None:
        tensorboard.close()
    return _Steps(losses, records, checkpoint, held_out, elapsed, tokens_per_step)


def _save(
    cfg: TrainConfig, run: Run, step: int, extra: dict[str, Any], watch: PeerWatch
) -> Path | None:
    """The checkpoint after ``step`` (with what ``--export`` puts into it), unwatched."""
    _choose_export(run.plugin, cfg, step)
    root = cfg.checkpoint.out / "checkpoint"
    with watch.paused():
        return save_with_state(run.booster, run.model, run.optimizer, root, step, extra, run.loader)


def _finish(
    cfg: TrainConfig,
    run: Run,
    done: _Steps,
    extra: dict[str, Any],
    watch: PeerWatch,
    console: Console,
    *,
    main: bool,
    world: int,
) -> TrainResult:
    """The final save (unless the last step saved), the validation loss, the export, rank 0's
    summary; then the Booster closes."""
    steps, every, out = cfg.training.steps, cfg.checkpoint.every, cfg.checkpoint.out
    checkpoint = done.checkpoint
    if cfg.checkpoint.save_final and (not every or steps % every):
        checkpoint = _save(cfg, run, steps, extra, watch)
    with watch.paused(), run.booster.compute():
        held_out = done.held_out
        val = (
            _evaluate(run.booster, run.model, held_out, run.dp_group) if held_out else float("nan")
        )
    hf_folder = (
        export_after_training(
            cfg.model.name, cfg.checkpoint.export, checkpoint, out, lora=run.lora is not None
        )
        if main
        else None
    )
    losses = done.losses
    result = TrainResult(
        losses=losses,
        val_loss=val,
        tokens_per_s=done.tokens_per_step * len(losses) / done.elapsed if losses else 0.0,
        num_params=run.spec.num_params,
        checkpoint=checkpoint,
        out=out,
    )
    if main:
        summary = {
            **_summary(result, cfg, run.spec.label, (world, run.dp), psutil.Process()),
            **memory_summary(done.records),
            **comm_summary(done.records),
        }
        if hf_folder is not None:
            summary["hugging face export" if hf_folder.name == "hf" else "export"] = str(hf_folder)
        if done.records and "bytes_moved" in done.records[-1]:
            summary["memory timeline"] = str(plot_memory_timeline(done.records, out))
        console.print(summary_table(summary))
    run.booster.close()  # every background thread joined, the plugin's groups destroyed
    return result
