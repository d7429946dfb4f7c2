"""``colossal train --layout``: a layout string of ``colossal plan`` (or ``auto``, the planner's
pick) turned into the training job's flags.

[Note: layout flags] A layout names the mesh, the sharding, the micro-batches and the
recomputation; with ``--layout`` the job's ``--batch-size`` is the global batch (samples per
step over every data-parallel rank), which ``auto`` plans for and an explicit layout must match
(``dp x micro_batch x num_micro``). Gemini's tiers become byte budgets from the layout's predicted
memory: ``gemini`` keeps everything on the accelerator (no budget); the tiers budget the
accelerator for the layout's predicted peak (its device-resident states, working set and
activations), and ``gemini-disk`` adds the host budget the planner split the tiers under
([Note: gemini tiers]) and a disk budget, ``tier_budget`` of its planned bytes, and keeps the
optimizer states where they start (``--states-placement host``) (the planner counts the chunks
the runtime picks under these budgets: [Note: gemini chunks]).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import torch

from colossal_contracts import ConfigError
from colossal_models import ByteTokenizer, GPTConfig, PaLMConfig

from ..plan import Hardware, Plan, PlanRequest, evaluate, fewest_devices, plan_layouts
from ..plan._gemini import tier_budget
from ..plan._layout import Layout, check_layout, parse_layout
from ..plan._shape import ModelShape, from_gpt_config, from_palm_config, model_shape
from ._sections import flag_defaults

__all__ = [
    "LayoutChoice",
    "apply_layout",
    "choose_layout",
    "layout_flags",
    "local_hardware",
    "train_shape",
]


@dataclass(frozen=True)
class LayoutChoice:
    """The layout a run uses with its predicted memory and step (``pick``), and with ``auto``
    the runner-up."""

    layout: Layout
    pick: Plan | None = None
    runner_up: Plan | None = None


def train_shape(model: str, preset: str, vocab: int) -> ModelShape:
    """The planner's shape of the model the job trains (the byte tokenizer's ``vocab``)."""
    if model == "gpt":
        return from_gpt_config(GPTConfig.preset(preset).with_vocab(vocab), f"gpt-{preset}")
    if model == "palm":
        return from_palm_config(PaLMConfig.preset(preset).with_vocab(vocab), f"palm-{preset}")
    return model_shape(model, preset)


def _plan_precision(precision: str) -> str:
    return "fp32" if precision == "fp32" else "bf16"  # fp16 holds what bf16 holds


def choose_layout(
    text: str,
    *,
    shape: ModelShape,
    hardware: Hardware,
    world: int,
    global_batch: int,
    seq_len: int,
    precision: str,
) -> LayoutChoice:
    """The layout ``text`` names (a ``colossal plan`` row), or with ``auto`` the fastest that
    fits ``hardware`` on ``world`` ranks at ``global_batch`` x ``seq_len``. One-line
    ``ConfigError`` when ``text`` does not read or build, or nothing fits (naming the smallest
    device budget and device count that do)."""
    req = PlanRequest(
        shape, hardware, world, global_batch, seq_len, precision=_plan_precision(precision)
    )
    if text.strip() != "auto":
        lay = parse_layout(text)
        check_layout(lay, _plan_precision(precision))
        if lay.devices != world:
            raise ConfigError(
                f"layout {lay.describe()!r} uses {lay.devices} ranks, the run has {world}; "
                f"launch {lay.devices} ranks (colossal run --nproc-per-node {lay.devices}) or "
                "use --layout auto"
            )
        batch = lay.dp * lay.micro_batch * lay.num_micro
        if batch != global_batch:
            raise ConfigError(
                f"layout {lay.describe()!r} trains {batch} samples per step, --batch-size is "
                f"{global_batch} (with --layout it is the global batch); use --batch-size {batch}"
            )
        return LayoutChoice(lay, evaluate(req, lay))
    plans = plan_layouts(req)
    if not plans:
        raise ConfigError(
            f"--layout auto: no layout of {shape.name} builds on {world} ranks at batch "
            f"{global_batch} x seq {seq_len} (tp must divide {shape.heads} heads, pp "
            f"{shape.layers} blocks, dp the batch); change the world size or --batch-size"
        )
    fitting = [p for p in plans if p.fits]
    if not fitting:
        need = min(p.memory.device_total for p in plans)
        more = fewest_devices(req, [n for n in (2, 4, 8, 16, 32, 64, 128) if n > world])
        grow = f", or {more[0]} ranks ({more[1].layout.describe()})" if more else ""
        raise ConfigError(
            f"--layout auto: no layout of {shape.name} fits {world} ranks of "
            f"{hardware.memory / 2**20:,.1f} MiB (nearest: {plans[0].layout.describe()}, "
            f"{plans[0].why}); the smallest device budget that fits is "
            f"{math.ceil(need / 2**20)} MiB{grow}"
        )
    return LayoutChoice(fitting[0].layout, fitting[0], fitting[1] if len(fitting) > 1 else None)


def layout_flags(lay: Layout, plan: Plan | None = None) -> dict[str, Any]:
    """``TrainConfig`` settings that run ``lay`` (see [Note: layout flags]); ``plan`` (its
    predicted memory) sets the budgets of Gemini's host and disk tiers."""
    out: dict[str, Any] = {
        "tp": lay.tp,
        "tp_mode": "1d" if lay.tp_mode == "1d-sp" else lay.tp_mode,
        "tp_depth": lay.depth,
        "sp": None,
        "sp_size": 1,
        "pp": lay.pp,
        "microbatches": lay.num_micro if lay.pp > 1 else 1,
        "schedule": "1f1b",
        "batch_size": lay.micro_batch * lay.num_micro,
        "activation_checkpointing": lay.recompute == "full",
        "plugin": None,
        "zero": {"ddp": 0, "zero1": 1, "zero2": 2}.get(lay.method, 3),
    }
    megatron = lay.tp_mode == "1d-sp" and lay.tp > 1
    if megatron:
        out["sp"] = "megatron"
    if lay.sp > 1:  # ring/Ulysses over sp, with Megatron's split over tp when the mode has it
        out["sp"] = f"{lay.sp_kind}+megatron" if megatron else lay.sp_kind
        out["sp_size"] = lay.sp
    if lay.method.startswith("gemini"):
        out["plugin"] = "gemini"
        out.update(_tier_budgets(lay, plan))
    return out


