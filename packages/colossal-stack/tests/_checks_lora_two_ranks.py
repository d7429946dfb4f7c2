"""Rank-side checks of LoRA (``peft``) through the Booster on 2 ranks (run inside a
colossal_testing World): our GPT and a tiny Hugging Face GPT-2 under Gemini (a budget that moves
chunks), ZeRO-2 and the hybrid plugin with 1d tp2 (alone and with ZeRO-1), against plain
``peft`` with ``torch.optim.AdamW`` on one process over the global batches; and the
``colossal train --tp 2 --lora-rank`` job on our GPT and on ``hf:`` GPT-2.

Each rank compares what it holds: its losses (averaged over dp) and every adapter element it
holds against the reference's, placed by ``colossal.lora.lora_shard_maps`` (the boxes of the
unsharded adapters each tp shard holds, which the layout checkpoint writes by)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model

from colossal import Booster, GeminiPlugin, HybridParallelPlugin, LowLevelZeroPlugin
from colossal.booster import GeminiConfig, parse_bytes
from colossal.lora import lora_shard_maps
from colossal_models import GPT, GPTConfig, PaLM, PaLMConfig

STEPS, B, T, LR, CLIP = 5, 4, 16, 1e-3, 0.05
GEMINI_BUDGET = "384KiB"


def _gpt() -> torch.nn.Module:
    return GPT(GPTConfig(vocab_size=64, max_seq_len=T, num_layers=2, num_heads=2, hidden_size=32))


def _palm() -> torch.nn.Module:
    cfg = PaLMConfig(  # key/value heads split over tp2 like any column layer
        vocab_size=64, max_seq_len=T, num_layers=2, num_heads=2, num_kv_heads=2, hidden_size=32
    )
    return PaLM(cfg)


def _gpt2() -> torch.nn.Module:
    import transformers

    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=T, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg)


def _ours_loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return m(x, y)


def _hf_loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return m(input_ids=x, labels=x).loss  # GPT-2 shifts the labels itself


# name -> (build, peft target_modules, fan_in_fan_out, loss of (model, x, y))
MODELS = {
    "gpt": (_gpt, ["attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"], False, _ours_loss),
    "palm": (_palm, ["q", "k", "v", "attn.proj", "gate", "up", "mlp.proj"], False, _ours_loss),
    "gpt2": (_gpt2, ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"], True, _hf_loss),
}


def _lora_model(name: str, dtype: torch.dtype) -> torch.nn.Module:
    build, targets, fan_in_fan_out, _ = MODELS[name]
    torch.manual_seed(0)
    base = build().to(dtype)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0,
        fan_in_fan_out=fan_in_fan_out, init_lora_weights=False,  # B != 0: every factor moves
    )  # fmt: skip
    return get_peft_model(base, cfg)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(STEPS):
        d = torch.randint(0, 64, (B, T + 1), generator=g)
        out.append((d[:, :-1], d[:, 1:]))
    return out


def _plugin(kind: str, clip: float) -> object:
    """With ``clip`` (always active here) the norm must count a replicated adapter once and a
    split one over its shards."""
    if kind == "gemini":  # a budget below the chunks (504 KiB): chunks move every step
        config = GeminiConfig(placement="static", accelerator_bytes=parse_bytes(GEMINI_BUDGET))
        return GeminiPlugin(config=config, max_grad_norm=clip)
    if kind == "zero2":
        return LowLevelZeroPlugin(stage=2, max_grad_norm=clip)
    if kind == "tp2":
        return HybridParallelPlugin(tp_size=2, max_grad_norm=clip)
    if kind == "tp2-zero1":
        return HybridParallelPlugin(tp_size=2, zero_stage=1, max_grad_norm=clip)
    raise ValueError(kind)


def reference_losses(ref, batches, loss_of, *, clip: bool) -> list[float]:  # type: ignore[no-untyped-def]
    """Train ``ref`` (plain peft) on ``batches`` with torch AdamW, clipped at ``CLIP`` with
    ``clip`` (asserting the clip acts); its loss per step."""
    trainable = [p for p in ref.parameters() if p.requires_grad]
    ref_opt = torch.optim.AdamW(trainable, lr=LR)
    want = []
    for x, y in batches:
        loss = loss_of(ref, x, y)
        loss.backward()
        if clip:
            assert float(torch.nn.utils.clip_grad_norm_(trainable, CLIP)) > CLIP  # it acts
        ref_opt.step()
        ref_opt.zero_grad()
        want.append(loss.item())
    return want


def lora_case(name: str, kind: str, dtype: str = "float32", clip: bool = False) -> dict:
    """``STEPS`` Booster steps of LoRA on model ``name`` under plugin ``kind``; the worst loss
    and adapter error against plain peft + AdamW on one process (both clipped at ``CLIP`` with
    ``clip``), and what Gemini wrote. ``dtype="float64"`` (plain tp only: ZeRO and Gemini
    keep fp32) measures exactness."""
    loss_of = MODELS[name][3]
    ref = _lora_model(name, getattr(torch, dtype))
    model = copy.deepcopy(ref)
    batches = _batches()
    want = reference_losses(ref, batches, loss_of, clip=clip)

    plugin = _plugin(kind, CLIP if clip else 0.0)
    booster = Booster(plugin)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    model, opt = booster.boost(model, opt)
    mesh = getattr(plugin, "mesh", None)
    dp_group = mesh.group("dp") if mesh is not None else None
    dp = dist.get_world_size(dp_group)
    coord = dist.get_rank(dp_group)
    rows = slice(coord * B // dp, (coord + 1) * B // dp)
    got = []
    for x, y in batches:
        loss = loss_of(model, x[rows], y[rows])
        booster.backward(loss, opt)
        opt.step()
        opt.zero_grad()
        t = loss.detach().double().reshape(1)
        dist.all_reduce(t, group=dp_group)
        got.append(float(t) / dp)

    out: dict = {"loss_err": max(abs(a - b) for a, b in zip(got, want, strict=True))}
    ref_params = dict(ref.named_parameters())
    if kind == "gemini":
        held = model.full_state_dict()
        out["frozen_written"] = model.memory_stats().frozen_written_bytes
        out["moved"] = booster.memory_stats()["bytes_moved_total"]
        errs = {n: float((held[n] - p.detach()).abs().max()) for n, p in ref_params.items()}
    else:
        maps = lora_shard_maps(model, mesh) if kind.startswith("tp") else None
        errs = {}
        for n, p in model.named_parameters():
            full = ref_params[n].detach()
            if maps is None:
                errs[n] = float((p.detach() - full).abs().max())
                continue
            worst = 0.0
            for piece in maps[n].pieces:
                mine = piece.global_view(p.detach()[piece.local.slices()])
                box = piece.to_global(piece.local)
                worst = max(worst, float((mine - full[box.slices()]).abs().max()))
            errs[n] = worst
            if not p.requires_grad:
                assert p.grad is None, n
        out["frozen_state"] = _frozen_state(model, opt)
    adapters = [n for n in errs if "lora_" in n]
    out["num_adapters"] = len(adapters)
    out["adapter_err"] = max(errs[n] for n in adapters)
    out["base_err"] = max(errs[n] for n in errs if "lora_" not in n)
    booster.close()
    return out


def _frozen_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    """Frozen parameters that have a gradient or optimizer state (must be 0)."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    in_groups = {id(p) for g in opt.param_groups for p in g["params"]}
    state = getattr(opt, "state", {})
    return sum(p.grad is not None or id(p) in in_groups or p in state for p in frozen)


