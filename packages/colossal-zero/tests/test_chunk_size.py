"""How Gemini sizes its chunks (``_setup._chunk_numel``): least padding on one rank; sharded, the
fewest chunks within the slack of the least waste ([Note: fewer chunks] in colossal-chunk), below
the size at which one chunk in use and the next one's gathered buffer fit a budget; and what a
chunk in use holds (``working_set_bytes``)."""

import pytest

from colossal_chunk import pack, search_chunk_size
from colossal_zero import GeminiConfig
from colossal_zero.gemini._setup import _SHARDED_SLACK, _chunk_numel, working_set_bytes

BUDGET = 5_928_960  # bytes: a quarter of what GPT tiny's chunks hold on 4 ranks with none


def _numels() -> list[int]:
    models = pytest.importorskip("colossal_models")  # colossal-zero does not depend on it
    return [p.numel() for p in models.GPT(models.GPTConfig.preset("tiny")).parameters()]


def _waste(numels: list[int], size: int) -> float:
    return 1 - sum(numels) / (len(pack(numels, size)) * size)


def test_a_chunk_in_use_holds_its_buffer_and_shards():
    fp32, bf16 = GeminiConfig("fp32").precision_spec, GeminiConfig("bf16").precision_spec
    assert working_set_bytes(1024, fp32, 1) == 1024 * 8  # the chunk and its gradient chunk
    assert working_set_bytes(1024, fp32, 4) == 1024 * 4 + 2 * 256 * 4  # buffer + two shards
    assert working_set_bytes(1024, bf16, 4) == 1024 * 2 + 256 * 2  # gradients in the buffer


@pytest.mark.parametrize("budget", [None, BUDGET])
def test_one_rank_takes_the_least_padding(budget):
    numels = _numels()
    cfg = GeminiConfig("fp32", accelerator_bytes=budget)
    n = _chunk_numel(numels, cfg, cfg.precision_spec, 1)
    cap = sum(numels) // 4 if budget is None else budget // 16
    assert n == search_chunk_size(numels, max_numel=cap, element_size=4).chunk_numel


@pytest.mark.parametrize("budget", [None, BUDGET])
def test_sharded_takes_fewer_chunks_within_the_slack(budget):
    numels = _numels()
    cfg = GeminiConfig("fp32", accelerator_bytes=budget)
    n = _chunk_numel(numels, cfg, cfg.precision_spec, 4)
    least = search_chunk_size(numels, max_numel=n, element_size=4, world_size=4)
    assert len(pack(numels, n)) < least.num_chunks  # fewer than least padding takes
    assert _waste(numels, n) <= least.waste + _SHARDED_SLACK
    if budget is not None:  # a chunk in use and the next one's gathered buffer fit
        assert working_set_bytes(n, cfg.precision_spec, 4) + n * 4 <= budget


@pytest.mark.parametrize("budget", [None, 40 << 30])
def test_tensors_past_the_default_bound_still_pack_tightly(budget):
    # [Note: wide tensors]: a GPT of width 5120 in module order (its MLP matrices 104.9M
    # elements, past the 2^25 default bound); the size must not be pinned at the largest tensor
    h, ffn = 5120, 4 * 5120
    block = [h, h, 3 * h * h, 3 * h, h * h, h, h, h, h * ffn, ffn, ffn * h, h]
    numels = [256 * h, 1024 * h, *block * 4, h, h]
    cfg = GeminiConfig("bf16", accelerator_bytes=budget)
    size = _chunk_numel(numels, cfg, cfg.precision_spec, 1)
    assert size > max(numels)
    assert _waste(numels, size) < 0.1  # measured 0.054; at the largest tensor's size 0.3+
    assert _waste(numels, max(numels)) > 0.3
