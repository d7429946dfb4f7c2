"""[Note: chunk size per kind] and [Note: views bound once]: frozen and trainable chunks are sized
apart (``ChunkConfig.frozen_chunk_numel``), twins follow their parameter chunk, a re-pack and
a smaller size keep the kinds apart; and parameter views are re-pointed only when a chunk's
storage changed, still pointing at the right values after every move."""

import pytest
import torch

from colossal_chunk import ChunkConfig, ChunkManager
from colossal_contracts import ConfigError, TensorState, TierName

ACC, HOST = TierName.ACCELERATOR, TierName.HOST
BIG, SMALL = 3000, 100  # a frozen tensor's and a trainable one's elements


def _params() -> list[tuple[str, torch.nn.Parameter]]:
    torch.manual_seed(0)
    out = []
    for i in range(4):  # a large frozen matrix and a small trainable side path, in turn
        out.append((f"base{i}", torch.nn.Parameter(torch.randn(BIG), requires_grad=False)))
        out.append((f"side{i}", torch.nn.Parameter(torch.randn(SMALL))))
    return out


def _manager(**kw) -> tuple[ChunkManager, dict[str, torch.Tensor]]:
    named = _params()
    want = {n: p.detach().clone() for n, p in named}
    mgr = ChunkManager(ChunkConfig(device="cpu", **kw))
    mgr.register(named, frozen=[n for n, p in named if not p.requires_grad])
    return mgr, want


def test_each_kind_has_its_own_chunk_size_and_twins_follow():
    mgr, want = _manager(chunk_numel=256, frozen_chunk_numel=6144)
    assert (mgr.registry.chunk_numel, mgr.registry.frozen_chunk_numel) == (256, 6144)
    frozen = [c for c in mgr.registry.param_chunks() if c.frozen]
    trained = mgr.registry.trainable_chunks()
    assert [c.capacity for c in frozen] == [6144, 6144]  # two base matrices a chunk
    assert [c.capacity for c in trained] == [256, 256]  # two side paths a chunk
    twins = mgr.add_parallel("master", torch.float32, copy_params=True)
    assert sorted(t.capacity for t in twins) == [256, 256]
    # padding: 2 x 144 frozen and 2 x 56 trainable elements; with one size (6144) for both,
    # the trainable chunk would be 6144 - 400 elements of padding, each with a master
    assert sum(c.padding for c in mgr.registry.param_chunks()) == 2 * 144 + 2 * 56
    for c in mgr.registry.param_chunks():
        for name in c.records:
            assert torch.equal(mgr.registry.views.params[name].data, want[name])
    # a re-pack with new (fitted) sizes keeps each kind at its own size
    new = mgr.repack([n for n, _ in reversed(_params())], chunk_numel=128, frozen_chunk_numel=3072)
    assert (mgr.config.chunk_numel, mgr.config.frozen_chunk_numel) == (128, 3072)
    assert sorted({c.capacity for c in new if c.frozen}) == [3072]
    assert sorted({c.capacity for c in new if not c.frozen}) == [128]
    for name, value in want.items():
        assert torch.equal(mgr.registry.views.params[name].data, value)


def test_frozen_chunk_numel_defaults_to_chunk_numel():
    mgr, _ = _manager(chunk_numel=4096)
    assert mgr.registry.frozen_chunk_numel == 4096
    assert {c.capacity for c in mgr.registry.param_chunks()} == {4096}


@pytest.mark.parametrize("bad", [0, -5])
def test_bad_frozen_chunk_numel_is_refused(bad):
    with pytest.raises(ConfigError, match="frozen_chunk_numel"):
        ChunkConfig(chunk_numel=1024, frozen_chunk_numel=bad)
    with pytest.raises(ConfigError, match="raise chunk_numel"):  # a frozen tensor too large
        _manager(chunk_numel=4096, frozen_chunk_numel=1024)


def test_views_are_bound_once_and_follow_every_move(monkeypatch):
    mgr, want = _manager(chunk_numel=256, frozen_chunk_numel=6144)
    chunk = mgr.chunk_of("base0")
    views = []
    original = type(chunk).view
    monkeypatch.setattr(type(chunk), "view", lambda c, n: views.append(n) or original(c, n))
    names = list(chunk.records)
    mgr.access(names)  # host -> compute tier: new storage, the views follow
    assert len(views) == len(names)
    for n in names:
        assert torch.equal(mgr.registry.views.params[n].data, want[n])
    mgr.release(names)
    views.clear()
    for _ in range(3):  # storage unchanged: nothing is re-pointed
        mgr.access(names)
        mgr.release(names)
        mgr.move(chunk, ACC)
    assert views == []
    mgr.move(chunk, HOST)  # storage changed: re-pointed once, at the host payload
    assert views == names
    for n in names:
        assert torch.equal(mgr.registry.views.params[n].data, want[n])
        assert mgr.registry.views.params[n].data.data_ptr() == chunk.view(n).data_ptr()
    mgr.access(names)
    assert all(chunk.state(n) is TensorState.COMPUTE for n in names)
    for n in names:
        assert mgr.registry.views.params[n].data.data_ptr() == chunk.view(n).data_ptr()
