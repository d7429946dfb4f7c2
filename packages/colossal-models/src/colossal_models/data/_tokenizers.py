"""Tokenizers by name: ``bytes`` (every UTF-8 byte a token) or ``hf:PATH`` (a Hugging Face
``tokenizers`` tokenizer.json, a model folder holding one, or a GPT-2 style folder with only
``vocab.json`` and ``merges.txt``), and training a byte-level BPE.

[Note: end of text] Documents are packed into one token stream with an end-of-text id after each.
The byte tokenizer uses id 0 (the NUL byte): text never holds it, since files with a NUL byte are
refused as binary, so its vocabulary stays 256. A Hugging Face tokenizer uses its own special
token (``<|endoftext|>``, ``</s>``, ``<eos>``, ...; the one a tokenizer trained here adds).

[Note: bytes as a Hugging Face tokenizer] So that an export of a byte-tokenizer run loads in
``AutoTokenizer``, ``TokenizerBytes.save`` writes a ``tokenizers`` BPE in GPT-2's byte-level
scheme with no merges: the ``ByteLevel`` pre-tokenizer (no regex split, no prefix space) maps
each UTF-8 byte to one character of GPT-2's byte-to-unicode table, and the vocabulary gives that
character the byte's value as its id, so any text encodes to exactly its bytes, and the
``ByteLevel`` decoder turns ids back into bytes decoded as Python's ``errors="replace"`` does.
End of text is id 0, the table's character for the NUL byte (``Ā``); ``tokenizer_config.json``
names it ``eos_token`` with ``split_special_tokens`` on, so the text ``Ā`` still encodes as its
two bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from colossal_contracts import ConfigError

if TYPE_CHECKING:
    import tokenizers

__all__ = [
    "BYTES",
    "EOT_TOKEN",
    "HFTokenizer",
    "TextTokenizer",
    "TokenizerBytes",
    "has_tokenizer",
    "load_tokenizer",
    "tokenizer_file",
    "train_tokenizer",
]

BYTES = "bytes"
HF_PREFIX = "hf:"
TOKENIZER_FILE = "tokenizer.json"
BPE_FILES = ("vocab.json", "merges.txt")  # a GPT-2 style folder without tokenizer.json
EOT_TOKEN = "<|endoftext|>"  # GPT-2's, and what ``train_tokenizer`` adds
_EOT_CANDIDATES = (EOT_TOKEN, "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "[SEP]")


@runtime_checkable
class TextTokenizer(Protocol):
    """What the data path needs of a tokenizer.

    Attributes:
        spec: how to load it again ("bytes" or "hf:PATH").
        vocab_size: ids are in ``[0, vocab_size)``.
        eot_id: the end-of-text id put after each document (see [Note: end of text]).
        fingerprint: a digest of the vocabulary, to tell prepared data from another tokenizer's.
    """

    spec: str
    vocab_size: int
    eot_id: int
    fingerprint: str

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


class TokenizerBytes:
    """The byte tokenizer as a ``TextTokenizer``: ids are UTF-8 bytes, end of text is 0."""

    spec = BYTES
    vocab_size = 256
    eot_id = 0
    fingerprint = BYTES

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def encode_bytes(self, texts: list[str]) -> list[bytes]:
        """The ids of each text as raw bytes (one byte per id): the fast path of ``prepare``."""
        return [t.encode("utf-8") for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def save(self, directory: Path) -> None:
        """Write ``directory/tokenizer.json`` and ``tokenizer_config.json``: this tokenizer for
        ``AutoTokenizer`` (see [Note: bytes as a Hugging Face tokenizer])."""
        lib = _library()
        chars = _byte_chars()
        vocab = {chars[b]: b for b in range(256)}
        tok = lib.Tokenizer(lib.models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = lib.decoders.ByteLevel()
        tok.save(str(directory / TOKENIZER_FILE))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": chars[self.eot_id],
            "split_special_tokens": True,
            "clean_up_tokenization_spaces": False,
        }
        text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
        (directory / "tokenizer_config.json").write_text(text, encoding="utf-8")


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table, the one ``tokenizers``' ``ByteLevel`` uses: printable
    Latin-1 bytes stand for themselves, the other 68 for U+0100.. in byte order."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    rest = iter(chr(256 + i) for i in range(256 - len(keep)))
    return [chr(b) if b in keep else next(rest) for b in range(256)]


class HFTokenizer:
    """A Hugging Face ``tokenizers.Tokenizer`` read from ``tokenizer.json``, or built from a
    GPT-2 style ``vocab.json`` + ``merges.txt`` (``from_bpe_files``)."""

    def __init__(
        self, path: Path, tok: tokenizers.Tokenizer | None = None, raw: str | None = None
    ) -> None:
        Tokenizer = _library().Tokenizer

        self.path = path
        self.spec = HF_PREFIX + str(path.parent if path.name == TOKENIZER_FILE else path)
        if tok is None:
            raw = _read(path)
            try:
                tok = Tokenizer.from_str(raw)
            except Exception as err:  # tokenizers raises its own Exception type for a bad file
                first = str(err).splitlines()[0] if str(err) else type(err).__name__
                raise ConfigError(
                    f"tokenizer {path} is corrupt ({first}); give a tokenizer.json saved by "
                    "Hugging Face tokenizers, or train one with colossal tokenizer train"
                ) from None
        self._tok = tok
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eot_id = _eot_id(self._tok, path if path.is_file() else path / TOKENIZER_FILE)
        self.fingerprint = hashlib.sha256(str(raw).encode()).hexdigest()[:16]

    @classmethod
    def from_bpe_files(cls, folder: Path) -> HFTokenizer:
        """GPT-2's byte-level BPE from ``folder/vocab.json`` and ``merges.txt`` (the pipeline of
        ``tokenizers``' ``ByteLevelBPETokenizer`` and of ``transformers``' GPT-2 tokenizer: no
        prefix space); its end-of-text token is made special, as ``transformers`` does, so
        the text ``<|endoftext|>`` is that one id."""
        lib = _library()
        vocab, merges = (folder / name for name in BPE_FILES)
        raw = _read(vocab) + "\n" + _read(merges)
        try:
            tok = lib.Tokenizer(lib.models.BPE.from_file(str(vocab), str(merges)))
            tok.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = lib.decoders.ByteLevel()
            tok.post_processor = lib.processors.ByteLevel(trim_offsets=False)
        except Exception as err:  # tokenizers raises its own Exception type for a bad file
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ConfigError(
                f"tokenizer {folder} has a corrupt vocab.json/merges.txt ({first}); give GPT-2 "
                "style files or a tokenizer.json"
            ) from None
        made = cls(folder, tok, raw)
        eot = tok.id_to_token(made.eot_id)
        tok.add_special_tokens([lib.AddedToken(eot, special=True, normalized=False)])
        return made

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The ``tokenizers.Tokenizer`` itself."""
        return self._tok

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, directory: Path) -> None:
        """Write ``directory/tokenizer.json``."""
        self._tok.save(str(directory / TOKENIZER_FILE))


