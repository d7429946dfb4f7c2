"""``colossal plan``: rank the layouts of a model (preset or Hugging Face config) on given hardware
(colossal.plan)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from colossal_contracts import ConfigError

from ..lora import LoraSpec
from ..plan import (
    HARDWARE,
    PRECISIONS,
    PlanRequest,
    fewest_devices,
    model_shape,
    parse_bandwidth,
    parse_bytes,
    plan_layouts,
)
from ..plan._hardware import GiB
from ..plan._layout import Layout
from ..plan._lora import lora_shape
from ..plan._render import plan_json, plot_memory, print_plans

__all__ = ["add_plan_parser"]

_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


_MOST_DEVICES = 1 << 17  # beyond any cluster we plan for; larger counts only make planning slow


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="which layouts fit a model on given hardware, and how fast")
    p.add_argument(
        "--model",
        default="gpt",
        help="gpt or palm (with --preset), or hf:PATH, a Hugging Face causal LM's local "
        "config.json or saved folder (default gpt)",
    )
    p.add_argument("--preset", default="xl", help="model size preset of gpt/palm (default xl)")
    p.add_argument("--hardware", default="a100-80g", help=f"one of {', '.join(HARDWARE)}")
    p.add_argument("--devices", type=int, default=8, help="devices to plan for (default 8)")
    p.add_argument("--device-memory", help="override the preset's device memory, e.g. 80GiB")
    p.add_argument("--host-memory", help="host memory per node, e.g. 1TiB")
    p.add_argument("--disk", help="NVMe per node, e.g. 8TiB")
    p.add_argument("--interconnect", help="e.g. intra=300GB/s,inter=25GB/s")
    p.add_argument("--global-batch", type=int, default=8, help="samples per step (default 8)")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sample (default 1024)")
    p.add_argument("--efficiency", type=float, default=0.6, help="fraction of peak (default 0.6)")
    p.add_argument(
        "--precision", default="bf16", help="bf16 (mixed precision, default) or fp32 training"
    )
    p.add_argument(
        "--lora-rank",
        type=int,
        default=None,
        help="plan LoRA fine-tuning of this rank: the base frozen (compute-precision bytes "
        "only), the adapters trainable (default: full fine-tuning)",
    )
    p.add_argument(
        "--lora-targets",
        default="attn,mlp",
        help="with --lora-rank: attn, mlp and linear module names (default: %(default)s)",
    )
    p.add_argument("--top", type=int, default=15, help="rows of the table (default 15)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--png", type=Path, help="write a PNG of the top layouts' memory split")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this machine (matmul FLOP/s per dtype at --seq-len tokens of the model's "
        "width, memory copy, all-reduce over the launched world, disk) into a profile",
    )
    p.add_argument("--out", type=Path, help="with --calibrate: write the profile here (JSON)")
    p.add_argument(
        "--hardware-profile",
        type=Path,
        help="plan with a --calibrate profile instead of a --hardware preset",
    )
    p.set_defaults(func=_run)


def _no_model_parallelism(lay: Layout) -> bool:
    """Layouts a LoRA run builds: data parallelism (ddp, ZeRO, Gemini) only."""
    return lay.tp == 1 and lay.pp == 1 and lay.sp == 1


def _hardware(args: argparse.Namespace):
    if args.hardware not in HARDWARE:
        raise ConfigError(
            f"unknown --hardware {args.hardware!r}; choose one of: {', '.join(HARDWARE)}"
        )
    hw = HARDWARE[args.hardware]
    if args.device_memory:
        hw = replace(hw, memory=parse_bytes(args.device_memory, what="--device-memory"))
    if args.host_memory:
        hw = replace(hw, host_memory=parse_bytes(args.host_memory, what="--host-memory"))
    if args.disk:
        hw = replace(hw, disk=parse_bytes(args.disk, what="--disk"))
    if args.interconnect:
        links = {}
        for part in args.interconnect.split(","):
            key, _, val = part.partition("=")
            if key.strip() not in ("intra", "inter", "pcie", "disk"):
                raise ConfigError(
                    f"--interconnect part {part!r}: use intra=, inter=, pcie= or disk=, "
                    "e.g. intra=300GB/s,inter=25GB/s"
                )
            links[key.strip() + "_bw"] = parse_bandwidth(val, what=f"--interconnect {key}")
        hw = replace(hw, **links)
    return hw


def _calibrate(args: argparse.Namespace) -> int:
    import os

    from .._dist import init_from_env
    from ..plan._calibrate import calibrate

    if args.out is not None and not args.out.parent.is_dir():
        raise ConfigError(f"--out {args.out}: folder {args.out.parent} does not exist")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        init_from_env()
    shape = model_shape(args.model, args.preset)
    prof = calibrate(tokens=args.seq_len, hidden=shape.hidden)
    text = json.dumps(prof, indent=2)
    if int(os.environ.get("RANK", "0")) == 0:
        if args.out is not None:
            args.out.write_text(text + "\n")
        print(text)
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.calibrate:
        return _calibrate(args)
    if args.out is not None:
        raise ConfigError("--out is where --calibrate writes its profile; add --calibrate")
    if not 0 < args.efficiency <= 1:  # nan fails too
        raise ConfigError(f"--efficiency must be in (0, 1], got {args.efficiency}")
    if args.top < 1:
        raise ConfigError(f"--top must be a positive number of rows, got {args.top}")
    if not 1 <= args.devices <= _MOST_DEVICES:
        raise ConfigError(
            f"--devices must be in [1, {_MOST_DEVICES:,}], got {args.devices:,}; plan a cluster "
            "of at most that many devices"
        )
    if args.png is not None and not args.png.parent.is_dir():
        raise ConfigError(
            f"--png {args.png}: the folder {args.png.parent} does not exist; create it or write "
            "the PNG elsewhere"
        )
    if args.precision not in PRECISIONS:
        raise ConfigError(
            f"--precision must be one of {', '.join(PRECISIONS)}, got {args.precision!r}"
        )
    if args.hardware_profile is not None:
        from ..plan._calibrate import load_profile, profile_hardware

        prof = load_profile(args.hardware_profile)
        hw = profile_hardware(prof, precision=args.precision, name=str(args.hardware_profile))
    else:
        hw = _hardware(args)
    shape = model_shape(args.model, args.preset)
    only = None
    if args.lora_rank is not None:  # LoRA runs without tp, pp and sp (the job's check)
        spec = LoraSpec(rank=args.lora_rank, targets=tuple(args.lora_targets.split(",")))
        shape = lora_shape(shape, args.model, args.preset, spec)
        only = _no_model_parallelism
    elif args.lora_targets != "attn,mlp":
        raise ConfigError("--lora-targets needs --lora-rank R (say, --lora-rank 8)")
    if shape.max_positions and args.seq_len > shape.max_positions:
        raise ConfigError(
            f"--seq-len {args.seq_len} exceeds {shape.name}'s {shape.max_positions} positions; "
            f"use --seq-len {shape.max_positions} or less"
        )
    req = PlanRequest(
        shape,
        hw,
        args.devices,
        args.global_batch,
        args.seq_len,
        args.efficiency,
        args.precision,
        only=only,
    )
    plans = plan_layouts(req)
    size = f"{req.shape.params / 1e9:.2f}B"
    if shape.frozen:
        size += f": {shape.frozen:,} frozen, {shape.trainable:,} trainable"
    head = (
        f"{req.shape.name} ({size}) on {args.devices} x {hw.name} "
        f"({hw.memory / GiB:.0f} GiB), batch {args.global_batch}, seq {args.seq_len}"
    )
    if not plans:
        raise ConfigError(
            f"no layout of {head} can be built: --devices must split into dp x pp x tp with tp "
            f"dividing {req.shape.heads} heads, pp {req.shape.layers} layers and dp the batch"
        )
    if not plans[0].fits:
        near = plans[0]
        grow = [n for n in (*_COUNTS, 2048) if n > args.devices]
        found = fewest_devices(req, grow[:6])
        more = f"; fits from {found[0]} devices ({found[1].layout.describe()})" if found else ""
        raise ConfigError(
            f"no layout of {head} fits; nearest: {near.layout.describe()} ({near.why}){more}"
        )
    fewer = [n for n in _COUNTS if n < args.devices]
    found = fewest_devices(req, fewer) if fewer else None
    n_min, best = found if found else (args.devices, plans[0])
    if args.json:
        out = {
            "request": head,
            "frozen_params": shape.frozen,
            "trainable_params": shape.trainable,
            "fewest_devices": n_min,
            "fewest_devices_layout": best.layout.describe(),
            "plans": [plan_json(p) for p in plans[: args.top]],
        }
        print(json.dumps(out))
    else:
        print_plans(plans, head, args.top)
        print(
            f"fewest devices that fit (of {', '.join(map(str, [*fewer, args.devices]))}): "
            f"{n_min} ({best.layout.describe()}, {best.cost.step:.2f} s/step)"
        )
    if args.png:
        plot_memory(plans[: min(args.top, 12)], args.png, hw.memory)
    return 0
