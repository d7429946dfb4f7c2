"""``SafetensorsStream``: the header from specs first, then the bytes; readable by safetensors,
hashed as written (the digest equals a second read's), wrong tensors refused."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from colossal_contracts import CheckpointError
from colossal_zero._safetensors_stream import SafetensorsStream
from colossal_zero.checkpoint import TensorSpec, file_digest


def test_streamed_file_reads_back_and_its_digest_is_the_files(tmp_path):
    tensors = {
        "a": torch.randn(3, 5),
        "b": torch.arange(6, dtype=torch.bfloat16).view(2, 3),
        "c": torch.tensor([True, False, True]),
        "d": torch.tensor(7, dtype=torch.int64),
        "e": torch.randn(4, 6).t(),  # not contiguous: written row-major from a copy
    }
    path = tmp_path / "x.safetensors"
    with SafetensorsStream(path, [TensorSpec.of(n, t) for n, t in tensors.items()]) as s:
        for t in tensors.values():
            s.write(t)
    assert s.close() == file_digest(path)
    got = load_file(str(path))
    assert all(torch.equal(got[n], t) for n, t in tensors.items())
    with safe_open(str(path), framework="pt") as f:  # slices read without loading the file
        assert torch.equal(f.get_slice("a")[1:2], tensors["a"][1:2])


def test_wrong_or_missing_tensors_are_refused(tmp_path):
    specs = [TensorSpec("a", torch.float32, (2,)), TensorSpec("b", torch.float32, (3,))]
    with (
        pytest.raises(CheckpointError, match="declared"),
        SafetensorsStream(tmp_path / "y", specs) as s,
    ):
        s.write(torch.zeros(3))
    s = SafetensorsStream(tmp_path / "z", specs)
    s.write(torch.zeros(2))
    with pytest.raises(CheckpointError, match="not written"):
        s.close()


def test_range_reader_reads_slices_into_given_storage_and_names_corrupt_files(tmp_path):
    from safetensors.torch import save_file

    from colossal_zero._safetensors_stream import SafetensorsRangeReader

    a = torch.randn(100)
    save_file({"a": a, "s": torch.tensor([3.0])}, str(tmp_path / "x.safetensors"))
    r = SafetensorsRangeReader(tmp_path / "x.safetensors")
    dst = torch.zeros(200)
    r.read_into("a", 30, dst[10:50])  # elements 30..70 into the middle of a larger buffer
    assert torch.equal(dst[10:50], a[30:70]) and not dst[:10].any() and not dst[50:].any()
    half = torch.zeros(10, dtype=torch.bfloat16)  # another dtype: through one host copy
    r.read_into("a", 0, half)
    assert torch.equal(half, a[:10].bfloat16())
    with pytest.raises(CheckpointError, match="fewer elements"):
        r.read_into("a", 95, torch.zeros(10))
    assert r.keys() == {"a", "s"} and torch.equal(r.get("s"), torch.tensor([3.0]))
    r.close()
    for i, junk in enumerate((b"", b"\xff" * 16, (20).to_bytes(8, "little") + b"{not json" * 3)):
        (tmp_path / f"bad{i}").write_bytes(junk)
        with pytest.raises(CheckpointError, match="corrupt"):
            SafetensorsRangeReader(tmp_path / f"bad{i}")
