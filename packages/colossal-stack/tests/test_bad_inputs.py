"""Every bad input is answered with one line and nothing destroyed.

A table of bad inputs across the ``colossal`` command (train, run, profile), memtrace's command
and the Python API. Each CLI case runs in-process through ``main`` and must exit 2 with a single
``error: ...`` line naming the problem and no traceback; each API case must raise the named error
with a one-line message. An existing run is passed as ``--out`` to every case that takes one, and
must be byte-for-byte unchanged afterwards. Almost all cases fail before any model is built.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import _bad_inputs_mesh as mesh_cases
import _bad_inputs_runs as runs_cases
import pytest
import torch

from colossal import Booster, DDPPlugin, GeminiPlugin, TrainConfig, build_plugin, latest_checkpoint
from colossal import train as train_fn
from colossal.booster import GeminiConfig, parse_bytes
from colossal.cli import main
from colossal_contracts import CheckpointError, ConfigError
from colossal_memtrace._cli import main as memtrace_main
from colossal_models import GPT, GPTConfig, load_corpus


@pytest.fixture(scope="module")
def files(tmp_path_factory):  # type: ignore[no-untyped-def]
    """An existing run (gemini, nano, 2 steps) and a few files to be wrong with."""
    from colossal_models import default_corpus_path

    root = tmp_path_factory.mktemp("bad-inputs")
    corpus = root / "corpus.txt"
    corpus.write_bytes((default_corpus_path() / "argparse.py").read_bytes())
    run = root / "run"
    base = dict(preset="nano", steps=2, batch_size=2, seq_len=16, corpus=corpus, out=run)
    train_fn(TrainConfig.from_flags(**base))  # type: ignore[arg-type]
    (root / "binary.bin").write_bytes(bytes(range(256)) * 64)
    (root / "empty").mkdir()
    (root / "a-file").write_text("not a directory")
    (root / "short.txt").write_text("too short\n")
    _data_files(root)
    more, procs = runs_cases.make_files(root)
    yield {
        **more,
        "root": root,
        "run": run,
        "corpus": corpus,
        "binary": root / "binary.bin",
        "empty": root / "empty",
        "file": root / "a-file",
        "short": root / "short.txt",
        **{p.stem: p for p in root.glob("data-*")},
    }
    runs_cases.stop(procs)


def _data_files(root: Path) -> None:
    """Bad data and tokenizers: named ``data-*`` (stem = the placeholder)."""
    import transformers

    (root / "data-nofield.jsonl").write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    (root / "data-notjson.jsonl").write_text('{"text": "fine"}\n{"text": "cut\n')
    (root / "data-emptyrows.jsonl").write_text('{"text": ""}\n\n{"text": ""}\n')
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["no text column"]}), root / "data-nocolumn.parquet")
    (root / "data-badtok").mkdir()
    (root / "data-badtok" / "tokenizer.json").write_text('{"model": "truncated')
    transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=100).save_pretrained(
        root / "data-smallvocab"
    )


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# (case id, argv with {run}/{corpus}/... placeholders, a fragment of the expected message)
TRAIN = ["train", "--preset", "nano", "--batch-size", "2", "--seq-len", "16"]
BIG_BATCH = ["train", "--preset", "small", "--batch-size", "65536"]
CLI_CASES = [
    ("steps-zero", [*TRAIN, "--steps", "0"], "--steps must be positive"),
    ("steps-negative", [*TRAIN, "--steps", "-3"], "--steps must be positive"),
    ("steps-huge", [*TRAIN, "--steps", "99999999999"], "--steps must be in"),
    ("steps-text", [*TRAIN, "--steps", "abc"], "invalid int value: 'abc'"),
    ("batch-zero", [*TRAIN, "--batch-size", "0"], "--batch-size must be positive"),
    ("batch-huge", [*TRAIN, "--batch-size", "10000000"], "--batch-size must be in"),
    ("seq-zero", [*TRAIN, "--seq-len", "0"], "--seq-len must be positive"),
    ("seq-past-context", [*TRAIN, "--seq-len", "65"], "exceeds gpt-nano's context"),
    ("seq-huge", [*TRAIN, "--seq-len", "99999999"], "--seq-len must be in"),
    ("seed-negative", [*TRAIN, "--seed", "-1"], "--seed must be in"),
    ("seed-huge", [*TRAIN, "--seed", "18446744073709551616"], "--seed must be in"),
    ("lr-zero", [*TRAIN, "--lr", "0"], "--lr must be positive"),
    ("lr-negative", [*TRAIN, "--lr=-1e-3"], "--lr must be positive"),
    ("lr-nan", [*TRAIN, "--lr", "nan"], "--lr must be positive"),
    ("lr-inf", [*TRAIN, "--lr", "inf"], "--lr must be positive"),
    ("lr-huge", [*TRAIN, "--lr", "1e9"], "at most 10"),
    ("lr-text", [*TRAIN, "--lr", "fast"], "invalid float value"),
    ("ckpt-every-negative", [*TRAIN, "--checkpoint-every", "-1"], "--checkpoint-every must be"),
    ("preset-unknown", [*TRAIN, "--preset", "huge"], "unknown GPT preset 'huge'"),
    ("palm-preset-unknown", [*TRAIN, "--model", "palm", "--preset", "huge"], "PaLM preset"),
    ("model-unknown", [*TRAIN, "--model", "bert"], "unknown --model 'bert'"),
    ("plugin-unknown", [*TRAIN, "--plugin", "nope"], "unknown --plugin 'nope'"),
    ("placement-unknown", [*TRAIN, "--placement", "lru"], "unknown --placement 'lru'"),
    ("states-unknown", [*TRAIN, "--states-placement", "gpu"], "unknown --states-placement 'gpu'"),
    ("ddp-states", [*TRAIN, "--plugin", "ddp", "--states-placement", "host"], "gemini only"),
    ("precision-unknown", [*TRAIN, "--precision", "fp8"], "unknown --precision 'fp8'"),
    ("ddp-precision", [*TRAIN, "--plugin", "ddp", "--precision", "bf16"], "fp32 masters"),
    ("ddp-budget", [*TRAIN, "--plugin", "ddp", "--accelerator-budget", "1GiB"], "gemini only"),
    ("ddp-placement", [*TRAIN, "--plugin", "ddp", "--placement", "static"], "gemini only"),
    ("budget-text", [*TRAIN, "--accelerator-budget", "lots"], "cannot read 'lots' as a size"),
    ("budget-negative", [*TRAIN, "--accelerator-budget=-5MiB"], "cannot read"),
    ("corpus-missing", [*TRAIN, "--corpus", "{root}/nope"], "does not exist"),
    ("corpus-empty-dir", [*TRAIN, "--corpus", "{empty}"], "holds no text"),
    ("corpus-binary", [*TRAIN, "--corpus", "{binary}"], "is not text"),
    ("corpus-too-short", [*TRAIN, "--corpus", "{short}"], "too few for --seq-len"),
    ("tokenizer-missing", [*TRAIN, "--tokenizer", "hf:{root}/nope"], "does not exist"),
    ("tokenizer-corrupt", [*TRAIN, "--tokenizer", "hf:{data-badtok}"], "is corrupt"),
    ("tokenizer-unknown", [*TRAIN, "--tokenizer", "spm"], "unknown --tokenizer 'spm'"),
    ("jsonl-no-field", [*TRAIN, "--data", "{data-nofield}"], "line 2 has no 'text' field"),
    ("jsonl-not-json", [*TRAIN, "--data", "{data-notjson}"], "line 2 is not JSON"),
    ("parquet-no-column", [*TRAIN, "--data", "{data-nocolumn}"], "no text column 'text'"),
    ("data-no-documents", [*TRAIN, "--data", "{data-emptyrows}"], "holds no text"),
    (
        "tokenizer-past-embedding",
        [*TRAIN, "--model", "hf:{data-smallvocab}"],
        "the tokenizer has 256 ids, more than the 100 rows",
    ),
    ("val-fraction-one", [*TRAIN, "--val-fraction", "1"], "--val-fraction must be in [0, 1)"),
    ("dropout-palm", [*TRAIN, "--model", "palm", "--dropout", "0.1"], "applies to --model gpt"),
    (
        "prepare-no-field",
        ["data", "prepare", "--data", "{data-nofield}", "--out", "{root}/p1"],
        "line 2 has no 'text' field",
    ),
    (
        "prepare-bad-tokenizer",
        [
            "data",
            "prepare",
            "--tokenizer",
            "hf:{data-badtok}",
            "--data",
            "{corpus}",
            "--out",
            "{root}/p2",
        ],
        "is corrupt",
    ),
    ("prepare-out-exists", ["data", "prepare", "--data", "{corpus}", "--out", "{run}"], "exists"),
    (
        "tokenizer-train-vocab",
        ["tokenizer", "train", "--corpus", "{corpus}", "--vocab-size", "10", "--out", "{root}/t"],
        "--vocab-size must be at least 257",
    ),
    ("out-is-a-file", [*TRAIN, "--out", "{file}"], "is a file"),
    ("out-under-a-file", [*TRAIN, "--out", "{file}/sub"], "is a file, not a directory"),
    ("out-unwritable", [*TRAIN, "--out", "/proc/colossal-run"], "is not writable"),
    ("out-holds-a-run", [*TRAIN, "--out", "{run}", "--resume-off"], "pass --resume"),
    ("resume-nothing", [*TRAIN, "--out", "{root}/fresh"], "holds no run; start a fresh"),
    ("resume-fewer-steps", [*TRAIN, "--steps", "1"], "past --steps 1"),
    ("resume-other-preset", [*TRAIN, "--preset", "micro"], "does not match"),
    ("model-far-too-large", [*TRAIN, "--preset", "175b"], "--preset"),
    ("activations-too-large", [*BIG_BATCH, "--seq-len", "1024"], "--batch-size"),
    ("unknown-flag", [*TRAIN, "--frobnicate"], "unrecognized arguments: --frobnicate"),
    ("no-command", [], "required"),
    ("unknown-command", ["fly"], "invalid choice: 'fly'"),
    ("run-nproc-zero", ["run", "--nproc-per-node", "0", "train"], "--nproc-per-node '0'"),
    ("run-nproc-negative", ["run", "--nproc-per-node", "-1", "train"], "--nproc-per-node"),
    ("run-nproc-text", ["run", "--nproc-per-node", "many", "train"], "--nproc-per-node 'many'"),
    ("run-nnodes-zero", ["run", "--nnodes", "0", "train"], "--nnodes '0'"),
    ("run-nothing", ["run", "--nproc-per-node", "2"], "nothing to launch"),
    ("run-unknown-flag", ["run", "--bogus", "1", "train"], "unrecognized arguments: --bogus"),
    ("run-missing-script", ["run", "--nproc-per-node", "2", "{root}/nope.py"], "does not exist"),
    ("profile-preset", ["profile", "--preset", "huge"], "unknown GPT preset 'huge'"),
    ("profile-model", ["profile", "--model", "bert"], "unknown --model 'bert'"),
    ("profile-batch", ["profile", "--preset", "nano", "--batch", "0"], "--batch must be"),
    ("profile-seq", ["profile", "--preset", "nano", "--seq-len", "65"], "gpt-nano's context"),
    ("profile-mode", ["profile", "--preset", "nano", "--mode", "guess"], "unknown --mode"),
    ("profile-device", ["profile", "--preset", "nano", "--device", "tpu"], "--device"),
    ("profile-optimizer", ["profile", "--preset", "nano", "--optimizer", "lion"], "--optimizer"),
    ("profile-out-file", ["profile", "--preset", "nano", "--out", "{file}"], "is a file"),
    ("grad-accum-zero", [*TRAIN, "--grad-accum", "0"], "--grad-accum must be positive"),
    ("eval-every-negative", [*TRAIN, "--eval-every=-1"], "--eval-every must be in [0"),
    ("log-unknown", [*TRAIN, "--log", "wandb"], "unknown --log 'wandb'"),
    ("decay-negative", [*TRAIN, "--weight-decay=-0.1"], "weight_decay must be finite"),
    ("clip-negative", [*TRAIN, "--max-grad-norm=-1"], "--max-grad-norm must be finite"),
    *mesh_cases.CLI_CASES,  # the parallel layout: --tp, --pp, --sp, --zero and their plugins
    *runs_cases.CLI_CASES,  # runs, folders, checkpoints, models on disk (issue 34's list)
]
MEMTRACE_CASES = [
    ("memtrace-no-colon", ["profile", "--model", "nocolon"], "package.module:factory"),
    ("memtrace-no-module", ["profile", "--model", "no_such_mod:f"], "cannot load --model"),
    ("memtrace-preset-moved", ["profile", "--preset", "tiny"], "colossal profile --preset"),
    ("memtrace-batch", ["profile", "--model", "os:getcwd", "--batch", "-1"], "--batch must"),
    ("memtrace-vocab", ["profile", "--model", "os:getcwd", "--vocab", "0"], "--vocab must"),
    ("memtrace-not-a-model", ["profile", "--model", "os:getcwd"], "not an nn.Module"),
    ("memtrace-unknown-flag", ["profile", "--model", "os:getcwd", "--fast"], "unrecognized"),
]


def _fill(argv: list[str], files: dict[str, Path]) -> list[str]:
    return [a.format(**{k: str(v) for k, v in files.items()}) for a in argv]


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


@pytest.mark.parametrize("argv,message", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(files, capsys, argv, message):
    argv = _fill(argv, files)
    if argv[:1] == ["train"]:
        if "--out" not in argv:
            argv += ["--out", str(files["run"]), "--resume"]  # the existing run, continued
        elif "--resume-off" not in argv:
            argv += ["--resume"]
        argv = [a for a in argv if a != "--resume-off"]
        if "--corpus" not in argv and "--data" not in argv:
            argv += ["--corpus", str(files["corpus"])]
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
    fresh = out is not None and not _exists(out)
    before = _snapshot(files["run"])
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: ") and message in line, line
    assert _snapshot(files["run"]) == before
    assert not (fresh and _exists(out)), f"{out} was written"  # type: ignore[arg-type]


def _exists(path: Path) -> bool:
    """``path.exists()``, False for a name the filesystem cannot hold (too long)."""
    try:
        return path.exists()
    except OSError:
        return False


@pytest.mark.parametrize(
    "argv,message", [c[1:] for c in MEMTRACE_CASES], ids=[c[0] for c in MEMTRACE_CASES]
)
def test_memtrace_cli_bad_input(files, capsys, argv, message):
    assert memtrace_main([*argv, "--out", str(files["root"] / "mem")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: ") and message in line, line


def test_run_help_is_help(capsys):
    assert main(["run", "--help"]) == 0
    assert "torchrun" in capsys.readouterr().out


def _gpt(precision: str = "fp32"):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("nano"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plugin = (
        DDPPlugin()
        if precision == "ddp"
        else GeminiPlugin(config=GeminiConfig(precision=precision))
    )
    return Booster(plugin).boost(model, opt)


def _boost_twice() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("nano"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    Booster(DDPPlugin()).boost(model, opt)
    Booster(GeminiPlugin()).boost(model, opt)


def _ids(*shape: int, hi: int = 256, dtype: torch.dtype = torch.long) -> torch.Tensor:
    return torch.randint(0, hi, shape).to(dtype)


API_CASES = [
    ("config-steps-str", lambda f: TrainConfig.from_flags(steps="3"), ConfigError, "must be int"),
    ("config-resume-int", lambda f: TrainConfig.from_flags(resume=1), ConfigError, "must be bool"),
    ("config-out-int", lambda f: TrainConfig.from_flags(out=3), ConfigError, "TrainConfig.out"),
    ("config-lr-nan", lambda f: TrainConfig.from_flags(lr=float("nan")), ConfigError, "--lr"),
    (
        "config-batch-float",
        lambda f: TrainConfig.from_flags(batch_size=2.5),
        ConfigError,
        "must be int",
    ),
    (
        "config-decay-negative",
        lambda f: TrainConfig.from_flags(weight_decay=-1.0),
        ConfigError,
        "decay",
    ),
    ("plugin-unknown", lambda f: build_plugin("zero9"), ConfigError, "unknown --plugin"),
    ("gemini-precision", lambda f: GeminiConfig(precision="fp8"), ConfigError, "precision"),
    ("gemini-budget-text", lambda f: parse_bytes("x"), ConfigError, "size"),
    ("gemini-budget-neg", lambda f: GeminiConfig(accelerator_bytes=-1), ConfigError, ">= 0"),
    ("gemini-placement", lambda f: GeminiConfig(placement="lru"), ConfigError, "placement"),
    ("boost-not-a-model", lambda f: Booster().boost("gpt", None), ConfigError, "nn.Module"),
    (
        "boost-not-an-optimizer",
        lambda f: Booster().boost(GPT(GPTConfig.preset("nano")), "adam"),
        ConfigError,
        "torch.optim.Optimizer",
    ),
    ("boost-twice", lambda f: _boost_twice(), ConfigError, "boosted already"),
    ("ids-past-vocab", lambda f: _gpt("ddp")[0](_ids(2, 8) + 256), ConfigError, "outside"),
    ("ids-negative", lambda f: _gpt("ddp")[0](_ids(2, 8) - 300), ConfigError, "outside"),
    (
        "ids-float",
        lambda f: _gpt("ddp")[0](_ids(2, 8, dtype=torch.float32)),
        ConfigError,
        "integer",
    ),
    (
        "ids-bf16-under-gemini-bf16",
        lambda f: _gpt("bf16")[0](_ids(2, 8, dtype=torch.bfloat16)),
        ConfigError,
        "mixed precision",
    ),
    (
        "targets-past-vocab",
        lambda f: _gpt("ddp")[0](_ids(2, 8), _ids(2, 8) + 999),
        ConfigError,
        "targets hold the id",
    ),
    ("ids-1d", lambda f: _gpt("ddp")[0](_ids(8)), ConfigError, "shape (batch, seq_len)"),
    ("preset-unknown", lambda f: GPTConfig.preset("huge"), ConfigError, "unknown GPT preset"),
    ("corpus-binary", lambda f: load_corpus(f["binary"]), ConfigError, "is not text"),
    (
        "no-checkpoint",
        lambda f: latest_checkpoint(f["empty"]),
        CheckpointError,
        "no usable checkpoint",
    ),
    (
        "load-from-nothing",
        lambda f: Booster().load(*_gpt("ddp"), f["empty"]),
        CheckpointError,
        "no step-N directory under",
    ),
    *mesh_cases.API_CASES,
    *runs_cases.API_CASES,
]


@pytest.mark.parametrize(
    "call,error,message", [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES]
)
def test_api_bad_input(files, call, error, message):
    before = _snapshot(files["run"])
    with pytest.raises(error) as info:
        call(files)
    text = str(info.value)
    assert message in text and "\n" not in text, text
    assert _snapshot(files["run"]) == before


def test_the_table_is_large():
    assert len(CLI_CASES) + len(MEMTRACE_CASES) + len(API_CASES) >= 60


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_corpus_says_permission_denied(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("text " * 1000)
    corpus.chmod(0)
    with pytest.raises(ConfigError, match="cannot be read \\(permission denied\\)"):
        load_corpus(corpus)
