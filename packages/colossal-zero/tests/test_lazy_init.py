"""Lazy initialization: models built inside LazyInit hold no memory, materialize bit for bit as
eager construction under the same seed (GPT, PaLM, a Hugging Face GPT-2 from a config), leave the
random generator where eager construction leaves it, and train under Gemini exactly as the eager
model does."""

import weakref

import pytest
import torch
from _zero_model import adamw_losses

from colossal_contracts import ConfigError, TierName
from colossal_zero import GeminiConfig, GeminiOptimizer, LazyInit, apply_gemini


def _gpt():
    # colossal-zero does not depend on colossal-models: alone, these cases skip
    models = pytest.importorskip("colossal_models")
    GPT, GPTConfig = models.GPT, models.GPTConfig
    return GPT(GPTConfig(vocab_size=256, max_seq_len=32, num_layers=2, num_heads=2, hidden_size=64))


def _palm():
    models = pytest.importorskip("colossal_models")
    PaLM, PaLMConfig = models.PaLM, models.PaLMConfig

    return PaLM(PaLMConfig.preset("nano"))


def _gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg)


@pytest.mark.parametrize("build", [_gpt, _palm, _gpt2], ids=["gpt", "palm", "hf-gpt2"])
def test_lazy_init_equals_eager_bit_for_bit(build):
    torch.manual_seed(0)
    eager = build()
    rng_after = torch.get_rng_state()
    torch.manual_seed(0)
    with LazyInit() as lazy:
        model = build()
    assert torch.equal(torch.get_rng_state(), rng_after)  # later randomness is unchanged too
    want = eager.state_dict()
    got = model.state_dict(keep_vars=True)
    assert got.keys() == want.keys()
    for name, t in got.items():
        assert t.is_meta, name
        value = lazy.materialize(t)
        assert value.dtype == want[name].dtype and torch.equal(value, want[name]), name


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gemini_from_lazy_init_trains_like_eager(precision):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (2, 2, 32), generator=g)
    runs = []
    for lazy_mode in (False, True):
        torch.manual_seed(0)
        model, lazy = _built(_gpt, lazy_mode)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        gm = apply_gemini(
            model, GeminiConfig(precision=precision, device="cpu"), group=None, lazy=lazy
        )
        gopt = GeminiOptimizer.from_torch(gm, opt)
        losses = []
        for _ in range(3):
            loss = gm(x, y)
            gopt.backward(loss)
            gopt.step()
            gopt.zero_grad()
            losses.append(loss.item())
        runs.append((losses, gm.full_state_dict()))
    (a, sa), (b, sb) = runs
    assert a == b
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_meta_model_without_its_lazy_context_is_a_config_error():
    with torch.device("meta"):
        model = _gpt()
    with pytest.raises(ConfigError, match="lazy_init"):
        apply_gemini(model, GeminiConfig(device="cpu"), group=None)


def _disk_config(tmp_path, precision: str, chunk: int) -> GeminiConfig:
    # host room for two fp32 chunks: most chunks, and most states, live on the disk tier
    return GeminiConfig(
        precision=precision, device="cpu", chunk_numel=chunk, accelerator_bytes=6 * chunk * 4,
        host_bytes=2 * chunk * 4, disk_bytes=None, disk_dir=tmp_path,
    )  # fmt: skip


def _built(factory, lazy_mode):
    """``factory()``'s model, and the ``LazyInit`` it was built under when ``lazy_mode``."""
    if not lazy_mode:
        return factory(), None
    with LazyInit() as lazy:
        return factory(), lazy


