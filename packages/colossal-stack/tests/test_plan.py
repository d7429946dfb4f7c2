"""colossal.plan: known answers (Korthikanti et al. 2022, DeepSpeed's ZeRO-3 estimator), the
activation formula against colossal-memtrace's meta-device trace of a GPT block, the search, and
the CLI's one-line errors."""

import json

import pytest
import torch

import colossal_zero as cz
from colossal.cli import main
from colossal.plan import (
    HARDWARE,
    Layout,
    PlanRequest,
    device_memory,
    fewest_devices,
    layer_activation_bytes,
    model_shape,
    parse_bandwidth,
    parse_bytes,
    plan_layouts,
)
from colossal.plan._cost import dp_comm_bytes
from colossal.plan._memory import activation_bytes
from colossal_contracts import ConfigError

GiB = 2**30


def test_korthikanti_gpt3_175b():
    # Section 4 of the paper: GPT-3 175B has a=96, s=2048, h=12288, so 5as/h = 80; one layer
    # stores sbh(34 + 5as/h); tensor parallelism t=8 alone sbh(10 + 24/t + 5as/(ht)); with
    # sequence parallelism sbh/t(34 + 5as/h); with selective recomputation 34 sbh/t, "5x" less
    # than tensor parallelism alone (abstract: activation memory reduced by 5x).
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert 5 * a * s / h == 80
    kw = dict(seq=s, batch=b, hidden=h, heads=a)
    assert layer_activation_bytes(**kw) == sbh * 114
    assert layer_activation_bytes(**kw, tp=t) == sbh * (10 + 24 / 8 + 80 / 8)
    assert layer_activation_bytes(**kw, tp=t, megatron_sp=True) == sbh / 8 * 114
    sel = layer_activation_bytes(**kw, tp=t, megatron_sp=True, recompute="selective")
    assert sel == 34 * sbh / 8
    assert 5 <= layer_activation_bytes(**kw, tp=t) / sel < 6
    assert layer_activation_bytes(**kw, recompute="full") == 2 * sbh
    # 1F1B: the first stage holds p micro-batches of L/p layers = L layers' worth (Section 4.2.3);
    # the runtime's count (fused attention, no dropout: 28 sbh/t per layer and the two linear
    # inputs it saves whole, 4 sbh, see [Note: runtime activations]) plus the stage outputs and
    # one layer's backward working set (< 2%).
    shape = model_shape("gpt", "175b")
    lay = Layout(1, 8, 8, "1d-sp", 1, "ddp", 1, 16, "none")
    per = layer_activation_bytes(**kw, tp=t, megatron_sp=True, attention="fused", dropout=False)
    assert per == pytest.approx(28 * sbh / 8 + 4 * sbh, rel=0.01)
    assert activation_bytes(shape, lay, s)[0] == pytest.approx(96 * per, rel=0.02)


def test_zero_bytes_per_param():
    for n in (1, 2, 4, 64):
        assert sum(cz.model_state_bytes_per_param(0, n)) == 16
        assert sum(cz.model_state_bytes_per_param(1, n)) == pytest.approx(4 + 12 / n)
        assert sum(cz.model_state_bytes_per_param(2, n)) == pytest.approx(2 + 14 / n)
        assert sum(cz.model_state_bytes_per_param(3, n)) == pytest.approx(16 / n)


@pytest.mark.parametrize(
    "offload,published_gb", [("all", 0.25), ("optimizer", 5.43), ("none", 46.91)]
)
def test_deepspeed_zero3_estimates(offload, published_gb):
    # DeepSpeed's memory docs (estimate_zero3_model_states_mem_needs_all_cold) for
    # bigscience/T0_3B on 1 GPU: "2783M total params, 65M largest layer params", per-GPU column.
    # Its counts print truncated millions; DeepSpeed counts fp32 gradients (grad_bytes=4).
    got = cz.zero3_device_bytes(2783.5e6, 65.5e6, 1, offload=offload, grad_bytes=4) / GiB
    assert got == pytest.approx(published_gb, abs=0.02)


