"""Rank-side runs for test_plan's validation against measured bytes (run inside a ``World``)."""

from __future__ import annotations

import torch

from colossal_models import GPT, GPTConfig
from colossal_zero import LowLevelZeroOptimizer, ZeroConfig


def zero_state_bytes(stage: int, preset: str = "micro") -> tuple[int, int, int]:
    """Parameters of ``preset``, the model-state bytes this rank holds after one bf16 ZeRO step,
    and the bytes it counted in that step."""
    torch.manual_seed(0)
    cfg = GPTConfig.preset(preset)
    model = GPT(cfg)
    opt = LowLevelZeroOptimizer(
        model, model.parameters(), lr=1e-3, config=ZeroConfig(stage=stage, precision="bf16")
    )
    ids = torch.randint(0, cfg.vocab_size, (2, 32))
    opt.backward(model(ids, ids))
    opt.step()
    opt.zero_grad()
    return cfg.num_params(), sum(opt.model_state_bytes().values()), sum(opt.comm_bytes.values())


class _Stage(torch.nn.Module):
    """Two ``tanh(Linear)`` layers; the last stage returns the mean squared error."""

    def __init__(self, width: int, last: bool):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, width)
        )
        self.last = last

    def forward(self, x, targets=None):  # type: ignore[no-untyped-def]
        y = self.body(x)
        return (y - targets).pow(2).mean() if self.last else y


def pipeline_sent_bytes(m: int, batch: int, width: int) -> tuple[int, int]:
    """This rank's stage and the bytes it counted sending in one 1F1B step over all ranks."""
    import torch.distributed as dist

    from colossal_parallel import MeshConfig, ProcessMesh
    from colossal_parallel.pipeline import PipelineSchedule, run_pipeline

    p = dist.get_world_size()
    mesh = ProcessMesh(MeshConfig(pp=p))
    me = mesh.coord("pp")
    torch.manual_seed(me)
    x, y = torch.randn(2, batch, width)
    mesh.comm.counter.reset()
    run_pipeline(
        [_Stage(width, me == p - 1)],
        mesh,
        PipelineSchedule("1f1b", m),
        x,
        y,
        boundary_shape=(batch // m, width),
    )
    return me, mesh.comm.counter.bytes("pp", "send")


def tp1d_block_bytes(sequence_parallel: bool, batch: int, seq: int) -> int:
    """Counted bytes of one GPT block under 1D tensor parallelism, forward and backward: the
    counted bytes of a 2-layer model minus those of a 1-layer one (embeddings and loss cancel)."""
    import torch.distributed as dist

    from colossal_models import parallelize
    from colossal_parallel import MeshConfig, ProcessMesh

    mesh = ProcessMesh(MeshConfig(tp=dist.get_world_size(), tp_mode="1d"))
    counted = []
    for layers in (1, 2):
        torch.manual_seed(0)
        cfg = GPTConfig.preset("micro", num_layers=layers)
        model = parallelize(GPT(cfg), mesh, sequence_parallel=sequence_parallel)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq))
        mesh.comm.counter.reset()
        model(ids, ids).backward()
        counted.append(mesh.comm.counter.bytes())
    return counted[1] - counted[0]


def gemini_state_bytes(preset: str = "micro") -> tuple[int, int]:
    """Parameters of ``preset`` and the bytes Gemini's tiers hold after two bf16 steps (one
    process)."""
    from colossal_zero import GeminiConfig, GeminiOptimizer, apply_gemini

    torch.manual_seed(0)
    cfg = GPTConfig.preset(preset)
    model = apply_gemini(GPT(cfg), GeminiConfig(precision="bf16"))
    opt = GeminiOptimizer(model, lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (2, 32))
    for _ in range(2):
        opt.backward(model(ids, ids))
        opt.step()
        opt.zero_grad()
    return cfg.num_params(), sum(t.used_bytes for t in model.memory_stats().tiers.values())


def tp_block_bytes(mode: str, batch: int, seq: int) -> int:
    """Counted bytes of one fp32 GPT block under tensor-parallel ``mode`` over all ranks, forward
    and backward: a 2-layer model's minus a 1-layer one's."""
    import torch.distributed as dist

    from colossal_models import parallelize
    from colossal_parallel import MeshConfig, ProcessMesh

    mesh = ProcessMesh(MeshConfig(tp=dist.get_world_size(), tp_mode=mode))
    counted = []
    for layers in (1, 2):
        torch.manual_seed(0)
        cfg = GPTConfig.preset("micro", num_layers=layers)
        model = parallelize(GPT(cfg), mesh)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq))
        mesh.comm.counter.reset()
        model(ids, ids).backward()
        counted.append(mesh.comm.counter.bytes())
    return counted[1] - counted[0]
