"""The training loop behind ``colossal train``."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from rich.console import Console

from colossal_contracts import ColossalError, ConfigError

from .._dist import init_from_env, rank_and_world
from .._lifeline import stop_on_signals
from .._peers import PeerWatch, watch_peers
from ..booster import Booster, parse_bytes
from ..export import export_after_training
from ._config import TrainConfig
from ._data import describe_data, open_data, open_loader, resolve_tokenizer
from ._display import (
    TrainDisplay,
    comm_summary,
    memory_summary,
    plot_memory_timeline,
    summary_table,
)
from ._guard import FiniteGuard
from ._lora_flags import apply_job_lora
from ._mesh import check_mesh, mesh_flags, state_shards
from ._models import build_model, enable_activation_checkpointing, resolve_model
from ._outdir import METRICS, Claim, claim_out_on_rank0, trim_metrics
from ._plugin import _activation_bytes, _choose_export, build_plugin
from ._preflight import check_fits, check_tiers, gemini_host_bytes
from ._result import TrainResult, _summary
from ._resume import restore_position, save_with_state
from ._schedule import warmup_cosine
from ._step import _checked_loss, _evaluate, _param_groups
from ._tensorboard import TensorBoardLog

__all__ = ["TrainResult", "build_plugin", "train"]


def train(cfg: TrainConfig, *, console: Console | None = None) -> TrainResult:
    """Train ``cfg.model`` on the corpus; write ``metrics.jsonl`` and a checkpoint under ``cfg.out``.

    In a multi-rank run a rank that dies makes the others raise ``RankFailedError`` naming it
    (see [Note: peer heartbeats]); nan/inf stops the run with ``NonFiniteError`` before saving.
    """
    ours = not (dist.is_available() and dist.is_initialized())
    init_from_env()
    rank, world = rank_and_world()
    with watch_peers() as watch, stop_on_signals(rank, world):
        try:
            claim = claim_out_on_rank0(
                cfg.out, cfg.resume, cfg.restart, rank=rank, world=world
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
    resume_from = claim.resume_from
    if main and claim.moved_aside is not None:
        console.print(f"--restart: moved the old run in {cfg.out} to {claim.moved_aside}")
    tokenizer = resolve_tokenizer(cfg)
    spec = resolve_model(
        cfg.model,
        cfg.preset,
        vocab_size=tokenizer.vocab_size,
        # LoRA on hf: is wrapped as the HF model; the hybrid plugin converts it after the wrap
        parallel=bool(mesh_flags(cfg)) and not (cfg.lora_rank and cfg.model.startswith("hf:")),
        dropout=cfg.dropout,
    )
    if cfg.seq_len > spec.max_seq_len:
        raise ConfigError(
            f"--seq-len {cfg.seq_len} exceeds {spec.label}'s context of "
            f"{spec.max_seq_len}; use a smaller --seq-len"
        )
    plugin = build_plugin(cfg.plugin, cfg)  # its checks of the settings: before any group
    check_mesh(cfg, spec, plugin, world)
    held = None  # host bytes of the model states; None: check_fits' 16 per parameter
    if cfg.plugin == "gemini":  # [Note: tier room]: host, disk and accelerator budgets
        budgets = parse_bytes(cfg.disk_budget), parse_bytes(cfg.accelerator_budget)
        states = check_tiers(
            num_params=spec.num_params,
            label=spec.label,
            precision=cfg.precision,
            world=state_shards(cfg, world),
            host_budget=parse_bytes(cfg.host_budget),
            disk_budget=budgets[0],
            accelerator_budget=budgets[1],
        )
        held = gemini_host_bytes(states, disk_budget=budgets[0], accelerator_budget=budgets[1])
    check_fits(
        build=spec.build,
        num_params=spec.num_params,
        label=spec.label,
        presets=spec.presets,
        batch_size=cfg.batch_size,
        seq_len=cfg.seq_len,
        sharded=cfg.plugin in ("gemini", "hybrid"),
        world=state_shards(cfg, world),
        states=held,
    )
    shards = open_data(cfg, tokenizer, rank=rank)  # bad data: an error before any write
    open_loader(cfg, shards)  # data shorter than one sequence: an error here too
    torch.manual_seed(cfg.seed)  # same initial weights on every rank
    # LoRA fingerprints the base's values and wraps it eagerly (peft builds real adapters)
    model, lazy = build_model(spec, cfg.plugin, lazy=cfg.lora_rank is None)  # [Note: lazy job]
    if cfg.activation_checkpointing and cfg.plugin != "hybrid":  # the hybrid plugin's own
        enable_activation_checkpointing(model)
    model, lora = apply_job_lora(cfg, spec.label, model, resume_from)  # before any state
    optimizer = torch.optim.AdamW(  # every plugin keeps the groups (sharding ones by name)
        _param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(0.9, 0.95),
        weight_decay=cfg.weight_decay,
    )
    plugin.reserve_activations(lambda: _activation_bytes(spec, cfg))  # under a budget
    if lazy is not None:
        plugin.lazy = lazy  # materialized where it lives ([Note: lazy job])
    booster = Booster(plugin)
    model, optimizer = booster.boost(model, optimizer)
    # [Note: mesh data]: one batch per data-parallel coordinate, losses averaged over dp
    mesh = plugin.mesh
    data_rank, dp = (mesh.coord("dp"), mesh.size("dp")) if mesh else (rank, world)
    dp_group = mesh.group("dp") if mesh else None
    loader = open_loader(cfg, shards, dp_rank=data_rank, dp_size=dp)

    out = cfg.out
    ckpt_root = out / "checkpoint"
    start = 0
    if resume_from is not None:
        info = booster.load(model, optimizer, resume_from)
        start = info["step"]
        restore_position(loader, info, rank, console if main else None)
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
            booster.close()  # [Note: clean exit]
            return TrainResult([], float("nan"), 0.0, spec.num_params, info["path"], out)
    extra = {
        "train_config": {k: str(v) for k, v in asdict(cfg).items()},
        "model_config": spec.config,
        "tokenizer": tokenizer.spec,
        **({"lora": lora} if lora else {}),
    }
    if main:
        out.mkdir(parents=True, exist_ok=True)
        console.print(
            f"[bold]colossal train[/]: {spec.label} ({spec.num_params:,} params), "
            f"{world} rank(s), plugin {plugin.label()}, "
            f"{describe_data(shards, tokenizer)}"
        )
        if booster.matmul_note is not None:
            console.print(booster.matmul_note)
        if lora:
            console.print(
                f"LoRA r{lora['rank']} on {', '.join(lora['target_modules'])}: "
                f"{lora['trainable_params']:,} trainable parameters, the base frozen"
            )
    if main and cfg.resume:
        trim_metrics(out, start)
    metrics = None  # opened with the first record: a run failing in step 1 leaves no trace
    guard = FiniteGuard(precision=cfg.precision, lr=cfg.lr)
    proc = psutil.Process()
    losses: list[float] = []
    tokens_per_step = cfg.batch_size * cfg.grad_accum * cfg.seq_len * dp  # global, once
    held_out = loader.val_batches(4)  # the same on resume: not drawn from the training order
    tensorboard = TensorBoardLog(out) if main and cfg.log == "tensorboard" else None
    checkpoint: Path | None = None
    records: list[dict[str, Any]] = []
    run_start = time.perf_counter()
    with TrainDisplay(cfg.steps - start, enabled=main, console=console) as display:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * warmup_cosine(step, cfg.steps)
            x, y = loader.next_batch()  # [Note: data order]; batch_size * grad_accum rows
            x, y = booster.to_device((x, y))  # [Note: plugin device]
            # grad_accum micro-batches (a pipeline's are in its schedule), each loss averaged
            # over dp and checked before its backward
            with booster.compute():  # [Note: cpu matmul] in colossal_zero
                loss_value = booster.train_step(
                    x,
                    y,
                    model,
                    optimizer,
                    microbatches=cfg.grad_accum,
                    on_loss=lambda loss, s=step + 1: _checked_loss(guard, s, loss, dp_group),
                )
            guard.check_grads(step + 1, model, optimizer)
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
            if cfg.layout is not None:
                record["layout"] = cfg.layout
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and held_out:
                with booster.compute():
                    record["val_loss"] = _evaluate(booster, model, held_out, dp_group)
            records.append(record)
            if tensorboard is not None:
                tensorboard.add(record)
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
                with watch.paused():
                    checkpoint = save_with_state(
                        booster, model, optimizer, ckpt_root, step + 1, extra, loader
                    )
    elapsed = time.perf_counter() - run_start
    watch.training_over()  # [Note: watchdog]: saves and the end are not watched for stalls
    if metrics is not None:
        metrics.close()
    if tensorboard is not None:
        tensorboard.close()
    final = cfg.save_final and (not cfg.checkpoint_every or cfg.steps % cfg.checkpoint_every)
    if final:
        _choose_export(plugin, cfg, cfg.steps)
        with watch.paused():
            checkpoint = save_with_state(
                booster, model, optimizer, ckpt_root, cfg.steps, extra, loader
            )
    with watch.paused(), booster.compute():
        val = _evaluate(booster, model, held_out, dp_group) if held_out else float("nan")
    hf_folder = (
        export_after_training(cfg.model, cfg.export, checkpoint, out, lora=lora is not None)
        if main
        else None
    )
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
        if hf_folder is not None:
            summary["hugging face export" if hf_folder.name == "hf" else "export"] = str(hf_folder)
        if records and "bytes_moved" in records[-1]:
            summary["memory timeline"] = str(plot_memory_timeline(records, out))
        console.print(summary_table(summary))
    booster.close()  # every background thread joined, the plugin's groups destroyed
    return result