def test_activation_formula_vs_meta_trace():
    # One GPT block at a real small shape, bf16 with dropout, traced on the meta device through
    # colossal-memtrace with the fused (flash) attention a GPU uses, which saves no scores: the
    # paper's selective count 34 sbh. The trace's highest forward moment (inside mlp.proj) also
    # holds what the paper does not count as saved: the block output, the projection output
    # before dropout, attention's (B,H,T,D) output and its (B,T,C) copy (2 sbh each, 8 sbh), plus
    # LayerNorm statistics and the attention log-sum-exp (fp32 per row). Tolerance 1% for the
    # few bytes of kernel bookkeeping (random seeds).
    from colossal_memtrace import estimate_step
    from colossal_models import GPTConfig
    from colossal_models.gpt.model import Block

    s, b, h, a = 256, 2, 256, 4
    cfg = GPTConfig(
        vocab_size=256, max_seq_len=s, num_layers=1, num_heads=a, hidden_size=h, dropout=0.1
    )
    stats = estimate_step(
        lambda: Block(cfg).to(torch.bfloat16).train(),
        lambda d: (torch.randn(b, s, h, device=d, dtype=torch.bfloat16, requires_grad=True),),
        loss_fn=lambda o: o.float().sum(),
        target="cuda",
    )
    traced = max(m.non_model_peak["accelerator"] for m in stats.moments if m.phase == "forward")
    sbh = s * b * h
    formula = layer_activation_bytes(seq=s, batch=b, hidden=h, heads=a, recompute="selective")
    extras = 8 * sbh + 2 * 2 * s * b * 4 + b * a * s * 4
    assert traced == pytest.approx(formula + extras, rel=0.01)


def test_parsers():
    assert parse_bytes("80GiB") == 80 * GiB
    assert parse_bytes("1.5 TB") == 1.5e12
    assert parse_bandwidth("300GB/s") == 300e9
    with pytest.raises(ConfigError, match="not a size"):
        parse_bytes("eighty")
    with pytest.raises(ConfigError, match="not a bandwidth"):
        parse_bandwidth("300GB")


def test_plan_ranks_fitting_layouts_first_and_memory_shrinks_with_zero():
    shape = model_shape("gpt", "xl")
    req = PlanRequest(shape, HARDWARE["rtx3090-24g"], 4, 8, 1024, precision="fp32")
    plans = plan_layouts(req)  # fp32: plain data parallelism builds in fp32 only
    fits = [p.fits for p in plans]
    assert fits[0] and fits == sorted(fits, reverse=True)
    steps = [p.cost.step for p in plans if p.fits]
    assert steps == sorted(steps)
    same = [p for p in plans if p.layout.dp == 4]  # 2 samples per rank, one micro-batch
    by = {p.layout.method: p.memory for p in same if p.layout.recompute == "none"}
    assert by["ddp"].device_total > by["zero1"].device_total > by["zero2"].device_total
    assert by["gemini-host-all"].host > 0 and by["gemini-host-all"].params == 0


