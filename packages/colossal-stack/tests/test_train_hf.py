"""``--model hf:PATH``: tiny random Hugging Face models saved to a tmp folder train unmodified
under Gemini, ZeRO and DDP on 1 and 2 ranks with the losses (and final weights) of the HF model
trained with plain ``torch.optim.AdamW``; GPT-2 converted to GPT trains with tp2; an architecture
without an adapter trains without tp and is refused with it. Checks in ``_checks_train_hf.py``.

Tolerances (fp32): losses within 1e-5 relative (measured: equal), weights within 1e-5 (measured:
up to 3e-6; ZeRO's and Gemini's flat Adam round differently from torch's per-tensor one)."""

from __future__ import annotations

import pytest
from _checks_train_hf import train_plugins, write_models

from colossal.cli import main
from colossal.train._models import resolve_model
from colossal_contracts import ConfigError

pytest.importorskip("transformers")

STEPS = 3
PLUGINS = [("gemini", {}), ("zero", {"stage": 2}), ("ddp", {})]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return write_models(str(tmp_path_factory.mktemp("hf")))


def _check(results: list[dict], *, kind: str = "HFCausalLM") -> None:
    for r in results:
        assert r["kind"] == kind, r
        assert r["loss_err"] <= 1e-5, r
        assert r["weight_err"] is None or r["weight_err"] <= 1e-5, r


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hf_models_train_unmodified_like_adamw_on_one_rank(folders, arch):
    _check(train_plugins(folders[arch], PLUGINS, STEPS))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hf_models_train_unmodified_like_adamw_on_two_ranks(world, folders, arch):
    for rank_results in world(2).run(train_plugins, folders[arch], PLUGINS, STEPS):
        _check(rank_results)


def test_gpt2_converted_to_gpt_trains_with_tp2_like_the_hf_model(world, folders):
    out = world(2).run(train_plugins, folders["gpt2"], [("hybrid", {"tp_size": 2})], STEPS)
    for rank_results in out:
        _check(rank_results, kind="GPT")
    assert out[0][0]["label"] == "hf-gpt2 as GPT"


def test_an_architecture_without_adapter_trains_without_tp_and_is_refused_with_it(folders):
    _check(train_plugins(folders["opt"], [("ddp", {})], STEPS))
    spec = resolve_model(f"hf:{folders['opt']}", "tiny", vocab_size=256)
    assert not spec.tp_capable and "gpt2 -> GPT" in spec.tp_unsupported
    assert resolve_model(f"hf:{folders['gpt2']}", "tiny", vocab_size=256).tp_capable
    with pytest.raises(ConfigError, match=r"'opt' has no adapter.*gpt2.*llama") as err:
        resolve_model(f"hf:{folders['opt']}", "tiny", vocab_size=256, parallel=True)
    assert "\n" not in str(err.value)


def test_colossal_train_takes_an_hf_folder(folders, small_corpus, tmp_path, capsys):
    def argv(model: str, out: str) -> list[str]:
        flags = f"--steps 2 --batch-size 2 --seq-len 16 --corpus {small_corpus}".split()
        return ["train", "--model", model, *flags, "--out", str(tmp_path / out)]

    assert main(argv(f"hf:{folders['llama']}", "run")) == 0
    assert "hf-llama" in capsys.readouterr().err
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2
    small_vocab = tmp_path / "small"
    small_vocab.mkdir()
    (small_vocab / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 100}')
    assert main(argv(f"hf:{small_vocab}", "small_run")) == 2
    assert "the tokenizer has 256 ids, more than the 100 rows" in capsys.readouterr().err
    assert main(argv(f"hf:{tmp_path / 'missing'}", "missing_run")) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_colossal_train_hf_gpt2_with_tp2_gives_the_hf_models_losses(
    world, folders, tmp_path, small_corpus
):
    from _checks_train_mesh import mesh_error, reference_losses, train_on_mesh

    base = {"steps": 3, "batch_size": 2, "seq_len": 16, "corpus": small_corpus}
    kw = {**base, "model": f"hf:{folders['gpt2']}", "tp": 2, "out": tmp_path / "tp2"}
    out = world(2).run(train_on_mesh, kw)
    want = reference_losses({**base, "model": kw["model"]}, 1)  # the unmodified HF model
    for got, ref in zip(out[0]["losses"], want, strict=True):
        assert abs(got - ref) <= 1e-5 * abs(ref), (out[0]["losses"], want)
    assert out[0]["records"][-1]["mesh"].startswith("dp1 x tp2(1d)")
    opt = {**base, "model": f"hf:{folders['opt']}", "tp": 2, "out": tmp_path / "opt"}
    for err in world(2).run(mesh_error, opt):
        assert "'opt' has no adapter" in err and "gpt2 -> GPT" in err and "\n" not in err
