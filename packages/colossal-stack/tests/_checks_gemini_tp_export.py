"""Rank-side check of the streamed Gemini x tp export (run inside a colossal_testing World).

Each case trains GPT a few steps under ``GeminiPlugin(tp_size=...)``, then exports it twice: the
whole gather (``gather_full_state_dict`` of every rank's full tp shard, plus the buffers) and
the streamed ``export_gemini``. Rank 0 reports whether both give the same names and bit-identical
tensors, and the largest number of tensor bytes alive beyond those before the export, counted
at every ``ShardedSafetensorsWriter.add`` (the moment the stream holds its gathered chunk, the
tensor being written and nothing else new) and once with the whole gather's result.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import torch

import colossal.booster._full_model as export_mod
from colossal import Booster, GeminiPlugin
from colossal.booster import ShardedSafetensorsWriter, load_sharded_safetensors
from colossal_models import GPT, GPTConfig
from colossal_models.sharding import gather_full_state_dict
from colossal_zero.checkpoint import iter_full_state

B, T = 4, 16


_TENSORS = (torch.Tensor, torch.nn.Parameter)  # exact types: isinstance on every object is slow


def _live_bytes() -> int:
    """Bytes of every distinct CPU tensor storage the garbage collector can reach."""
    seen: dict[int, int] = {}
    for o in gc.get_objects():
        if type(o) in _TENSORS and o.device.type == "cpu":
            st = o.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


class _Counting(ShardedSafetensorsWriter):
    """The export's writer, measuring the live tensor bytes above ``base`` at every ``add``."""

    base = 0
    peak = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        type(self).peak = max(type(self).peak, _live_bytes() - type(self).base)
        super().add(name, tensor)


def streamed_export_case(settings: dict, root: str, layers: int = 2, steps: int = 2) -> dict:
    """Train, export whole and streamed, compare (see the module docstring)."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=128, max_seq_len=T, num_layers=layers, num_heads=4, hidden_size=32, bias=False
    )
    plugin = GeminiPlugin(export_full_model=False, **settings)
    booster = Booster(plugin)
    model = GPT(cfg)
    model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    mesh = plugin.mesh
    assert mesh is not None
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):  # every rank the same batch: the values only need to move
        d = torch.randint(0, 128, (B, T + 1), generator=g)
        booster.backward(model(d[:, :-1], d[:, 1:]), opt)
        opt.step()
        opt.zero_grad()

    gc.collect()
    base = _live_bytes()
    shards = dict(iter_full_state(model))
    whole = gather_full_state_dict(model.module, mesh, values=shards)
    params = {n for n, _ in model.module.named_parameters(remove_duplicate=False)}
    whole.update({n: v for n, v in shards.items() if n not in params})
    whole_held = _live_bytes() - base
    del shards

    out_dir = Path(root) / "export"
    gc.collect()
    _Counting.base, _Counting.peak = _live_bytes(), 0  # ``whole`` included
    export_mod.ShardedSafetensorsWriter = _Counting  # type: ignore[misc]
    try:
        export_mod.export_gemini(
            model, out_dir, max_shard_bytes=64 << 10, mesh=mesh, maps=plugin._tp_maps
        )
    finally:
        export_mod.ShardedSafetensorsWriter = ShardedSafetensorsWriter  # type: ignore[misc]
    out: dict = {"rank": torch.distributed.get_rank()}
    if out["rank"] == 0:
        got = load_sharded_safetensors(out_dir)
        out["same_names"] = sorted(got) == sorted(whole)
        out["bit_identical"] = all(torch.equal(got[n], whole[n]) for n in whole if n in got)
        out["names"] = len(whole)
        out["reference_names"] = sorted(got) == sorted(GPT(cfg).state_dict())
        index = json.loads((out_dir / "model.safetensors.index.json").read_text())
        out["shards"] = len(set(index["weight_map"].values()))
        out["streamed_peak"] = _Counting.peak
        out["whole_held"] = whole_held
        out["model_bytes"] = sum(t.nbytes for t in whole.values())
        out["largest_tensor"] = max(t.nbytes for t in whole.values())
        out["largest_chunk"] = max(
            c.capacity * 4 for c in model.runtime.manager.registry.param_chunks()
        )
    plugin.close()
    return out