def test_fewest_devices_for_175b_is_monotone_in_memory():
    shape = model_shape("gpt", "175b")
    req = PlanRequest(shape, HARDWARE["a100-80g"], 1, 64, 2048)
    megatron = lambda lay: lay.tp_mode in ("1d", "1d-sp") and lay.method == "ddp"  # noqa: E731
    # Megatron's bf16 without ZeRO is a peer's layout (Colossal builds plain dp in fp32 only)
    peer = PlanRequest(**{**req.__dict__, "only": megatron, "buildable": False})
    n_mega, p = fewest_devices(peer, (32, 48, 64))
    assert p.fits and 175e9 * 16 / n_mega < 80 * GiB  # model states alone need > 32 devices
    n_any, _ = fewest_devices(req, (8, 16, 32, 48, 64))
    # buildable layouts only: no gradient accumulation without pipeline stages, so Gemini's
    # ZeRO-3 cannot shrink its micro-batch and does not beat Megatron's count here
    assert n_any <= n_mega


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--hardware", "tpu"], "unknown --hardware 'tpu'"),
        (["--preset", "huge"], "unknown GPT preset 'huge'"),
        (["--model", "gpt2"], "unknown --model"),
        (["--model", "hf:/no/such/model"], "no config.json there"),
        (["--precision", "fp8"], "--precision must be one of"),
        (["--interconnect", "intra=fast"], "not a bandwidth"),
        (["--device-memory", "lots"], "not a size"),
        (
            ["--preset", "175b", "--devices", "8", "--global-batch", "8", "--seq-len", "2048"],
            "nearest: dp",
        ),
    ],
)
def test_plan_cli_bad_input_is_one_line(argv, message, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


def test_plan_cli_json_and_png(capsys, tmp_path):
    png = tmp_path / "m.png"
    argv = ["plan", "--preset", "medium", "--hardware", "rtx3090-24g", "--devices", "2"]
    assert main([*argv, "--global-batch", "4", "--json", "--top", "3", "--png", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["plans"]) == 3 and out["plans"][0]["fits"] and png.stat().st_size > 0
    assert out["fewest_devices"] in (1, 2)
    first = out["plans"][0]
    mem = first["memory_bytes"]
    held = max(mem["activations"], mem["overlap"] + mem["transient"])
    kinds = ("params", "grads", "optimizer", "buffers")
    assert mem["device_total"] == pytest.approx(sum(mem[k] for k in kinds) + held)
    lay = Layout(**{k: first[k] for k in Layout.__dataclass_fields__})
    shape = model_shape("gpt", "medium")
    assert device_memory(shape, lay, 1024).device_total == pytest.approx(mem["device_total"])


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_model_states_match_measured(world, stage):
    # Validation at small scale: 2 gloo ranks, micro GPT, bf16 ZeRO; the planner's parameters +
    # gradients + optimizer states per rank against the storages the optimizer holds (1% for
    # bucket padding), and its data-parallel bytes against the counted bytes of the step (1%).
    import _checks_plan as checks

    results = world(2).run(checks.zero_state_bytes, stage)
    shape = model_shape("gpt", "micro")
    lay = Layout(2, 1, 1, "1d", 1, f"zero{stage}", 1, 1, "none")
    mem = device_memory(shape, lay, 32)
    for params, measured, counted in results:
        assert params == shape.params
        assert measured == pytest.approx(mem.params + mem.grads + mem.optimizer, rel=0.01)
        assert counted == pytest.approx(dp_comm_bytes(shape, lay), rel=0.01)


def test_pipeline_p2p_bytes_match_counted(world):
    # Validation: the planner's pipeline messages (colossal_parallel.pipeline_p2p_bytes) against
    # the bytes run_pipeline counts sending in one 1F1B step on 2 gloo ranks, exactly.
    import _checks_plan as checks

    from colossal_parallel.pipeline import pipeline_p2p_bytes

    m, batch, width = 4, 8, 16
    for stage, sent in world(2).run(checks.pipeline_sent_bytes, m, batch, width):
        assert sent == pipeline_p2p_bytes(stage, 2, m, batch // m * width, elem_bytes=4) > 0


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tp1d_block_bytes_match_counted(world, sequence_parallel):
    # Validation: the planner's Megatron block bytes (colossal_parallel.tp1d.block_comm_bytes_1d)
    # against the bytes counted by one fp32 GPT block sharded over 2 gloo ranks, exactly.
    import _checks_plan as checks

    from colossal_parallel.tp1d import block_comm_bytes_1d

    batch, seq, hidden = 2, 16, 128  # micro preset: hidden 128
    want = sum(
        block_comm_bytes_1d(
            batch * seq, hidden, 2, sequence_parallel=sequence_parallel, dtype_bytes=4
        )
    )
    for counted in world(2).run(checks.tp1d_block_bytes, sequence_parallel, batch, seq):
        assert counted == want


def test_cost_model_bubble_and_mfu_bounds():
    # The step is (m + p - 1) micro-batch slots: the bubble is colossal-parallel's (p-1)/(m+p-1),
    # and MFU never exceeds the kernel efficiency it assumes.
    from colossal.plan import step_cost

    shape, hw = model_shape("gpt", "2.7b"), HARDWARE["a100-80g"]
    for pp, m in ((1, 8), (4, 4), (4, 16), (8, 8)):
        lay = Layout(1, pp, 1, "1d", 1, "ddp", 1, m, "none")
        cost = step_cost(shape, lay, device_memory(shape, lay, 2048), hw, 2048, efficiency=0.5)
        assert cost.bubble == pytest.approx((pp - 1) / (m + pp - 1))
        assert cost.mfu <= 0.5 + 1e-9
        assert cost.step >= cost.compute


def test_gemini_model_states_match_measured():
    # Validation: Gemini (one process, bf16, micro GPT): the planner counts the runtime's whole
    # chunks ([Note: gemini chunks]: 14 bytes per padded element, the gradients in the
    # parameters' chunk slots), which is exactly what its tiers hold.
    import _checks_plan as checks

    params, measured = checks.gemini_state_bytes()
    shape = model_shape("gpt", "micro")
    assert params == shape.params
    mem = device_memory(shape, Layout(1, 1, 1, "1d", 1, "gemini", 1, 1, "none"), 32)
    predicted = mem.params + mem.grads + mem.optimizer
    assert predicted == measured
    assert predicted > 14 * params  # padding counts


def test_tp2d_block_bytes_match_counted(world):
    # Validation: the planner's 2D block bytes (colossal-parallel's linear/layernorm formulas for
    # qkv, proj, fc, fc2 and two LayerNorms) against one fp32 GPT block on a 2x2 grid, exactly.
    import _checks_plan as checks

    from colossal.plan._cost import tp_block_bytes

    lay = Layout(1, 1, 4, "2d", 1, "ddp", 4, 1, "none")
    want = tp_block_bytes(model_shape("gpt", "micro"), lay, 4 * 16, dtype_bytes=4)
    assert world(4).run(checks.tp_block_bytes, "2d", 4, 16) == [want] * 4
