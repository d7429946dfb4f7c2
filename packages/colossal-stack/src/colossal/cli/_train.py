"""``colossal train``: argument parsing for the training job."""

from __future__ import annotations

import argparse
from pathlib import Path

from colossal_contracts import ConfigError

from ..train import TrainConfig, train
from ..train._layout import apply_layout
from ..train._sections import flag_defaults

__all__ = ["add_train_parser"]


def _path(text: str) -> Path:
    """A path flag's value; an empty one is refused rather than read as the current folder."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; give a path (use . for this folder)")
    return Path(text)


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    d = flag_defaults()  # the sections' defaults, by flag
    p = sub.add_parser("train", help="train a model on a text corpus (default: Python's stdlib)")
    p.add_argument(
        "--model",
        default=d["model"],
        help="gpt, palm, or hf:PATH (a local Hugging Face config.json or saved folder; "
        "no download) (default: %(default)s)",
    )
    p.add_argument("--preset", default=d["preset"], help="model size preset (default: %(default)s)")
    p.add_argument(
        "--steps", type=int, default=d["steps"], help="optimizer steps (default: %(default)s)"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=d["batch_size"],
        help="sequences per step per rank (default: %(default)s)",
    )
    p.add_argument(
        "--seq-len",
        type=int,
        default=d["seq_len"],
        help="tokens per sequence (default: %(default)s)",
    )
    p.add_argument("--seed", type=int, default=d["seed"], help="random seed (default: %(default)s)")
    data = p.add_argument_group("data", "text in (see docs/data.md)")
    data.add_argument(
        "--data",
        "--corpus",
        dest="data",
        type=_path,
        default=None,
        help="text file or folder, .jsonl, .parquet, a saved Hugging Face dataset folder, or a "
        "folder from colossal data prepare (default: this Python's standard library sources); "
        "--corpus is its older name",
    )
    data.add_argument(
        "--tokenizer",
        default=None,
        help="bytes, or hf:PATH (a tokenizer.json or a folder holding one) (default: a prepared "
        "folder's own, else the --model hf: folder's, else bytes)",
    )
    data.add_argument(
        "--text-field",
        default=d["text_field"],
        help="jsonl key or parquet/dataset column of the text (default: %(default)s)",
    )
    data.add_argument(
        "--val-fraction",
        type=float,
        default=d["val_fraction"],
        help="documents held out for validation, the last ones (default: %(default)s)",
    )
    data.add_argument(
        "--dropout",
        type=float,
        default=None,
        help="dropout of --model gpt (default: the preset's, 0); resumes stay exact",
    )
    p.add_argument(
        "--out", type=_path, default=d["out"], help="output directory (default: %(default)s)"
    )
    p.add_argument(
        "--plugin",
        default=None,
        help="training strategy: gemini, zero, ddp or hybrid (default: gemini, or hybrid "
        "when --tp, --pp or --sp ring|ulysses is given)",
    )
    p.add_argument(
        "--zero",
        type=int,
        default=None,
        help="ZeRO stage; without --plugin it picks the plugin: 0 ddp, 1-2 zero (1 shards "
        "optimizer states, 2 gradients too), 3 gemini; with --tp/--pp/--sp the hybrid plugin "
        "runs 0 (default), 1 or 2 over the data-parallel ranks, and ZeRO-3 with tensor "
        "parallelism is --plugin gemini --tp N",
    )
    p.add_argument(
        "--zero-stage",
        type=int,
        default=d["zero_stage"],
        help="with --plugin zero: the older spelling of --zero 1|2 (default: %(default)s)",
    )
    mesh = p.add_argument_group(
        "mesh",
        "tensor, sequence and pipeline parallelism (launch with colossal run --nproc-per-node "
        "N; dp = N / (tp * pp * sp-size); --batch-size is per dp rank)",
    )
    mesh.add_argument(
        "--tp", type=int, default=d["tp"], help="tensor-parallel ranks (default: %(default)s)"
    )
    mesh.add_argument(
        "--tp-mode",
        default=d["tp_mode"],
        help="1d (Megatron), 2d (tp = q*q), 2.5d (tp = q*q*depth) or 3d (tp = q*q*q) "
        "(default: %(default)s)",
    )
    mesh.add_argument(
        "--tp-depth", type=int, default=d["tp_depth"], help="depth of 2.5d (default: %(default)s)"
    )
    mesh.add_argument(
        "--sp",
        default=None,
        help="sequence parallelism: ring or ulysses over --sp-size ranks, megatron (over "
        "the 1d tp ranks), or both: ring+megatron, ulysses+megatron",
    )
    mesh.add_argument(
        "--sp-size",
        type=int,
        default=d["sp_size"],
        help="ranks per sequence for ring/ulysses (default: %(default)s)",
    )
    mesh.add_argument(
        "--pp", type=int, default=d["pp"], help="pipeline stages (default: %(default)s)"
    )
    mesh.add_argument(
        "--microbatches",
        type=int,
        default=d["microbatches"],
        help="pipeline micro-batches per step, dividing --batch-size (default: %(default)s)",
    )
    mesh.add_argument(
        "--schedule",
        default=d["schedule"],
        help="pipeline schedule: 1f1b, interleaved (2 chunks per rank) or gpipe (default: "
        "%(default)s)",
    )
    mesh.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute each block's activations in backward (every plugin)",
    )
    p.add_argument(
        "--max-grad-norm",
        type=float,
        default=d["max_grad_norm"],
        help="clip the global gradient norm over the whole mesh; 0 is off (default: %(default)s)",
    )
    p.add_argument(
        "--placement",
        default=d["placement"],
        help="gemini chunk placement: auto or static (default: %(default)s)",
    )
    p.add_argument(
        "--states-placement",
        default=d["states_placement"],
        help="where gemini's Adam states live after the first step: free (to the accelerator "
        "into room no moment used), demand (also room cached chunks filled) or host (where "
        "they started: host, then disk) (default: %(default)s)",
    )
    p.add_argument(
        "--accelerator-budget",
        default=d["accelerator_budget"],
        help="gemini byte budget on the accelerator, e.g. 512MiB (default: all of it)",
    )
    p.add_argument(
        "--host-budget",
        default=d["host_budget"],
        help="gemini byte budget of chunks in host memory, e.g. 8GiB (default: no limit)",
    )
    p.add_argument(
        "--disk-budget",
        default=d["disk_budget"],
        help="gemini byte budget of chunks on disk when host room ends, e.g. 64GiB "
        "(default: no disk tier)",
    )
    p.add_argument(
        "--disk-dir",
        type=_path,
        default=d["disk_dir"],
        help="folder of the disk tier: must exist, be writable, have --disk-budget free "
        "(default: the system's temporary directory)",
    )
    p.add_argument(
        "--precision",
        default=d["precision"],
        help="gemini precision: fp32, bf16 or fp16 (default: %(default)s)",
    )
    p.add_argument(
        "--lr", type=float, default=d["lr"], help="peak learning rate (default: %(default)s)"
    )
    p.add_argument(
        "--weight-decay",
        type=float,
        default=d["weight_decay"],
        help="AdamW decay of matrices; biases and norm weights get none (default: %(default)s)",
    )
    p.add_argument(
        "--grad-accum",
        type=int,
        default=d["grad_accum"],
        help="micro-batches of --batch-size per optimizer step (default: %(default)s)",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=d["eval_every"],
        help="validation loss every N steps; 0 only at the end (default: %(default)s)",
    )
    p.add_argument(
        "--log",
        default=d["log"],
        metavar="tensorboard",
        help="also write TensorBoard scalars under --out/tensorboard (pip install tensorboard)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=d["checkpoint_every"],
        help="save every N steps; 0 saves only at the end (default: %(default)s)",
    )
    p.add_argument(
        "--no-final-save",
        dest="save_final",
        action="store_false",
        help="no checkpoint after the last step (no disk for it; needs --export none)",
    )
    p.add_argument(
        "--export",
        default=d["export"],
        metavar="{final,every,none,merged}",
        help="which checkpoints also hold the consolidated fp32 model (safetensors shards + "
        "model.safetensors.index.json) beside the sharded state: final (the last step's), "
        "every, none; merged (LoRA): final, and the merged model in --out/hf beside the "
        "adapter folder --out/adapter (default: %(default)s)",
    )
    lora = p.add_argument_group("lora", "LoRA adapters through peft on a frozen base")
    lora.add_argument(
        "--lora-rank",
        type=int,
        default=d["lora_rank"],
        help="train LoRA adapters of this rank, the base frozen (default: full fine-tuning)",
    )
    lora.add_argument(
        "--lora-alpha",
        type=float,
        default=d["lora_alpha"],
        help="LoRA scaling numerator, updates scaled by alpha / rank (default: the rank)",
    )
    lora.add_argument(
        "--lora-targets",
        default=d["lora_targets"],
        help="comma list of attn, mlp and linear module names (default: %(default)s)",
    )
    lora.add_argument(
        "--lora-dropout",
        type=float,
        default=d["lora_dropout"],
        help="dropout on the adapters' input (default: %(default)s)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument(
        "--restart",
        action="store_true",
        help="move the run already in --out aside (to <out>.old-N, never deleted) and start afresh",
    )
    p.add_argument(
        "--layout",
        default=None,
        help="a layout as colossal plan prints it (e.g. 'dp2 tp2 zero1 mb4x1') or auto (the "
        "planner's fastest that fits); the mesh, ZeRO and micro-batch flags then come from it "
        "and --batch-size is the global batch",
    )
    p.add_argument(
        "--hardware-profile",
        type=Path,
        default=None,
        help="with --layout auto: plan with this colossal plan --calibrate profile",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    kw = _flags(args)
    if args.layout is not None:
        kw = apply_layout(args.layout, kw, profile=args.hardware_profile)
    elif args.hardware_profile is not None:
        raise ConfigError("--hardware-profile plans --layout auto; add --layout auto or drop it")
    train(TrainConfig.from_flags(**kw))
    return 0


def _flags(args: argparse.Namespace) -> dict:
    return dict(
        model=args.model,
        preset=args.preset,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        seed=args.seed,
        data=args.data,
        tokenizer=args.tokenizer,
        text_field=args.text_field,
        val_fraction=args.val_fraction,
        dropout=args.dropout,
        out=args.out,
        plugin=args.plugin,
        placement=args.placement,
        states_placement=args.states_placement,
        accelerator_budget=args.accelerator_budget,
        host_budget=args.host_budget,
        disk_budget=args.disk_budget,
        disk_dir=args.disk_dir,
        precision=args.precision,
        zero_stage=args.zero_stage,
        zero=args.zero,
        tp=args.tp,
        tp_mode=args.tp_mode,
        tp_depth=args.tp_depth,
        sp=args.sp,
        sp_size=args.sp_size,
        pp=args.pp,
        microbatches=args.microbatches,
        schedule=args.schedule,
        activation_checkpointing=args.activation_checkpointing,
        max_grad_norm=args.max_grad_norm,
        lr=args.lr,
        weight_decay=args.weight_decay,
        grad_accum=args.grad_accum,
        eval_every=args.eval_every,
        log=args.log,
        checkpoint_every=args.checkpoint_every,
        save_final=args.save_final,
        export=args.export,
        resume=args.resume,
        restart=args.restart,
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_targets=args.lora_targets,
        lora_dropout=args.lora_dropout,
    )
