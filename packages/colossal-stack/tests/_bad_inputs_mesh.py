"""Rows of the bad-input table about the parallel layout: ``--tp``, ``--pp``, ``--sp``, ``--zero``
and the plugins each runs on, checked on one process (``test_bad_inputs`` adds them to its
table and runs them against its existing run)."""

from __future__ import annotations

from colossal import TrainConfig
from colossal.train._mesh import check_mesh
from colossal.train._models import ModelSpec
from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig

# (case id, argv with {run}/{corpus}/... placeholders, a fragment of the expected message)
TRAIN = ["train", "--preset", "nano", "--batch-size", "2", "--seq-len", "16"]
CLI_CASES = [
    # one process here, so any --tp/--pp > 1 cannot divide the world
    ("tp-not-dividing", [*TRAIN, "--tp", "2"], "does not divide the world size 1"),
    ("tp-2d-not-square", [*TRAIN, "--tp", "2", "--tp-mode", "2d"], "tp = q*q"),
    ("tp-mode-unknown", [*TRAIN, "--tp", "2", "--tp-mode", "4d"], "unknown --tp-mode '4d'"),
    ("pp-more-than-layers", [*TRAIN, "--pp", "4"], "gpt-nano has 2 blocks; use --pp 2"),
    ("zero3-hybrid", [*TRAIN, "--tp", "2", "--zero", "3"], "use --plugin gemini with --tp"),
    ("zero-unknown", [*TRAIN, "--zero", "4"], "--zero must be 0, 1, 2 or 3"),
    (
        "zero-disagrees",
        [*TRAIN, "--plugin", "zero", "--zero-stage", "2", "--zero", "1"],
        "disagree",
    ),
    ("gemini-zero1", [*TRAIN, "--plugin", "gemini", "--zero", "1"], "is ZeRO stage 3"),
    ("tp-plugin-ddp", [*TRAIN, "--plugin", "ddp", "--tp", "2"], "runs on the hybrid plugin"),
    (
        "pp-plugin-gemini",
        [*TRAIN, "--plugin", "gemini", "--pp", "2"],
        "Gemini (ZeRO-3) takes --tp or ring/Ulysses --sp, not pipeline stages",
    ),
    ("microbatches-no-pp", [*TRAIN, "--microbatches", "4"], "--microbatches 4 needs --pp"),
    ("schedule-no-pp", [*TRAIN, "--schedule", "gpipe"], "--schedule gpipe needs --pp"),
    ("microbatches-split", [*TRAIN, "--pp", "2", "--microbatches", "3"], "cannot be split"),
    ("sp-size-no-sp", [*TRAIN, "--sp-size", "2"], "--sp-size 2 needs --sp ring"),
    ("sp-unknown", [*TRAIN, "--sp", "zigzag"], "unknown --sp 'zigzag'"),
    ("sp-ring-one-rank", [*TRAIN, "--sp", "ring"], "needs --sp-size N of 2 or more"),
    ("sp-megatron-no-tp", [*TRAIN, "--sp", "megatron"], "--sp megatron needs --tp"),
    ("tp-depth-not-2.5d", [*TRAIN, "--tp", "2", "--tp-depth", "2"], "needs --tp-mode 2.5d"),
    ("hybrid-budget", [*TRAIN, "--tp", "2", "--accelerator-budget", "1GiB"], "gemini only"),
]


def _no_adapter_spec() -> ModelSpec:
    """A model colossal cannot shard (what ``--model hf:PATH`` without an adapter resolves to)."""
    return ModelSpec("hf:some-model", lambda: GPT(GPTConfig.preset("nano")), 1, 64, 2, False)


# (case id, a call of the files, the error it raises, a fragment of its message)
API_CASES = [
    (
        "tp-model-without-adapter",
        lambda f: check_mesh(TrainConfig.from_flags(tp=2), _no_adapter_spec(), None, 2),
        ConfigError,
        "hf:some-model has no tensor/pipeline-parallel adapter, so --tp 2 cannot shard it",
    ),
    (
        "gemini-tp-times-sp-not-dividing",
        lambda f: check_mesh(
            TrainConfig.from_flags(plugin="gemini", tp=2, sp="ring", sp_size=4, seq_len=32),
            ModelSpec("gpt-nano", lambda: GPT(GPTConfig.preset("nano")), 1, 64, 2, True),
            None,
            4,
        ),
        ConfigError,
        "--tp 2 x --sp-size 4 does not divide the world size 4",
    ),
]
