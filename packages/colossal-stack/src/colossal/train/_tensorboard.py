"""``--log tensorboard``: the step records of ``metrics.jsonl`` also as TensorBoard scalars,
under the names TensorBoard users expect (``train/loss``, ``val/loss``, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from colossal_contracts import ConfigError

__all__ = ["SCALARS", "TensorBoardLog"]

# record key -> scalar tag; other numeric keys go under memory/ (bytes) or other/
SCALARS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "val_loss": "val/loss",
    "tokens_per_s": "perf/tokens_per_s",
    "step_time_s": "perf/step_time_s",
}


class TensorBoardLog:
    """A ``SummaryWriter`` under ``out/tensorboard`` (rank 0 only)."""

    def __init__(self, out: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise ConfigError(
                "--log tensorboard needs tensorboard: pip install 'colossal-stack[tensorboard]'"
            ) from err
        self.writer = SummaryWriter(log_dir=str(Path(out) / "tensorboard"))

    def add(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            tag = SCALARS.get(key) or (f"memory/{key}" if key.endswith("bytes") else f"other/{key}")
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