def _budget(nbytes: float) -> str:
    return str(tier_budget(nbytes))  # the budget the planner counted chunks under


def _tier_budgets(lay: Layout, plan: Plan | None) -> dict[str, Any]:
    if lay.method == "gemini":
        return {}
    if plan is None:
        raise ConfigError(f"layout {lay.describe()!r}: {lay.method} needs its planned memory")
    m = plan.memory
    device = _budget(m.device_total)  # the accelerator budget holds activations too
    if lay.method in ("gemini-host", "gemini-host-all"):
        return {"accelerator_budget": device}
    # the host budget the planner split the tiers under, and the states kept where that split
    # puts them: with the accelerator's room (twice the plan) the runtime would move them up
    # ([Note: state placement] in colossal-zero), and the layout would not be what was planned
    return {
        "accelerator_budget": device,
        "host_budget": str(int(m.host_budget)),
        "disk_budget": _budget(m.disk),
        "states_placement": "host",
    }


_MESH_KEYS = ("tp", "tp_mode", "tp_depth", "sp", "sp_size", "pp", "microbatches", "zero")
_MESH_KEYS += ("activation_checkpointing",)


def local_hardware(world: int, kw: dict[str, Any], profile: Path | None) -> Hardware:
    """What ``--layout auto`` plans with: the profile's figures (``--hardware-profile``), else
    nominal ones for this machine (the same on every rank: see [Note: hardware profile]); the
    job's budgets, when given, are the device, host and disk room."""
    from .._sizes import parse_bytes
    from ..plan._calibrate import load_profile, profile_hardware

    precision = _plan_precision(kw.get("precision", "fp32"))
    if profile is not None:
        hw = profile_hardware(load_profile(profile), precision=precision, name=str(profile))
    else:
        cuda = torch.cuda.is_available()
        memory = (
            torch.cuda.get_device_properties(0).total_memory
            if cuda
            else psutil.virtual_memory().total // world
        )
        hw = Hardware("local", memory, 50e12 if cuda else 50e9, world, 5e9, 5e9, 5e9, 0)
        hw = replace(hw, host_memory=psutil.virtual_memory().total, disk_bw=5e8)
    changes: dict[str, Any] = {"devices_per_node": world}
    if kw.get("accelerator_budget") is not None:
        changes["memory"] = parse_bytes(kw["accelerator_budget"])
    if kw.get("host_budget") is not None:
        changes["host_memory"] = parse_bytes(kw["host_budget"]) * world
    if kw.get("disk_budget"):  # 0, the default, is no disk tier: the hardware's own disk
        changes["disk"] = parse_bytes(kw["disk_budget"]) * world
    return replace(hw, **changes)


def apply_layout(text: str, kw: dict[str, Any], *, profile: Path | None = None) -> dict[str, Any]:
    """``kw`` (``TrainConfig`` settings) with ``--layout text``'s flags; on rank 0 prints the
    pick (and with ``auto`` the runner-up) with its predicted memory and step time."""
    defaults = flag_defaults()
    given = [k for k in _MESH_KEYS if kw.get(k, defaults[k]) != defaults[k]]
    if given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ConfigError(f"{flags} comes from --layout {text!r}; drop it")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    spec_vocab = ByteTokenizer.vocab_size
    shape = train_shape(kw.get("model", "gpt"), kw.get("preset", "tiny"), spec_vocab)
    choice = choose_layout(
        text,
        shape=shape,
        hardware=local_hardware(world, kw, profile),
        world=world,
        global_batch=kw.get("batch_size", defaults["batch_size"]),
        seq_len=kw.get("seq_len", defaults["seq_len"]),
        precision=kw.get("precision", "fp32"),
    )
    if int(os.environ.get("RANK", "0")) == 0:
        for what, plan in (("layout", choice.pick), ("runner-up", choice.runner_up)):
            if plan is not None:
                print(
                    f"{what}: {plan.layout.describe()}  predicted peak "
                    f"{plan.memory.device_total / 2**20:,.1f} MiB per rank, step "
                    f"{plan.cost.step:.3g} s",
                    flush=True,
                )
    planned = layout_flags(choice.layout, choice.pick)
    mine = kw.get("states_placement", defaults["states_placement"])
    if "states_placement" in planned and mine not in (
        defaults["states_placement"],
        planned["states_placement"],
    ):
        raise ConfigError(
            f"--states-placement {mine} conflicts with --layout {text!r}, whose plan "
            f"({choice.layout.describe()}) keeps Gemini's states where its tiers put them "
            f"(--states-placement {planned['states_placement']}); drop --states-placement"
        )
    out = {**kw, **planned}
    out["layout"] = choice.layout.describe()
    return out
