import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from colossal_chunk import pack, search_chunk_size
from colossal_contracts import ConfigError


def test_pack_starts_a_new_chunk_when_a_tensor_does_not_fit():
    assert pack([3, 3, 5, 1], 6) == [[0, 1], [2, 3]]
    with pytest.raises(ConfigError, match="at least the largest tensor"):
        pack([7], 6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=20), st.integers(0, 60))
def test_search_finds_the_least_padding_among_all_sizes(numels, extra):
    hi = max(numels) + extra
    res = search_chunk_size(numels, max_numel=hi, align=1, max_candidates=10_000)
    brute = min((len(pack(numels, s)) * s - sum(numels), s) for s in range(max(numels), hi + 1))
    assert (res.padding_numel, res.chunk_numel) == brute
    assert res.num_chunks == len(pack(numels, res.chunk_numel))
    assert res.waste == pytest.approx(res.padding_numel / (res.num_chunks * res.chunk_numel))


def test_sizes_are_aligned_for_every_rank_and_limited_by_bytes():
    res = search_chunk_size(
        [1000, 3000, 500], max_bytes=4 * 8192, element_size=4, align=64, world_size=4
    )
    assert res.chunk_numel % (64 * 4) == 0
    assert res.chunk_numel * 4 <= 4 * 8192
    with pytest.raises(ConfigError, match="raise max_bytes"):
        search_chunk_size([10_000], max_bytes=1000, element_size=2)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 50), min_size=1, max_size=20),
    st.integers(0, 60),
    st.floats(0.01, 0.5),
)
def test_slack_takes_the_fewest_chunks_within_it_of_the_least_waste(numels, extra, slack):
    hi = max(numels) + extra
    res = search_chunk_size(numels, max_numel=hi, align=1, max_candidates=10_000, slack=slack)
    sizes = range(max(numels), hi + 1)
    waste = {s: 1 - sum(numels) / (len(pack(numels, s)) * s) for s in sizes}
    near = [s for s in sizes if waste[s] <= min(waste.values()) + slack]
    assert res.chunk_numel in near
    assert res.num_chunks == min(len(pack(numels, s)) for s in near)
    plain = search_chunk_size(numels, max_numel=hi, align=1, max_candidates=10_000)
    assert res.num_chunks <= plain.num_chunks


def test_slack_trades_padding_for_fewer_chunks():
    numels = [4, 4, 4, 4, 3]  # least waste: 5 chunks of 4 (5%); 3 chunks of 8 waste 20.8%
    assert search_chunk_size(numels, max_numel=8, align=1).num_chunks == 5
    assert search_chunk_size(numels, max_numel=8, align=1, slack=0.1).num_chunks == 5
    res = search_chunk_size(numels, max_numel=8, align=1, slack=0.2)
    assert (res.num_chunks, res.chunk_numel, res.padding_numel) == (3, 8, 5)