def _deeper_gpt():
    models = pytest.importorskip("colossal_models")
    GPT, GPTConfig = models.GPT, models.GPTConfig
    return GPT(GPTConfig(vocab_size=256, max_seq_len=32, num_layers=4, num_heads=2, hidden_size=64))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_lazy_setup_holds_at_most_one_chunk_of_materialized_values(tmp_path, precision):
    """Every value lazy init materializes is counted while it is alive: at no moment of setup
    do they add up to more than one fp32 chunk (the model is seven), and the tiers stay within
    their budgets, so host memory beyond the budgets is one chunk's worth."""
    chunk = 32768
    torch.manual_seed(0)
    with LazyInit() as lazy:
        model = _deeper_gpt()
    live: dict[int, int] = {}  # serial -> bytes of a materialized value still alive
    peak, serial = [0], [0]
    materialize = lazy.materialize

    def counted(t: torch.Tensor) -> torch.Tensor:
        out = materialize(t)
        serial[0] += 1
        live[serial[0]] = out.untyped_storage().nbytes()
        weakref.finalize(out, live.pop, serial[0], None)
        peak[0] = max(peak[0], sum(live.values()))
        return out

    lazy.materialize = counted  # type: ignore[method-assign]
    config = _disk_config(tmp_path, precision, chunk)
    gm = apply_gemini(model, config, group=None, lazy=lazy)
    manager = gm.runtime.manager
    total = sum(p.numel() for p in model.parameters()) * 4
    assert len(manager.registry.param_chunks()) >= 6 and total > 5 * chunk * 4
    assert serial[0] >= len(list(model.parameters()))  # every value came through the counter
    assert 0 < peak[0] <= chunk * 4, (peak[0], chunk * 4)
    assert not live  # nothing materialized outlives setup
    tiers = manager.books.tiers
    assert tiers[TierName.HOST].peak_bytes <= config.host_bytes
    assert tiers[TierName.ACCELERATOR].peak_bytes == 0
    assert tiers[TierName.DISK].used_bytes > 0
    manager.close()


def test_lazy_init_on_the_disk_tier_trains_like_eager_and_adamw(tmp_path):
    """Lazy and eager builds under host and accelerator budgets that spill most chunks and
    states to disk train bit-identically (clipping on: the norm streams the gradients on disk
    through memory), and match plain AdamW with the same clipping within 1e-5."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (2, 2, 32), generator=g)
    torch.manual_seed(0)
    plain = _deeper_gpt()
    ref_losses = adamw_losses(plain, x, y, 3, lr=1e-3, clip=0.5)
    runs = []
    for lazy_mode in (False, True):
        torch.manual_seed(0)
        model, lazy = _built(_deeper_gpt, lazy_mode)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        config = _disk_config(tmp_path / str(lazy_mode), "fp32", 32768)
        gm = apply_gemini(model, config, group=None, lazy=lazy)
        gopt = GeminiOptimizer.from_torch(gm, opt, max_grad_norm=0.5)
        losses = []
        for _ in range(3):
            loss = gm(x, y)
            gopt.backward(loss)
            gopt.step()
            gopt.zero_grad()
            losses.append(loss.item())
        assert gm.memory_stats().tiers["disk"].peak_bytes > 0
        runs.append((losses, gm.full_state_dict()))
        gm.runtime.manager.close()
    (a, sa), (b, sb) = runs
    assert a == b
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert max(abs(u - v) for u, v in zip(a, ref_losses, strict=True)) < 1e-5
    want = dict(plain.named_parameters())
    worst = max((sa[k] - want[k].detach()).abs().max().item() for k in want)
    assert worst < 1e-5, worst


def test_an_assigned_tensor_is_read_from_its_source_alone():
    """``assign``: the value comes from the source (converted to the tensor's dtype), no
    initialization is replayed and the generator is not touched; a view, or a source of another
    shape, is refused naming it."""
    saved = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    calls = []
    with LazyInit() as lazy:
        layer = torch.nn.Linear(4, 3)
        view = torch.empty(8)[2:6]
    lazy.assign(layer.weight, lambda: calls.append(1) or saved)
    before = torch.get_rng_state()
    got = lazy.materialize(layer.weight)
    assert torch.equal(got, saved.float()) and got.dtype == torch.float32 and calls == [1]
    assert torch.equal(torch.get_rng_state(), before)
    with pytest.raises(ConfigError, match="view of shape"):
        lazy.assign(view, lambda: torch.zeros(4))
    lazy.assign(layer.bias, lambda: torch.zeros(4))
    with pytest.raises(ConfigError, match=r"shape \(4,\) was given to a parameter of shape \(3,\)"):
        lazy.materialize(layer.bias)
