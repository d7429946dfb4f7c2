"""The data package: tokenizers, sources, prepared shards and the streaming loader, on small
data made in temporary folders (a tiny BPE is trained here)."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pytest
import torch

from colossal_contracts import ConfigError
from colossal_models.data import (
    EOT_TOKEN,
    DataState,
    TokenizerBytes,
    TokenLoader,
    TokenShards,
    load_tokenizer,
    open_source,
    prepare_data,
    train_tokenizer,
)
from colossal_models.data._shards import ShardWriter

DOCS = [f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * (i % 5 + 1)
        for i in range(40)]  # fmt: skip


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("tok")
    return train_tokenizer(iter(DOCS * 3), vocab_size=300, out=out)


def _jsonl(path, rows):  # type: ignore[no-untyped-def]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_public_name_imports():
    import colossal_models.data as data

    assert all(getattr(data, name) is not None for name in data.__all__)


def test_trained_bpe_round_trips_and_loads_by_folder_or_file(bpe, tmp_path):
    assert bpe.vocab_size == 300 and bpe.decode([bpe.eot_id]) == EOT_TOKEN
    text = "the lazy dog — ünïcode ✓"
    ids = bpe.encode_batch([text])[0]
    assert bpe.decode(ids) == text and len(ids) < len(text.encode())  # merges learned
    folder = bpe.path.parent
    for spec in (f"hf:{folder}", f"hf:{bpe.path}"):
        again = load_tokenizer(spec)
        assert again.encode_batch([text]) == [ids] and again.fingerprint == bpe.fingerprint


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p / "nothing", "does not exist"),
        (lambda p: (p / "tokenizer.json").write_text("{not json") and p, "is corrupt"),
        (lambda p: (p / "t.json").write_text('{"version": "1.0"}') and p / "t.json", "corrupt"),
    ],
    ids=["missing", "corrupt-folder", "corrupt-file"],
)
def test_bad_tokenizer_is_one_line(tmp_path, make, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_tokenizer(f"hf:{make(tmp_path)}")
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="unknown --tokenizer"):
        load_tokenizer("sentencepiece")


def _texts(source):  # type: ignore[no-untyped-def]
    docs, open_doc = [], ""
    for piece in source.pieces():
        open_doc += piece.text
        if piece.last:
            docs.append(open_doc)
            open_doc = ""
    return docs


def test_sources_read_every_kind(tmp_path):
    import datasets

    rows = [{"text": d, "id": i} for i, d in enumerate(DOCS)]
    jsonl = _jsonl(tmp_path / "d.jsonl", rows)
    parquet = tmp_path / "d.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    folder = tmp_path / "folder"
    folder.mkdir()
    for i, d in enumerate(DOCS[:3]):
        (folder / f"{i}.txt").write_text(d)
    (folder / "skip.bin").write_bytes(b"\x00\x01" * 50)
    assert _texts(open_source(jsonl)) == DOCS
    assert _texts(open_source(parquet)) == DOCS
    assert _texts(open_source(saved)) == DOCS
    assert _texts(open_source(folder)) == DOCS[:3]
    assert _texts(open_source(tmp_path / "folder" / "0.txt")) == DOCS[:1]
    with pytest.raises(ConfigError, match="line 1: field 'id' is int, not text"):
        _texts(open_source(jsonl, text_field="id"))


def _bad(tmp_path, name):  # type: ignore[no-untyped-def]
    import datasets

    if name == "jsonl-no-field":
        return _jsonl(tmp_path / "a.jsonl", [{"text": "ok"}, {"txt": "oops"}])
    if name == "jsonl-not-json":
        p = tmp_path / "b.jsonl"
        p.write_text('{"text": "ok"}\n\n{"text": "cut short\n')
        return p
    if name == "parquet-no-column":
        p = tmp_path / "c.parquet"
        datasets.Dataset.from_list([{"body": "x"}]).to_parquet(str(p))
        return p
    if name == "dataset-no-column":
        p = tmp_path / "saved"
        datasets.Dataset.from_list([{"body": "x"}]).save_to_disk(str(p))
        return p
    if name == "binary":
        p = tmp_path / "blob.dat"
        p.write_bytes(bytes(range(256)) * 8)
        return p
    if name == "empty-folder":
        (tmp_path / "empty").mkdir()
        (tmp_path / "empty" / "blank.txt").write_text("  \n\n")
        return tmp_path / "empty"
    return tmp_path / "missing"


BAD_SOURCES = [
    ("jsonl-no-field", "line 2 has no 'text' field (it has: txt); pass --text-field"),
    ("jsonl-not-json", "line 3 is not JSON"),
    ("parquet-no-column", "has no text column 'text' (columns: body)"),
    ("dataset-no-column", "has no text column 'text' (columns: body)"),
    ("binary", "is not text"),
    ("empty-folder", "holds no text"),
    ("missing", "does not exist"),
]


@pytest.mark.parametrize("name,message", BAD_SOURCES, ids=[c[0] for c in BAD_SOURCES])
def test_bad_data_is_one_line_and_writes_nothing(tmp_path, name, message):
    path = _bad(tmp_path, name)
    out = tmp_path / "prepared"
    with pytest.raises(ConfigError) as info:
        prepare_data(open_source(path), TokenizerBytes(), out)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
    assert not out.exists() and not list(tmp_path.glob(".prepared.tmp-*"))


def test_prepare_packs_documents_with_end_of_text(bpe, tmp_path):
    jsonl = _jsonl(tmp_path / "d.jsonl", [{"text": d} for d in DOCS])
    serial = prepare_data(open_source(jsonl), bpe, tmp_path / "one", num_workers=1)
    parallel = prepare_data(open_source(jsonl), bpe, tmp_path / "two", num_workers=2)
    want = np.concatenate([np.array([*ids, bpe.eot_id]) for ids in bpe.encode_batch(DOCS)])
    for shards in (serial, parallel):
        assert shards.dtype == np.uint16 and shards.num_documents == len(DOCS)
        assert np.array_equal(shards.read(0, shards.num_tokens), want)
        ends = [shards.document_end(i) for i in range(len(DOCS))]
        assert ends[-1] == len(want) and all(want[e - 1] == bpe.eot_id for e in ends)
    assert (tmp_path / "two" / "tokenizer.json").is_file()  # training reads the folder's own
    with pytest.raises(ConfigError, match="exists already"):
        prepare_data(open_source(jsonl), bpe, tmp_path / "one")


def _prepare_in_a_daemon(jsonl, tokenizer_dir, out):  # type: ignore[no-untyped-def]
    prepare_data(open_source(jsonl), load_tokenizer(f"hf:{tokenizer_dir}"), out, num_workers=2)


def test_prepare_inside_a_daemonic_process_encodes_in_process(bpe, tmp_path):
    """A daemonic process (a rank of a test World, say) may not start workers: same shards."""
    jsonl = _jsonl(tmp_path / "d.jsonl", [{"text": d} for d in DOCS])
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    proc = multiprocessing.get_context(method).Process(
        target=_prepare_in_a_daemon, args=(jsonl, bpe.path.parent, tmp_path / "d"), daemon=True
    )
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    serial = prepare_data(open_source(jsonl), bpe, tmp_path / "one", num_workers=1)
    daemon = TokenShards.open(tmp_path / "d")
    assert np.array_equal(daemon.read(0, daemon.num_tokens), serial.read(0, serial.num_tokens))


class _WideTokenizer(TokenizerBytes):
    """Byte ids, but a vocabulary past uint16: the shards must be uint32."""

    vocab_size = 70_000
    eot_id = 69_999
    fingerprint = "wide"


def test_large_vocabularies_get_uint32_shards(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n")
    shards = prepare_data(open_source(tmp_path / "a.txt"), _WideTokenizer(), tmp_path / "p")
    assert shards.dtype == np.uint32
    assert shards.read(0, shards.num_tokens).tolist() == [*b"hello world\n", 69_999]


def _arange_shards(tmp_path, num_tokens, *, docs=1, shard_tokens=1000):  # type: ignore[no-untyped-def]
    """Tokens 0..num_tokens-1 across several shard files: every window is told apart by its
    first token."""
    writer = ShardWriter(tmp_path, np.dtype(np.uint32), shard_tokens=shard_tokens)
    per = num_tokens // docs
    for d in range(docs):
        writer.add(np.arange(d * per, (d + 1) * per))
        writer.end_document()
    writer.close({"tokenizer": {"vocab_size": 2**31, "eot_id": 0, "fingerprint": "x", "spec": "x"}})
    return TokenShards.open(tmp_path)


def test_reads_cross_shard_files(tmp_path):
    shards = _arange_shards(tmp_path, 5000, shard_tokens=700)
    assert len(shards.index["shards"]) == 8
    assert shards.read(650, 1450).tolist() == list(range(650, 1450))


def test_an_epoch_visits_every_window_once_and_ranks_split_it(tmp_path):
    seq = 4
    shards = _arange_shards(tmp_path, 4 * 2500 + 1)  # 2500 windows: blocks of 1024, 1024, 452
    one = TokenLoader(shards, seq_len=seq, batch_size=10, seed=3, val_fraction=0.0)
    assert one.num_windows == 2500
    order = torch.cat([one.next_batch()[0][:, 0] // seq for _ in range(250)]).tolist()
    assert sorted(order) == list(range(2500)) and order != sorted(order)
    assert one.state() == DataState(epoch=1, offset=0, seed=3, num_windows=2500)
    x, y = one.next_batch()
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y[:, -1], x[:, -1] + 1)
    ranks = [
        TokenLoader(shards, seq_len=seq, batch_size=5, dp_rank=r, dp_size=2, seed=3,
                    val_fraction=0.0)
        for r in range(2)
    ]  # fmt: skip
    both = [torch.cat([ld.next_batch()[0][:, 0] // seq for ld in ranks]) for _ in range(250)]
    assert torch.cat(both).tolist() == order  # the two halves of each global batch


def test_state_resumes_the_exact_order(tmp_path):
    shards = _arange_shards(tmp_path, 4 * 300 + 1)
    a = TokenLoader(shards, seq_len=4, batch_size=7, seed=1, val_fraction=0.0)
    for _ in range(60):  # past an epoch
        a.next_batch()
    b = TokenLoader(shards, seq_len=4, batch_size=7, seed=1, val_fraction=0.0)
    b.load_state(json.loads(json.dumps(a.state().__dict__)))
    for _ in range(5):
        assert torch.equal(a.next_batch()[0], b.next_batch()[0])
    other = TokenLoader(shards, seq_len=8, batch_size=7, seed=1, val_fraction=0.0)
    with pytest.raises(ConfigError, match="other data, --seq-len"):
        other.load_state(a.state())


def test_validation_holds_out_the_last_documents(tmp_path):
    shards = _arange_shards(tmp_path, 2000, docs=10)
    loader = TokenLoader(shards, seq_len=9, batch_size=2, val_fraction=0.2)
    assert (loader.train_tokens, loader.val_tokens) == (1600, (1600, 2000))
    val = loader.val_batches(3)
    assert all(int(x.min()) >= 1600 for x, _ in val)
    train = [loader.next_batch()[1] for _ in range(50)]
    assert all(int(y.max()) < 1600 for y in train)
    with pytest.raises(ConfigError, match="too few for --seq-len 500"):
        TokenLoader(shards, seq_len=500, batch_size=1, val_fraction=0.2)  # 400 held out
