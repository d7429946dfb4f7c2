"""Generation throughput: tokens/s of greedy decoding with the key/value cache against
recomputing the whole sequence for every token (GPT-tiny, PaLM-tiny and a Hugging Face GPT-2 of
GPT-tiny's shape, 256 new tokens), and offloaded generation: a GPT four times the accelerator
budget, its weights streamed through Gemini's chunks for every forward, against the same model
held in memory.

Each model is built with random weights (seed 0); a prompt of 32 byte tokens; greedy, so both
ways must give the same tokens (checked). Aims (issue 31): the cache at least 5x faster at 256
new tokens on GPT-tiny; offloaded generation of a model 4x the budget runs, with the
accelerator's peak within the budget.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
import transformers

from colossal.inference import Loaded, TextCodec, build_decoder, generate_ids
from colossal.inference._generate import _gemini_stats
from colossal.inference._sampling import SamplingConfig
from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig
from colossal_models.hf import GPT2StateDictAdapter

from _report import Report, load_note

MiB = 2**20
_COLUMNS = [
    "model",
    "params",
    "way",
    "new_tokens",
    "seconds",
    "tokens_per_s",
    "speedup",
    "same_tokens",
    "budget_MiB",
    "model_MiB",
    "accel_peak_MiB",
    "moved_MiB",
]
PROMPT = "def generate(model, prompt):\n    "  # 32 bytes


def _models(quick: bool) -> dict[str, Loaded]:
    torch.manual_seed(0)
    # GPT-tiny and PaLM-tiny with a 512-position table, so 32 + 256 positions fit
    gpt_cfg = GPTConfig.preset("tiny", max_seq_len=512)
    gpt = GPT(gpt_cfg).eval()
    palm = PaLM(PaLMConfig.preset("tiny", max_seq_len=512)).eval()
    hf_cfg = GPT2StateDictAdapter(gpt_cfg).config_to_hf()
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    out = {
        "gpt-tiny": Loaded(gpt, "native", TextCodec(), None, "gpt-tiny"),
        "palm-tiny": Loaded(palm, "native", TextCodec(), None, "palm-tiny"),
        "hf-gpt2 (tiny shape)": Loaded(hf, "hf", TextCodec(), None, "hf"),
    }
    return {"gpt-tiny": out["gpt-tiny"]} if quick else out


def _run(loaded: Loaded, new: int, **kw) -> tuple[list[int], float, dict]:
    import time

    ids = TextCodec().encode(PROMPT)
    decoder, call = build_decoder(loaded, max_len=len(ids) + new, **kw)
    t0 = time.perf_counter()
    out = generate_ids(decoder, ids, SamplingConfig(max_new_tokens=new))
    return out, time.perf_counter() - t0, _gemini_stats(call)


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _cache_rows(quick: bool) -> tuple[list[dict], dict]:
    new = 64 if quick else 256
    rows, summary = [], {}
    for name, loaded in _models(quick).items():
        with torch.no_grad():
            fast, t_fast, _ = _run(loaded, new, use_cache=True)
            slow, t_slow, _ = _run(loaded, new, use_cache=False)
        speed = t_slow / t_fast
        base = {"model": name, "params": _params(loaded.model), "new_tokens": new}
        rows.append({**base, "way": "no cache", "seconds": t_slow, "tokens_per_s": new / t_slow})
        rows.append(
            {
                **base,
                "way": "KV cache",
                "seconds": t_fast,
                "tokens_per_s": new / t_fast,
                "speedup": speed,
                "same_tokens": fast == slow,
            }
        )
        summary[f"{name}: KV cache speedup at {new} new tokens"] = round(speed, 2)
    return rows, summary


def _offload_rows(quick: bool) -> tuple[list[dict], dict]:
    new = 8 if quick else 32
    torch.manual_seed(0)
    # deep and narrow in quick mode, so the largest chunk (with the gradient chunk Gemini
    # counts) fits a quarter of the weights
    cfg = GPTConfig.preset("micro", num_layers=8) if quick else GPTConfig.preset("mini")
    model_bytes = cfg.num_params() * 4
    budget = model_bytes // 4

    def fresh() -> Loaded:
        torch.manual_seed(0)
        return Loaded(GPT(cfg).eval(), "native", TextCodec(), None, "gpt")

    rows = []
    label = "gpt-micro x8 layers" if quick else "gpt-mini"
    with torch.no_grad():
        ref, t_ref, _ = _run(fresh(), new, use_cache=True)
        got, t_off, stats = _run(fresh(), new, use_cache=True, accelerator_budget=budget)
    base = {"model": label, "params": cfg.num_params(), "new_tokens": new}
    base["model_MiB"] = model_bytes / MiB
    rows.append({**base, "way": "in memory", "seconds": t_ref, "tokens_per_s": new / t_ref})
    peak = stats["accelerator_peak_bytes"]
    rows.append(
        {
            **base,
            "way": "offloaded (Gemini chunks)",
            "seconds": t_off,
            "tokens_per_s": new / t_off,
            "same_tokens": got == ref,
            "budget_MiB": budget / MiB,
            "accel_peak_MiB": peak / MiB,
            "moved_MiB": stats["bytes_moved"] / MiB,
        }
    )
    summary = {
        "offloaded: model / budget": round(model_bytes / budget, 2),
        "offloaded: accelerator peak within budget": peak <= budget,
        "offloaded: same tokens as in memory": got == ref,
        "offloaded: accelerator emulated": stats["accelerator_emulated"],
    }
    return rows, summary


def run(*, quick: bool = False, out_dir: Path) -> Report:
    before = os.getloadavg()[0]
    torch.set_num_threads(1)  # tiny operators: threads only add synchronisation
    rows, summary = _cache_rows(quick)
    off_rows, off_summary = _offload_rows(quick)
    gpt_speed = next(v for k, v in summary.items() if k.startswith("gpt-tiny"))
    summary["aim: KV cache >= 5x on GPT-tiny"] = gpt_speed >= 5
    report = Report(
        name="generate",
        title="Generation: KV cache against recomputation, and offloaded generation",
        columns=_COLUMNS,
        rows=rows + off_rows,
        summary={**summary, **off_summary},
        notes=[
            "Greedy decoding of a 32-byte prompt; random weights (seed 0); batch 1; fp32. "
            "GPT-tiny and PaLM-tiny use a 512-position table so 32 + 256 positions fit (their "
            "presets have 256). Without a cache every step runs the whole sequence so far.",
            "The Hugging Face row uses GPT-2's own cache (past_key_values / cache).",
            "Offloaded: colossal.inference.offload puts the weights into Gemini chunks (one "
            "largest parameter per chunk, placement static) under an accelerator budget of a "
            "quarter of the fp32 weights; every forward streams the chunks in. On a machine "
            "without a GPU the accelerator is emulated: its capacity is enforced by the chunk "
            "manager, compute stays on the CPU, so the 'moved' bytes are host copies.",
            f"torch threads: {torch.get_num_threads()}. " + load_note(before),
        ],
    )
    return dataclasses.replace(report)
