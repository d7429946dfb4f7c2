import pytest
import torch

from colossal_contracts import ConfigError
from colossal_models import ByteTokenizer, default_corpus_path, load_corpus


def test_tokenizer_round_trips_unicode():
    tok = ByteTokenizer()
    text = "def f(x):\n    return 'héllo ✓'\n"
    ids = tok.encode(text)
    assert ids.dtype == torch.long and int(ids.max()) < tok.vocab_size
    assert tok.decode(ids) == text


def test_default_corpus_is_the_standard_library():
    corpus = load_corpus(max_bytes=200_000)
    assert corpus.source == default_corpus_path()
    assert len(corpus.data) == 200_000
    assert b"def " in bytes(corpus.data[:200_000].tolist())


def test_folder_corpus_skips_binary_files(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n" * 10)
    (tmp_path / "b.bin").write_bytes(b"\x00\x01\x02" * 10)
    corpus = load_corpus(tmp_path)
    assert corpus.num_files == 1
    assert bytes(corpus.data.tolist()) == ("hello world\n" * 10 + "\n").encode()


def test_missing_and_empty_paths_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_corpus(tmp_path / "nope")
    (tmp_path / "blank.txt").write_text("   \n")
    with pytest.raises(ConfigError, match="holds no text"):
        load_corpus(tmp_path)


def test_batches_are_next_byte_targets(tmp_path):
    (tmp_path / "a.txt").write_text("abcdefghijklmnopqrstuvwxyz" * 4)
    corpus = load_corpus(tmp_path)
    g = torch.Generator().manual_seed(0)
    x, y = corpus.batch(corpus.data, 4, 8, g)
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ConfigError, match="too few"):
        corpus.batch(corpus.data, 1, 1000, g)
