"""Tokenizers as Hugging Face files: the byte tokenizer saved as a ``tokenizers`` tokenizer that
``AutoTokenizer`` loads with the byte ids, and ``hf:DIR`` on a GPT-2 style folder holding only
``vocab.json`` and ``merges.txt`` (encoded as ``transformers``' GPT-2 tokenizer does)."""

from __future__ import annotations

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from colossal_contracts import ConfigError
from colossal_models import ByteTokenizer
from colossal_models.data import EOT_TOKEN, TokenizerBytes, has_tokenizer, load_tokenizer

TEXTS = [
    "def main(argv):\n    return 0\n",
    "héllo wörld, naïve café",
    "日本語のテキスト 🙂👍🏽",
    "  tabs\tand\r\nnewlines  ",
    "literal Ā, \\x00 and <|endoftext|> stay text",
]


def test_the_byte_tokenizer_saved_loads_in_auto_tokenizer_with_the_byte_ids(tmp_path):
    TokenizerBytes().save(tmp_path)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = ByteTokenizer()
    assert auto.eos_token_id == 0 and len(auto) == 256
    vocab = Tokenizer.from_file(str(tmp_path / "tokenizer.json")).get_vocab()
    assert sorted(vocab) == sorted(pre_tokenizers.ByteLevel.alphabet())  # the library's table
    for text in TEXTS:
        ids = auto(text)["input_ids"]
        assert ids == ours.encode(text).tolist(), text
        assert auto.decode(ids) == ours.decode(ids) == text
    broken = [104, 105, 0xC3, 106, 0xFF, 0, 0xE2, 0x82]  # invalid UTF-8 and end of text
    assert auto.decode(broken) == ours.decode(broken)
    again = load_tokenizer(f"hf:{tmp_path}")  # the data path reads it too: same ids, eot 0
    assert (again.vocab_size, again.eot_id) == (256, 0)
    assert again.encode_batch(TEXTS) == TokenizerBytes().encode_batch(TEXTS)


def _gpt2_style_folder(folder):
    """vocab.json + merges.txt of a byte-level BPE (no tokenizer.json), and the full tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[EOT_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXTS * 20, trainer)
    folder.mkdir()
    tok.model.save(str(folder))
    return tok


def test_a_folder_with_only_vocab_and_merges_loads_as_gpt2s_tokenizer(tmp_path):
    folder = tmp_path / "gpt2-style"
    _gpt2_style_folder(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["merges.txt", "vocab.json"]
    assert has_tokenizer(folder)
    tok = load_tokenizer(f"hf:{folder}")
    gpt2 = transformers.GPT2TokenizerFast.from_pretrained(folder)  # transformers' reading
    assert tok.vocab_size == len(gpt2) and tok.eot_id == gpt2.eos_token_id
    texts = [*TEXTS, "a<|endoftext|>b"]
    expected = [gpt2(t)["input_ids"] for t in texts]
    assert tok.encode_batch(texts) == expected
    assert expected[-1].count(tok.eot_id) == 1  # the end-of-text token is one special id
    assert [tok.decode(ids) for ids in expected] == texts
    tok.save(tmp_path)  # and written as a tokenizer.json (what an export holds)
    assert load_tokenizer(f"hf:{tmp_path}").encode_batch(texts) == expected
    (folder / "merges.txt").write_text("#version: 0.2\nnot a merge line at all\n")
    with pytest.raises(ConfigError, match=r"vocab\.json/merges\.txt"):
        load_tokenizer(f"hf:{folder}")