def _library() -> ModuleType:
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(
            "Hugging Face tokenizers need the tokenizers library: pip install "
            "'colossal-models[data]' (or use --tokenizer bytes)"
        ) from None
    return tokenizers


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read tokenizer {path} ({err}); give a tokenizer.json") from None


def _eot_id(tok: tokenizers.Tokenizer, path: Path) -> int:
    """The end-of-text id: the tokenizer_config.json's eos_token beside it, else a known name."""
    names = list(_EOT_CANDIDATES)
    config = path.parent / "tokenizer_config.json"
    if config.is_file():
        try:
            eos = json.loads(config.read_text()).get("eos_token")
        except (OSError, ValueError, AttributeError):
            eos = None
        if isinstance(eos, dict):
            eos = eos.get("content")
        if isinstance(eos, str):
            names.insert(0, eos)
    for name in names:
        found = tok.token_to_id(name)
        if found is not None:
            return int(found)
    raise ConfigError(
        f"tokenizer {path} has no end-of-text token (none of {', '.join(_EOT_CANDIDATES)}, nor "
        "an eos_token in tokenizer_config.json); add one, it separates packed documents"
    )


def tokenizer_file(path: str | Path) -> Path | None:
    """The tokenizer.json at ``path`` (the file, or inside the folder), or None."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / TOKENIZER_FILE
    return p if p.is_file() else None


def has_tokenizer(path: str | Path) -> bool:
    """Whether ``hf:path`` names a tokenizer: a tokenizer.json (the file, or in the folder), or
    a folder with GPT-2's vocab.json and merges.txt."""
    p = Path(path).expanduser()
    return tokenizer_file(p) is not None or all((p / n).is_file() for n in BPE_FILES)


def load_tokenizer(spec: str) -> TextTokenizer:
    """``bytes`` or ``hf:PATH`` (a tokenizer.json, a folder with one, or a folder with
    vocab.json + merges.txt); ``ConfigError`` naming what was wrong for an unknown name, a
    missing file or a corrupt one."""
    if spec == BYTES:
        return TokenizerBytes()
    if not spec.startswith(HF_PREFIX) or not spec[len(HF_PREFIX) :]:
        raise ConfigError(
            f"unknown --tokenizer {spec!r}; choose bytes or hf:PATH (a tokenizer.json or a "
            "folder holding one)"
        )
    path = Path(spec[len(HF_PREFIX) :]).expanduser()
    found = tokenizer_file(path)
    if found is None and path.is_dir() and has_tokenizer(path):
        return HFTokenizer.from_bpe_files(path)
    if found is None:
        where = path / TOKENIZER_FILE if path.is_dir() else path
        raise ConfigError(
            f"--tokenizer {spec}: {where} does not exist; give a tokenizer.json or a folder "
            "holding one, or GPT-2's vocab.json and merges.txt (colossal tokenizer train "
            "makes a tokenizer.json)"
        )
    return HFTokenizer(found)


def train_tokenizer(texts: Iterator[str], *, vocab_size: int, out: Path) -> HFTokenizer:
    """Train a byte-level BPE (GPT-2's scheme: any text encodes, no unknown token) on ``texts``
    with ``vocab_size`` ids including ``<|endoftext|>``; write ``out/tokenizer.json``. Offline."""
    lib = _library()
    Tokenizer, decoders, models = lib.Tokenizer, lib.decoders, lib.models
    pre_tokenizers, trainers = lib.pre_tokenizers, lib.trainers

    if not 257 <= vocab_size <= 2**31 - 1:
        raise ConfigError(
            f"--vocab-size must be at least 257 (the 256 bytes and <|endoftext|>), got {vocab_size}"
        )
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / TOKENIZER_FILE))
    return HFTokenizer(out / TOKENIZER_FILE)
