"""Device placement of every plugin, checked on torch's ``meta`` device without a GPU
([Note: meta placement] in ``_meta_device.py``): one rank of each layout trains two steps with
``device="meta"``; the loss, every parameter, gradient, optimizer state and plugin buffer must
be on that device, and no collective may be handed a host tensor (NCCL takes CUDA tensors only).
The CUDA run of the same paths is ``benchmarks/gpu_check.sh`` (docs/gpu.md)."""

from __future__ import annotations

import pytest
import torch
from _meta_device import HostCollectives, MetaHostReads, fake_world, misplaced

from colossal import Booster, DDPPlugin, HybridParallelPlugin, LowLevelZeroPlugin
from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig

META = torch.device("meta")
# collectives allowed a host tensor: setup and scalars whose code moves them to CUDA under NCCL
# (the fake backend is not NCCL): colossal-zero's norm pair, the tp layout's fingerprints
HOST_OK = ("colossal_zero/optim/_mesh_norm.py", "colossal_models/_sharding.py")

# name -> (plugin, settings, world size, the ranks to run: first and last pipeline stage)
CASES: dict[str, tuple[type, dict, int, tuple[int, ...]]] = {
    "ddp-one-process": (DDPPlugin, {}, 1, (0,)),
    "zero1-dp2": (LowLevelZeroPlugin, {"stage": 1}, 2, (1,)),
    "zero2-dp2-bf16-clip": (
        LowLevelZeroPlugin,
        {"stage": 2, "precision": "bf16", "max_grad_norm": 1.0},
        2,
        (0,),
    ),
    "zero1-fp16": (LowLevelZeroPlugin, {"stage": 1, "precision": "fp16"}, 2, (0,)),
    "tp2-pp2-dp2-zero1": (
        HybridParallelPlugin,
        {"tp_size": 2, "pp_size": 2, "microbatches": 2, "zero_stage": 1, "max_grad_norm": 1.0},
        8,
        (0, 7),
    ),
    "pp4-interleaved": (
        HybridParallelPlugin,
        {"pp_size": 4, "microbatches": 4, "schedule": "interleaved"},
        4,
        (0, 3),
    ),
    "pp2-gpipe": (
        HybridParallelPlugin,
        {"pp_size": 2, "microbatches": 2, "schedule": "gpipe"},
        2,
        (1,),
    ),
    "ring-sp2-dp4": (
        HybridParallelPlugin,
        {"sequence_parallel": "ring", "sp_size": 2, "max_grad_norm": 1.0},
        8,
        (3,),
    ),
    "ulysses-sp2-dp2": (
        HybridParallelPlugin,
        {"sequence_parallel": "ulysses", "sp_size": 2},
        4,
        (1,),
    ),
    "megatron-tp2-zero2": (
        HybridParallelPlugin,
        {"tp_size": 2, "sequence_parallel": "megatron", "zero_stage": 2, "precision": "bf16"},
        4,
        (2,),
    ),
    "2d-tp4-dp2": (
        HybridParallelPlugin,
        {"tp_size": 4, "tp_mode": "2d", "max_grad_norm": 1.0},
        8,
        (5,),
    ),
    "2.5d-tp8": (HybridParallelPlugin, {"tp_size": 8, "tp_mode": "2.5d", "tp_depth": 2}, 8, (6,)),
    "3d-tp8": (HybridParallelPlugin, {"tp_size": 8, "tp_mode": "3d"}, 8, (3,)),
    # compositions: long sequences with tp, pp and ZeRO in low precision; grid tp in stages;
    # activation checkpointing
    "ring-sp2-tp2-pp2-zero1-bf16": (
        HybridParallelPlugin,
        {"sequence_parallel": "ring", "sp_size": 2, "tp_size": 2, "pp_size": 2}
        | {"microbatches": 2, "zero_stage": 1, "precision": "bf16", "max_grad_norm": 1.0},
        8,
        (0, 7),
    ),
    "ulysses-sp2-pp2-zero1-fp16-ac": (
        HybridParallelPlugin,
        {"sequence_parallel": "ulysses", "sp_size": 2, "pp_size": 2, "microbatches": 2}
        | {"zero_stage": 1, "precision": "fp16", "activation_checkpointing": True},
        4,
        (3,),
    ),
    "ring-sp2-zero2-bf16": (
        HybridParallelPlugin,
        {"sequence_parallel": "ring", "sp_size": 2, "zero_stage": 2, "precision": "bf16"},
        4,
        (1,),
    ),
    "zero2-tp2-pp2-interleaved-bf16": (
        HybridParallelPlugin,
        {"tp_size": 2, "pp_size": 2, "microbatches": 2, "schedule": "interleaved"}
        | {"zero_stage": 2, "precision": "bf16", "max_grad_norm": 1.0},
        8,
        (1, 6),
    ),
    "2.5d-tp8-pp2-ac": (
        HybridParallelPlugin,
        {"tp_size": 8, "tp_mode": "2.5d", "tp_depth": 2, "pp_size": 2, "microbatches": 2}
        | {"activation_checkpointing": True},
        16,
        (0, 15),
    ),
    "3d-tp8-pp2-interleaved": (
        HybridParallelPlugin,
        {"tp_size": 8, "tp_mode": "3d", "pp_size": 2, "microbatches": 2}
        | {"schedule": "interleaved"},
        16,
        (9,),
    ),
}