def lora_job_tp2(root: str, corpus: str, model: str = "gpt") -> dict:
    """``colossal train --tp 2 --lora-rank 4`` (hybrid plugin, ``model``: our GPT nano, or
    ``hf:PATH`` a Hugging Face GPT-2 the plugin trains as our GPT) for ``STEPS``
    steps, saving at step 3; on every rank, against plain peft + AdamW with the job's batches
    and schedule: the worst loss error, the worst adapter error in the exported folder
    (``out/adapter``), the worst logit error of ``PeftModel.from_pretrained(base,
    out/adapter)``; and whether a ``--resume`` from step 3 repeats the last steps' losses."""
    import json
    from pathlib import Path

    from peft import PeftModel
    from safetensors.torch import load_file

    from colossal import TrainConfig, train
    from colossal.train._data import open_data, open_loader, resolve_tokenizer
    from colossal.train._models import resolve_model
    from colossal.train._schedule import warmup_cosine

    out = Path(root) / "run"
    cfg = TrainConfig.from_flags(
        model=model, preset="nano", steps=STEPS, batch_size=2, seq_len=16, data=Path(corpus),
        out=out, lora_rank=4, lora_alpha=8.0, val_fraction=0.0, weight_decay=0.1, tp=2,
        checkpoint_every=3,
    )  # fmt: skip
    result = train(cfg)
    dist.barrier()
    if dist.get_rank() == 0:  # resume the layout checkpoint of step 3: adapters, Adam, base
        (out / "checkpoint" / "latest").write_text("step-3\n")
    dist.barrier()
    resumed = train(cfg.replace(resume=True, export="none"))
    tokenizer = resolve_tokenizer(cfg)
    loader = open_loader(cfg, open_data(cfg, tokenizer, rank=0))  # collective: every rank
    spec = resolve_model(model, "nano", vocab_size=tokenizer.vocab_size)
    hf = model.startswith("hf:")

    def base() -> torch.nn.Module:
        torch.manual_seed(cfg.training.seed)
        return spec.build()

    targets = MODELS["gpt2" if hf else "gpt"][1]
    lora = LoraConfig(r=4, lora_alpha=8.0, target_modules=targets)
    ref = base()
    if hf:  # peft wraps the Hugging Face model inside HFCausalLM, as the job does
        ref.hf = part = get_peft_model(ref.hf, lora)
    else:
        ref = part = get_peft_model(ref, lora)
    opt = torch.optim.AdamW(
        [p for p in ref.parameters() if p.requires_grad], lr=cfg.training.lr, betas=(0.9, 0.95),
        weight_decay=0.1,
    )  # fmt: skip
    want = []
    for step in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = cfg.training.lr * warmup_cosine(step, STEPS)
        x, y = loader.next_batch()
        loss = ref(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        want.append(loss.item())
    ref_dir = Path(root) / f"ref-adapter-{dist.get_rank()}"
    part.save_pretrained(str(ref_dir))
    ours = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    theirs = load_file(str(ref_dir / "adapter_model.safetensors"))
    x = torch.randint(0, tokenizer.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    loaded = PeftModel.from_pretrained(base().hf if hf else base(), str(out / "adapter")).eval()
    with torch.no_grad():
        mine = loaded(input_ids=x).logits if hf else loaded(x)
        logits = (mine - ref.eval()(x)).abs().max()
    index = json.loads((out / "checkpoint" / "step-3" / "layout_index.json").read_text())
    from colossal import generate  # the run's checkpoint: base from its source + adapters

    gen = generate(out, "def ", max_new_tokens=4)
    ids = list(gen.prompt_ids)
    with torch.no_grad():  # greedy on the reference
        for _ in range(4):
            ids.append(int(ref(torch.tensor([ids]))[0, -1].argmax()))
    return {
        "adapters_only": bool(index.get("frozen_omitted"))
        and all(".lora_" in n for n in index["params"]),
        "loss_err": max(abs(a - b) for a, b in zip(result.losses, want, strict=True)),
        "resume_exact": resumed.losses == result.losses[3:],
        "generate_same": len(gen.new_ids) > 0  # (it may stop at an end-of-text id)
        and list(gen.new_ids) == ids[len(gen.prompt_ids) :][: len(gen.new_ids)],
        "same_names": sorted(ours) == sorted(theirs),
        "num_adapters": len(ours),
        "adapter_err": max(float((ours[k] - theirs[k]).abs().max()) for k in theirs),
        "logit_err": float(logits),
    }


def lora_refusals() -> dict[str, str]:
    """The one-line errors of LoRA layouts the hybrid plugin does not build: PaLM's
    multi-query key/value projection (shared by both tp ranks) as a target, and a pipeline."""
    from colossal_contracts import ConfigError

    out = {}
    cases = {
        "mqa-kv": (lambda: PaLM(PaLMConfig(vocab_size=64, max_seq_len=T, num_layers=2,
                   num_heads=2, num_kv_heads=1, hidden_size=32)), ["q", "k"], {"tp_size": 2}),
        "pp": (_gpt, ["attn.qkv"], {"pp_size": 2, "microbatches": 2}),
    }  # fmt: skip
    for name, (build, targets, settings) in cases.items():
        torch.manual_seed(0)
        model = get_peft_model(build(), LoraConfig(r=4, target_modules=targets))
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
        plugin = HybridParallelPlugin(**settings)
        try:
            Booster(plugin).boost(model, opt)
            out[name] = "built"
        except ConfigError as err:
            out[name] = str(err)
        plugin.close()
    return out
