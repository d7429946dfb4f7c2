"""Gemini's fp32 masters are filled as each is made (colossal-chunk's [Note: twins filled once]):
with the masters on the disk tier, setup leaves none of their pages mapped in the process (they
were, every one, until the first update staged them), and the masters hold the parameters'
original fp32 values, eager or lazy."""

import sys
from pathlib import Path

import pytest
import torch

from colossal_zero import GeminiConfig, LazyInit, apply_gemini

CHUNK = 32768


def _gpt():
    models = pytest.importorskip("colossal_models")
    cfg = models.GPTConfig(
        vocab_size=256, max_seq_len=32, num_layers=4, num_heads=2, hidden_size=64
    )
    return models.GPT(cfg)


def _mapped_bytes(under: Path) -> int:
    """Resident bytes of this process's mappings of files under ``under`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            inside = len(head) == 6 and head[5].startswith(str(under))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
@pytest.mark.parametrize("lazy_mode", [False, True], ids=["eager", "lazy"])
def test_disk_masters_leave_no_pages_mapped_and_hold_the_fp32_originals(tmp_path, lazy_mode):
    torch.manual_seed(0)
    want = {n: p.detach().clone() for n, p in _gpt().named_parameters()}  # fp32 originals
    torch.manual_seed(0)
    if lazy_mode:
        with LazyInit() as lazy:
            model = _gpt()
    else:
        model, lazy = _gpt(), None
    config = GeminiConfig(  # host room for two fp32 chunks: most masters go to disk
        precision="bf16", device="cpu", chunk_numel=CHUNK, accelerator_bytes=6 * CHUNK * 4,
        host_bytes=2 * CHUNK * 4, disk_bytes=None, disk_dir=tmp_path,
    )  # fmt: skip
    gm = apply_gemini(model, config, group=None, lazy=lazy)
    manager = gm.runtime.manager
    try:
        masters = [g.twin("master") for g in manager.groups.values() if not g.param.frozen]
        on_disk = [m for m in masters if m.tier.value == "disk"]
        assert len(on_disk) >= 3, "the case needs masters on disk"
        # no master's pages stay mapped (before: every disk master's, 4 bytes per element)
        assert _mapped_bytes(tmp_path) <= CHUNK * 4 // 2, _mapped_bytes(tmp_path)
        for m in masters:
            for name in m.records:
                view, a, b = m.shard_view(name)
                assert torch.equal(view.float(), want[name].reshape(-1)[a:b]), name
    finally:
        manager.close()
