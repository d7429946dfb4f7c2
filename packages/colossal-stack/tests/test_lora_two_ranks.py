"""LoRA through ``peft`` on 2 ranks equals plain ``peft`` with ``torch.optim.AdamW`` on one
process within 1e-6 (fp32, 5 steps): our GPT under Gemini (a budget that moves chunks), ZeRO-2
and the hybrid plugin with 1d tp2 (alone and with ZeRO-1), and a tiny Hugging Face GPT-2 under
Gemini and ZeRO-2; GPT and PaLM under tp2 with clipping within 1e-12 in float64. Frozen base weights stay exactly as they were, get no
gradient or optimizer state, and Gemini never writes their chunks (its written-bytes counter
reads 0). One shared 2-rank world (checks in ``_checks_lora_two_ranks.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("peft")
pytest.importorskip("transformers")

from _checks_lora_two_ranks import lora_case, lora_job_tp2, lora_refusals

TOL = 1e-6
FLOAT64_TOL = 1e-12
# (id, model, plugin, dtype, clip at 0.05). fp32 with clipping under tp ends 1.3e-6 from the
# reference on one adapter element (rounding of the tp partial sums, amplified by AdamW: the
# hybrid plugin's [Note: hybrid tolerances]); the same runs in float64 agree within 5e-15, so
# tp's clipping (the norm over split and replicated adapters) is checked there.
CASES = [
    ("gpt-gemini", "gpt", "gemini", "float32", True),
    ("gpt-zero2", "gpt", "zero2", "float32", True),
    ("gpt-tp2", "gpt", "tp2", "float32", False),
    ("gpt-tp2-zero1", "gpt", "tp2-zero1", "float32", False),
    ("gpt-tp2-float64-clip", "gpt", "tp2", "float64", True),
    ("palm-tp2-float64-clip", "palm", "tp2", "float64", True),
    ("gpt2-gemini", "gpt2", "gemini", "float32", True),
    ("gpt2-zero2", "gpt2", "zero2", "float32", True),
]


@pytest.mark.parametrize(
    ("name", "kind", "dtype", "clip"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_lora_on_two_ranks_equals_plain_peft(world, name, kind, dtype, clip):
    out = world(2).run(lora_case, name, kind, dtype, clip)
    tol = FLOAT64_TOL if dtype == "float64" else TOL
    for r in out:
        assert r["num_adapters"] > 0
        assert r["loss_err"] <= tol, r
        assert r["adapter_err"] <= tol, r
        assert r["base_err"] == 0.0, r  # frozen: never updated
        if kind == "gemini":
            assert r["moved"] > 0  # the budget moved chunks
            assert r["frozen_written"] == 0  # frozen chunks: read, never written back
        else:
            assert r["frozen_state"] == 0  # no gradient, no optimizer state for the base


def test_lora_job_on_tp2_exports_the_unsharded_adapter(world, tmp_path):
    """``colossal train --tp 2 --lora-rank 4``: the job equals plain peft, and its adapter
    folder (from the hybrid plugin's layout checkpoint) holds the unsharded adapters, which
    ``PeftModel.from_pretrained`` loads onto the base with the same logits; a resume from its
    step-3 checkpoint repeats the last two steps exactly."""
    from colossal_models import default_corpus_path

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes((default_corpus_path() / "textwrap.py").read_bytes())
    r = world(2).run(lora_job_tp2, str(tmp_path), str(corpus))[0]
    assert r["same_names"] and r["num_adapters"] == 16  # 2 blocks x 4 layers x (A, B)
    assert r["loss_err"] <= TOL, r
    assert r["adapter_err"] <= TOL, r
    assert r["logit_err"] <= 1e-5, r
    assert r["resume_exact"]  # the layout checkpoint of a tp LoRA run resumes bit for bit


def test_lora_layouts_without_a_rule_are_one_line_errors(world):
    out = world(2).run(lora_refusals)[0]
    assert "blocks.0.attn.k is sharded as GatheredKV" in out["mqa-kv"]
    assert "leave it out of --lora-targets" in out["mqa-kv"]
    assert "does not build" in out["pp"] and "the nearest that builds: zero0" in out["pp"]
    assert all("\n" not in v for v in out.values())
