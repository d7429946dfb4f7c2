"""``Booster.close()`` joins every background thread ([Note: clean exit]); a Booster left open is
closed at interpreter exit; the heartbeat thread is joined when the watch ends."""

from __future__ import annotations

import threading

import pytest
import torch

from colossal import Booster, GeminiPlugin
from colossal._peers import PeerWatch
from colossal.booster import GeminiConfig
from colossal_contracts import ConfigError
from colossal_models import GPT, GPTConfig


def _disk_tier(root):  # type: ignore[no-untyped-def]
    """Budgets small enough that chunks reach the disk tier (its reader and writer threads)."""
    return GeminiConfig(
        accelerator_bytes=2 << 20, host_bytes=1 << 20, disk_bytes=64 << 20, disk_dir=root
    )


def _ours() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("colossal-"))


def _train_steps(booster: Booster, steps: int = 2):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("nano"))
    model, opt = booster.boost(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(steps):
        booster.backward(model(x, x), opt)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt


def test_close_joins_the_disk_and_prefetch_threads(tmp_path):
    booster = Booster(GeminiPlugin(config=_disk_tier(tmp_path)))
    _train_steps(booster)
    assert _ours(), "this configuration should run background threads"
    booster.close()
    assert _ours() == []
    booster.close()  # idempotent


def test_booster_of_a_name_is_one_line():
    with pytest.raises(ConfigError, match="needs a plugin object such as GeminiPlugin"):
        Booster("gemini")  # type: ignore[arg-type]


class _Store:
    """The part of torch's store the heartbeat uses, in memory."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def add(self, key: str, n: int) -> int:
        return n

    def set(self, key: str, value: str) -> None:
        self.values[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.values[key]


def test_heartbeat_thread_is_joined_on_stop():
    watch = PeerWatch(0, 2, _Store())
    watch.start()
    assert "colossal-heartbeat" in _ours()
    watch.stop()
    assert "colossal-heartbeat" not in _ours()


def test_exit_hook_closes_a_booster_left_open_locally(tmp_path):
    booster = Booster(GeminiPlugin(config=_disk_tier(tmp_path)))
    _train_steps(booster)
    assert _ours()
    hook = booster._at_exit  # what atexit runs for a Booster never closed
    assert hook is not None
    hook()
    assert _ours() == []
