import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from colossal_chunk._tier import Tier
from colossal_chunk.disk._store import DiskStore
from colossal_contracts import CapacityError, ConfigError, MemoryTier, TierName


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8]),
    st.integers(0, 300),
)
def test_disk_payloads_round_trip_bit_exactly(tmp_path_factory, dtype, numel):
    src = (torch.randn(numel) * 1000).to(dtype)
    store = DiskStore(tmp_path_factory.mktemp("d"))
    t = store.allocate("c0", numel, dtype)
    t.copy_(src)
    assert torch.equal(t, src)
    again = (
        torch.from_file(str(store.directory / "c0.bin"), shared=False, size=numel, dtype=dtype)
        if numel
        else t
    )
    assert torch.equal(again, src)  # the bytes really are in the file
    store.close()
    assert not list(store.directory.iterdir())


def test_temporary_directory_is_removed_on_close():
    store = DiskStore()
    store.allocate("a", 10, torch.float32)
    d = store.directory
    assert d.exists() and "a" in store
    store.close()
    assert not d.exists()


def test_unwritable_directory_is_a_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="disk_dir"):
        DiskStore(blocker / "sub")


def test_tier_refuses_to_exceed_capacity():
    t = Tier(TierName.ACCELERATOR, torch.device("cpu"), 100, emulated=True)
    assert isinstance(t, MemoryTier)
    t.reserve(60, what="a")
    with pytest.raises(CapacityError, match="60 of 100"):
        t.reserve(41, what="b")
    assert t.used_bytes == 60
    t.free(60)
    assert (t.used_bytes, t.peak_bytes) == (0, 60)
    with pytest.raises(RuntimeError, match="negative"):
        t.free(1)


def test_a_loan_lets_a_tier_exceed_its_capacity_until_it_ends():
    t = Tier(TierName.ACCELERATOR, torch.device("cpu"), 100, emulated=True)
    t.reserve(90, what="a")
    t.lend(30)  # [Note: warmup loan]
    t.reserve(40, what="b")
    assert (t.used_bytes, t.lent_bytes) == (130, 30)
    with pytest.raises(CapacityError, match="130 of 100"):
        t.reserve(1, what="c")
    t.end_loan()
    t.free(40)
    with pytest.raises(CapacityError, match="90 of 100"):
        t.reserve(11, what="d")