def _model(num_layers: int = 8) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=64, max_seq_len=16, num_layers=num_layers, num_heads=4, hidden_size=32,
        bias=False,
    )  # fmt: skip
    return GPT(cfg)


def _layers(settings: dict) -> int:
    """The fewest blocks the layout's stages take (each op on meta costs a Python kernel)."""
    chunks = 2 if settings.get("schedule") == "interleaved" else 1
    return max(2, settings.get("pp_size", 1) * chunks)


def _two_steps(cls: type, settings: dict) -> tuple[list[str], list, list[torch.device]]:
    """Two steps of ``cls(device="meta", **settings)`` from CPU batches; what is misplaced
    after the backward of the second and after its step, the host collectives, loss devices."""
    model = _model(_layers(settings))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plugin = cls(device="meta", **settings)
    booster = Booster(plugin)
    host = HostCollectives()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 64, (8, 16), generator=g), torch.randint(0, 64, (8, 16), generator=g)
    bad: list[str] = []
    losses = []
    with MetaHostReads(), host:
        model, opt = booster.boost(model, opt)
        for _ in range(2):
            if getattr(plugin, "pp_size", 1) > 1:  # the pipeline moves the batch itself
                loss = booster.execute_pipeline(x, y, model, opt)
            else:
                xs, ys = booster.to_device((x, y))
                loss = model(xs, ys)
                booster.backward(loss, opt)
            losses.append(loss.device)
            bad += misplaced(META, model, opt)
            opt.step()
            opt.zero_grad()
        bad += misplaced(META, model, opt, plugin)
        if hasattr(plugin, "close"):
            plugin.close()
    wrong = [s for s in host.seen if not s[2].startswith(HOST_OK)]
    return bad, wrong, losses


@pytest.mark.parametrize("name", list(CASES))
def test_every_tensor_of_a_step_is_on_the_plugins_device(name):
    cls, settings, world, ranks = CASES[name]
    for rank in ranks:
        with fake_world(world, rank):
            bad, host, losses = _two_steps(cls, settings)
        assert not bad, (rank, bad[:10])
        assert not host, (rank, host[:5])
        assert losses == [META, META]


def test_the_optimizer_follows_parameters_that_torch_replaces_on_moving():
    """Moving to meta replaces parameters (not their .data): the optimizer given to boost must
    then hold the new ones, with its state moved too."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(2, 16, dtype=torch.long), torch.zeros(2, 16, dtype=torch.long)).backward()
    opt.step()  # state exists before boost
    model, opt = Booster(DDPPlugin(device="meta")).boost(model, opt)
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    assert held == {id(p) for p in model.parameters()}
    assert set(map(id, opt.state)) == held
    assert not misplaced(META, opt)


def test_a_device_setting_torch_cannot_use_is_a_config_error():
    with pytest.raises(ConfigError, match="torch device"):
        DDPPlugin(device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            HybridParallelPlugin(device="cuda")
    assert DDPPlugin().device == (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
