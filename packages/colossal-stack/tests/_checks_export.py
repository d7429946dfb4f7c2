"""Helpers of ``test_export_hf.py``: a jsonl of documents, a tiny random GPT-2 folder with a
tokenizer built by the ``tokenizers`` library, the rank side of training it with ``colossal train`` under several
plugins in one World, and our model's logits from a checkpoint (the reference an export is
compared with)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from colossal import TrainConfig, train
from colossal.export import iter_checkpoint_state, read_checkpoint
from colossal.train._models import resolve_model

VOCAB, POSITIONS = 300, 64


def write_jsonl(path: Path, names: tuple[str, ...]) -> list[str]:
    """``path``: one ``{"text": ..., "source": ...}`` line per top-level block (split at two
    blank lines) of the standard-library modules ``names``; the texts."""
    from colossal_models import default_corpus_path

    docs = []
    for name in names:
        text = (default_corpus_path() / name).read_text()
        docs += [d + "\n" for d in re.split(r"\n{3,}", text) if d.strip()]
    with path.open("w") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({"text": doc, "source": f"doc-{i}"}) + "\n")
    return docs


def write_gpt2_folder(folder: Path, corpus_text: str) -> Path:
    """``save_pretrained`` of a random 2-layer GPT-2 (vocabulary 300, dropout 0) and a
    byte-level BPE tokenizer of at most 300 ids trained on ``corpus_text`` beside it."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=POSITIONS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([corpus_text], trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(folder)
    return folder


def train_runs(runs: list[dict[str, Any]]) -> list[str | None]:
    """``train(TrainConfig.from_flags(**kw))`` for each of ``runs`` in turn on this rank; rank 0's
    checkpoint paths (None on the other ranks)."""
    out = []
    for kw in runs:
        result = train(TrainConfig.from_flags(**kw))
        out.append(str(result.checkpoint) if result.checkpoint else None)
    return out


@torch.no_grad()
def our_logits(checkpoint: Path, idx: torch.Tensor) -> torch.Tensor:
    """Logits of the model the run trained (the ``HFCausalLM``, or the GPT a tensor-parallel
    run converted it to), rebuilt unsharded from the checkpoint in this process."""
    info = read_checkpoint(checkpoint)
    parallel = info.layout_model is not None or not any(
        n.startswith("hf.") for n, _ in iter_checkpoint_state(info)
    )
    spec = resolve_model(info.model, "tiny", vocab_size=256, parallel=parallel)
    model = spec.build().eval()
    state = dict(iter_checkpoint_state(info))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {n for n in missing if n.endswith("lm_head.weight")}
    assert not (set(missing) - tied) and not unexpected, (missing, unexpected)
    return model(idx)
