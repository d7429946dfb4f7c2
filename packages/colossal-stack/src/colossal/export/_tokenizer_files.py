"""The tokenizer files of an export: the run's own tokenizer, so ``AutoTokenizer.from_pretrained``
loads every exported folder with the ids the model was trained on.

[Note: the run's tokenizer] ``trainer.json`` records the tokenizer the run resolved
(``"tokenizer"``: ``bytes`` or ``hf:PATH``; see train/_data.py's order of choice). A checkpoint
written before that record falls back to ``train_config.tokenizer``, then an ``hf:`` model's
own folder when it holds a tokenizer, then bytes (what such runs trained on). ``hf:PATH`` is
copied (tokenizer.json, its config and special-token files, vocab/merges); a GPT-2 style folder
without tokenizer.json gets one written beside its files. ``bytes`` is written as the
``tokenizers`` equivalent of the byte tokenizer (``TokenizerBytes.save``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from colossal_contracts import ConfigError
from colossal_models.data import (
    BYTES,
    HFTokenizer,
    TextTokenizer,
    TokenizerBytes,
    has_tokenizer,
    load_tokenizer,
)

from ._source import CheckpointInfo

__all__ = [
    "TOKENIZER_FILES",
    "copy_tokenizer_files",
    "run_tokenizer",
    "run_tokenizer_spec",
    "write_tokenizer_files",
]

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "generation_config.json",
)


def run_tokenizer_spec(info: CheckpointInfo) -> str:
    """``bytes`` or ``hf:PATH``: the tokenizer the run trained with (see [Note: the run's
    tokenizer])."""
    if isinstance(info.tokenizer, str) and info.tokenizer:
        return info.tokenizer
    given = str(info.train_config.get("tokenizer", ""))
    if given == BYTES or given.startswith("hf:"):
        return given
    if info.model.startswith("hf:"):
        path = Path(info.model[3:])
        folder = path if path.is_dir() else path.parent
        if has_tokenizer(folder):
            return f"hf:{folder}"
    return BYTES


def run_tokenizer(info: CheckpointInfo) -> TextTokenizer:
    """The run's tokenizer, loaded; ``ConfigError`` when its files are gone."""
    spec = run_tokenizer_spec(info)
    try:
        return load_tokenizer(spec)
    except ConfigError as err:
        raise ConfigError(
            f"checkpoint {info.path} was trained with the tokenizer {spec}, which cannot be "
            f"read now ({err}); put its files back at that path to export the model with them"
        ) from None


def copy_tokenizer_files(source: Path | None, out: Path) -> list[str]:
    """Copy the tokenizer files of ``source`` (a folder, or a ``tokenizer.json``) into ``out``;
    the names copied (none when ``source`` is None or holds none)."""
    if source is None:
        return []
    source = Path(source)
    if source.is_file():
        shutil.copyfile(source, out / "tokenizer.json")
        return ["tokenizer.json"]
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)
            copied.append(name)
    return copied


def write_tokenizer_files(tokenizer: TextTokenizer, out: Path) -> list[str]:
    """The files of ``tokenizer`` (from ``run_tokenizer``) in ``out``; the names written."""
    if isinstance(tokenizer, TokenizerBytes):
        tokenizer.save(out)
        return ["tokenizer.json", "tokenizer_config.json"]
    if not isinstance(tokenizer, HFTokenizer):
        raise ConfigError(f"cannot write the tokenizer {tokenizer.spec} into an export")
    copied = copy_tokenizer_files(Path(tokenizer.spec[3:]), out)
    if "tokenizer.json" not in copied:  # vocab.json + merges.txt only: add the fast file
        tokenizer.save(out)
        copied.append("tokenizer.json")
    return copied
