"""``generate``: text from a checkpoint or a Hugging Face folder, token by token.

[Note: offloaded inference] With ``accelerator_budget`` the model's weights go into Gemini's
chunks (a static ``GeminiConfig`` and ``apply_gemini``, no optimizer, not
sharded) and each forward runs through the ``GeminiModule`` under ``torch.no_grad``: a chunk
is brought onto the accelerator when an operator reads one of its parameters and evicted when
the budget needs the room, so a model larger than the budget streams through it layer by layer,
as DeepSpeed's ZeRO-Inference does. On a machine without a GPU the accelerator is emulated
(the budget is enforced by the chunk manager, compute stays on the CPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from colossal_zero import GeminiConfig, GeminiModule, apply_gemini

from .._sizes import parse_bytes
from ._decoders import Decoder, HFDecoder, NativeDecoder, check_length
from ._load import Loaded, load_for_generation
from ._sampling import SamplingConfig, next_token

__all__ = ["GenerationResult", "generate", "generate_ids", "offload"]


@dataclass(frozen=True)
class GenerationResult:
    """What ``generate`` produced.

    Attributes:
        text: the prompt followed by the generated text.
        new_text: the generated text alone.
        prompt_ids: the prompt's token ids.
        new_ids: the generated ids (ending with the end-of-text id when the model emitted it).
        seconds: wall time of the decoding (prompt and new tokens; loading excluded).
        memory: the Gemini chunk manager's stats when offloaded (bytes per tier, bytes moved).
    """

    text: str
    new_text: str
    prompt_ids: list[int]
    new_ids: list[int]
    seconds: float
    memory: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return len(self.new_ids) / self.seconds if self.seconds > 0 else 0.0


def offload(model: nn.Module, accelerator_bytes: int) -> GeminiModule:
    """``model`` in Gemini chunks under ``accelerator_bytes`` for inference ([Note: offloaded
    inference]); call the returned module instead of ``model``."""
    # the smallest chunks Gemini allows (one largest parameter each), so the smallest budget fits
    largest = max(p.numel() for p in model.parameters())
    cfg = GeminiConfig(placement="static", accelerator_bytes=accelerator_bytes, chunk_numel=largest)
    return apply_gemini(model, cfg, group=None)


def _gemini_stats(call: nn.Module) -> dict[str, Any]:
    if not isinstance(call, GeminiModule):
        return {}
    stats = call.memory_stats()
    out: dict[str, Any] = {f"{n}_peak_bytes": t.peak_bytes for n, t in stats.tiers.items()}
    out["accelerator_emulated"] = stats.tiers["accelerator"].emulated
    out["bytes_moved"] = stats.bytes_moved
    return out


@torch.no_grad()
def generate_ids(
    decoder: Decoder,
    prompt_ids: list[int],
    sampling: SamplingConfig,
    *,
    eos_token_id: int | None = None,
) -> list[int]:
    """The ids ``decoder`` generates after ``prompt_ids`` (stopping after ``eos_token_id``)."""
    check_length(decoder, len(prompt_ids), sampling.max_new_tokens)
    generator = torch.Generator().manual_seed(sampling.seed)
    logits = decoder.start(prompt_ids)
    out: list[int] = []
    while True:
        token = next_token(logits, sampling, generator)
        out.append(token)
        if token == eos_token_id or len(out) == sampling.max_new_tokens:
            return out
        logits = decoder.step(token)


def build_decoder(
    loaded: Loaded,
    *,
    use_cache: bool = True,
    accelerator_budget: int | str | None = None,
    max_len: int = 1 << 30,
) -> tuple[Decoder, nn.Module]:
    """A decoder of ``loaded`` (offloaded under ``accelerator_budget``) and the module it
    calls (the ``GeminiModule`` when offloaded)."""
    call: nn.Module = loaded.model
    accelerator_bytes = parse_bytes(accelerator_budget)  # a bad size: an error before any work
    if accelerator_bytes is not None:
        call = offload(loaded.model, accelerator_bytes)
    if loaded.kind == "native":
        return NativeDecoder(call, loaded.model, use_cache=use_cache, budget=max_len), call
    return HFDecoder(call, loaded.model, use_cache=use_cache), call


def generate(
    checkpoint: str | Path | Loaded,
    prompt: str,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    use_cache: bool = True,
    accelerator_budget: int | str | None = None,
    adapter: str | Path | None = None,
) -> GenerationResult:
    """Continue ``prompt`` with the model of ``checkpoint`` (a run's ``--out``, a checkpoint
    folder, a Hugging Face folder, or what ``load_for_generation`` returned): greedy when
    ``temperature`` is 0, else sampled (``top_k``, ``top_p``) from a generator seeded with
    ``seed``. ``use_cache``: a key/value cache (GPT and PaLM: ``colossal_models.KVCache``;
    Hugging Face models: their own). ``accelerator_budget``: stream the weights through
    Gemini's chunks under that many bytes ([Note: offloaded inference]). ``adapter``: a PEFT
    adapter folder (a LoRA run's ``out/adapter``) merged into the model first."""
    sampling = SamplingConfig(max_new_tokens, temperature, top_k, top_p, seed)
    if isinstance(checkpoint, Loaded):
        loaded = checkpoint
    else:
        loaded = load_for_generation(checkpoint, adapter=adapter)
    prompt_ids = loaded.codec.encode(prompt)
    decoder, call = build_decoder(
        loaded,
        use_cache=use_cache,
        accelerator_budget=accelerator_budget,
        max_len=len(prompt_ids) + max_new_tokens,
    )
    t0 = time.perf_counter()
    new = generate_ids(decoder, prompt_ids, sampling, eos_token_id=loaded.eos_token_id)
    seconds = time.perf_counter() - t0
    new_text = loaded.codec.decode(new)
    return GenerationResult(
        text=loaded.codec.decode(prompt_ids + new),
        new_text=new_text,
        prompt_ids=prompt_ids,
        new_ids=new,
        seconds=seconds,
        memory=_gemini_stats(call),
    )
