"""LoRA through ``peft`` on 2 ranks equals plain ``peft`` with ``torch.optim.AdamW`` on one
process within 1e-6 (fp32, 5 steps): our GPT under Gemini (a budget that moves chunks), ZeRO-2
and the hybrid plugin with 1d tp2 (alone and with ZeRO-1), and a tiny Hugging Face GPT-2 under
Gemini, ZeRO-2 and the hybrid plugin with tp2 (ZeRO 0, 1, 2: trained as our GPT, adapters under
their Hugging Face names); GPT, PaLM and GPT-2 under tp2 with clipping within 1e-12 in float64.
Frozen base weights stay exactly as they were, get no gradient or optimizer state, and Gemini
never writes their chunks (its written-bytes counter reads 0); the tp checkpoints hold the
adapters and their Adam state only. One shared 2-rank world (checks in
``_checks_lora_two_ranks.py`` and ``_checks_lora_hf_tp.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("peft")
pytest.importorskip("transformers")

from _checks_lora_hf_tp import lora_hf_tp_case
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


HF_TP_CASES = [  # (id, ZeRO stage, dtype, clip): see _checks_lora_hf_tp for fp32's start
    ("gpt2-tp2", 0, "float32", False),
    ("gpt2-tp2-zero1", 1, "float32", False),
    ("gpt2-tp2-zero2", 2, "float32", False),
    ("gpt2-tp2-float64-clip", 0, "float64", True),
]


@pytest.mark.parametrize(
    ("zero", "dtype", "clip"), [c[1:] for c in HF_TP_CASES], ids=[c[0] for c in HF_TP_CASES]
)
def test_hf_gpt2_lora_on_tp2_equals_plain_peft(world, tmp_path, zero, dtype, clip):
    """A Hugging Face GPT-2's peft model under the hybrid plugin with tp2 (trained as our GPT)
    equals plain peft on the HF model with AdamW; its checkpoints hold the adapters under the
    Hugging Face peft names with their Adam moments, not the base, and resume exactly."""
    out = world(2).run(lora_hf_tp_case, str(tmp_path), zero, dtype, clip)
    tol = FLOAT64_TOL if dtype == "float64" else TOL
    for r in out:
        assert r["num_adapters"] == 16 and r["same_names"], r  # 2 blocks x 4 layers x (A, B)
        assert r["loss_err"] <= tol, r
        assert r["adapter_err"] <= tol, r
        assert r["saved_err"] <= (tol if dtype == "float32" else 1e-6), r  # saved in fp32
        assert r["frozen_omitted"] > 0 and r["frozen_state"] == 0, r
        assert r["moments"] == ["exp_avg", "exp_avg_sq", "param"], r
        assert r["resume_exact"] or dtype == "float64", r  # checkpoints hold fp32 values


@pytest.mark.parametrize("model", ["gpt", "hf"])
def test_lora_job_on_tp2_exports_the_unsharded_adapter(world, tmp_path, model):
    """``colossal train --tp 2 --lora-rank 4`` on our GPT and on a Hugging Face GPT-2
    (``--model hf:PATH``): the job equals plain peft, and its adapter folder (from the hybrid
    plugin's layout checkpoint, adapters only) holds the unsharded adapters under the peft
    names of the model trained (Hugging Face's for hf:), which ``PeftModel.from_pretrained``
    loads onto the base with the same logits; a resume from its step-3 checkpoint (the base
    rebuilt from its source) repeats the last two steps exactly; ``colossal generate`` on the
    run decodes the reference's greedy tokens."""
    from colossal_models import default_corpus_path

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes((default_corpus_path() / "textwrap.py").read_bytes())
    if model == "hf":
        import transformers

        transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=256, n_positions=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0,
        ).save_pretrained(tmp_path / "gpt2")  # fmt: skip
        model = f"hf:{tmp_path / 'gpt2'}"
    r = world(2).run(lora_job_tp2, str(tmp_path), str(corpus), model)[0]
    assert r["same_names"] and r["num_adapters"] == 16  # 2 blocks x 4 layers x (A, B)
    assert r["adapters_only"]  # the base is rebuilt from its source, not saved
    assert r["loss_err"] <= TOL, r
    assert r["adapter_err"] <= TOL, r
    assert r["logit_err"] <= 1e-5, r
    assert r["resume_exact"]  # the layout checkpoint of a tp LoRA run resumes bit for bit
    assert r["generate_same"]  # colossal generate on the run: the reference's greedy tokens


def test_lora_layouts_without_a_rule_are_one_line_errors(world):
    out = world(2).run(lora_refusals)[0]
    assert "blocks.0.attn.k is sharded as GatheredKV" in out["mqa-kv"]
    assert "leave it out of --lora-targets" in out["mqa-kv"]
    assert "does not build" in out["pp"] and "the nearest that builds: zero0" in out["pp"]
    assert all("\n" not in v for v in out.values())
