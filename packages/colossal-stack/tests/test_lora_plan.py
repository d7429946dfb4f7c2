"""``colossal plan --lora-rank``: the adapters counted on the model as peft builds them, the
frozen base at compute-precision bytes only, the trainable rest at ZeRO's 16 bytes."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model

from colossal.cli import main
from colossal.lora import LoraSpec
from colossal.plan import Layout, device_memory, lora_params, lora_shape, model_shape
from colossal.plan._gemini import gemini_bytes
from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig


@pytest.mark.parametrize(
    "model,targets",
    [
        (lambda: GPT(GPTConfig.preset("nano")), ("attn", "mlp")),
        (lambda: PaLM(PaLMConfig.preset("nano")), ("attn",)),
        (lambda: PaLM(PaLMConfig.preset("nano")), ("mlp.up", "gate")),
    ],
    ids=["gpt-attn-mlp", "palm-attn", "palm-names"],
)
def test_adapter_count_is_peft_s(model, targets):
    spec = LoraSpec(rank=4, targets=targets)
    want = lora_params(model(), spec, label="m")
    from colossal.lora import lora_layers

    base = model()
    names = lora_layers(base, spec, label="m")
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=names))
    assert want == sum(p.numel() for p in peft_model.parameters() if p.requires_grad) > 0


def _layout(method: str) -> Layout:
    return Layout(
        dp=1, pp=1, tp=1, tp_mode="1d", sp=1, method=method, micro_batch=1, num_micro=1,
        recompute="none",
    )  # fmt: skip


@pytest.mark.parametrize("method", ["zero2", "gemini", "ddp"])
def test_frozen_cost_compute_bytes_only(method):
    full = model_shape("gpt", "small")
    lora = lora_shape(full, "gpt", "small", LoraSpec(rank=8))
    trainable = lora.trainable
    assert lora.frozen == full.params and 0 < trainable < full.params / 50
    mem = device_memory(lora, _layout(method), 128, precision="bf16")
    ref = device_memory(full, _layout(method), 128, precision="bf16")
    states = mem.params + mem.grads + mem.optimizer - mem.frozen
    if method == "gemini":  # whole chunks ([Note: gemini chunks]): bf16 values of the frozen
        gem = gemini_bytes(lora, _layout(method), "bf16", mem.activations)  # ones, 14 bytes
        assert mem.frozen == 2 * gem.frozen_chunk_numel * gem.frozen_chunks >= 2 * full.params
        trained = gem.num_chunks - gem.frozen_chunks
        assert states == 14 * gem.chunk_numel * trained >= 14 * trainable
        return
    assert mem.frozen == pytest.approx(2 * full.params)  # bf16 weights, nothing else
    ref_states = ref.params + ref.grads + ref.optimizer  # ZeRO's 16 bytes
    assert states == pytest.approx(ref_states * trainable / full.params)


def test_plan_cli_lora_json(capsys):
    argv = ["plan", "--preset", "small", "--devices", "2", "--json", "--top", "50"]
    assert main([*argv, "--lora-rank", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    shape = lora_shape(model_shape("gpt", "small"), "gpt", "small", LoraSpec(rank=8))
    assert out["frozen_params"] == shape.frozen and out["trainable_params"] == shape.trainable
    assert all(" tp" not in p["layout"] and " pp" not in p["layout"] for p in out["plans"])
    assert main(argv) == 0
    full = json.loads(capsys.readouterr().out)
    best = {p["layout"]: p["memory_bytes"]["device_total"] for p in full["plans"]}
    for p in out["plans"]:  # where the device holds model states, LoRA's hold less
        if p["layout"] in best and "gemini-" not in p["layout"]:
            assert p["memory_bytes"]["device_total"] < best[p["layout"]]


def test_plan_lora_bad_target(capsys):
    assert main(["plan", "--preset", "nano", "--lora-rank", "4", "--lora-targets", "wq"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "matches no linear layer" in err and "\n" not in err


def test_groups_resolve_on_llama():
    """attn and mlp on a Hugging Face Llama (built on meta): its seven projections."""
    import transformers

    from colossal.lora import resolve_targets

    cfg = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=64,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    attn = resolve_targets(model, ("attn",), label="llama")
    mlp = resolve_targets(model, ("mlp",), label="llama")
    assert [n.split(".")[-1] for n in attn] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert [n.split(".")[-1] for n in mlp] == ["gate_proj", "up_proj", "down_proj"]


def _measured_flops(build, seq: int) -> float:  # type: ignore[no-untyped-def]
    """FLOPs of one forward + backward of ``build()`` on ``seq`` tokens, counted by torch's
    FlopCounterMode on the meta device (every GEMM the autograd graph runs)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = build()
    x = torch.randint(0, 256, (1, seq), device="meta")
    with FlopCounterMode(display=False) as counter:
        model(x, x).backward()
    return float(counter.get_total_flops())


def test_frozen_backward_flops_match_torch_count():
    """A frozen Linear's backward runs the input-gradient GEMM only: the planner's FLOPs of a
    LoRA step (the base frozen) and of a full step both match torch's count of the GEMMs
    autograd runs, and so does their ratio (about 2/3, not the 1.01 of counting every weight
    as trainable); the step time's compute term follows the FLOPs, with full recomputation
    adding one forward."""
    from colossal.plan import HARDWARE, step_cost

    seq, cfg = 64, GPTConfig.preset("small")
    targets = ["attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"]
    full_n = _measured_flops(lambda: GPT(cfg), seq)
    lora_n = _measured_flops(
        lambda: get_peft_model(GPT(cfg), LoraConfig(r=8, target_modules=targets)), seq
    )
    full = model_shape("gpt", "small")
    lora = lora_shape(full, "gpt", "small", LoraSpec(rank=8))
    assert lora.flops_per_token(seq) * seq == pytest.approx(lora_n, rel=0.03)
    assert full.flops_per_token(seq) * seq == pytest.approx(full_n, rel=0.03)
    ratio = lora.flops_per_token(seq) / full.flops_per_token(seq)
    assert ratio == pytest.approx(lora_n / full_n, rel=0.02) and ratio < 0.7
    hw = HARDWARE["a100-80g"]
    for recompute in ("none", "full"):
        lay = Layout(1, 1, 1, "1d", 1, "gemini", 1, 1, recompute)
        a = step_cost(lora, lay, device_memory(lora, lay, seq), hw, seq)
        b = step_cost(full, lay, device_memory(full, lay, seq), hw, seq)
        extra = (lambda s: s.forward_flops_per_token(seq)) if recompute == "full" else None
        want = (lora.flops_per_token(seq) + (extra(lora) if extra else 0)) / (
            full.flops_per_token(seq) + (extra(full) if extra else 0)
        )
        assert a.compute / b.compute == pytest.approx(want, rel=1e-9)
    assert full.forward_flops_per_token(seq) / full.flops_per_token(seq) == pytest.approx(1 / 3)
