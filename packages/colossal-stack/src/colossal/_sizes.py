"""Byte sizes as the command line, ``TrainConfig``, the plugins and ``colossal plan`` take them:
``512MiB``, ``2GB``, ``1.5 TB``, ``4096``. The one parser of sizes in the stack: each setting is
parsed (and so validated) once, where it enters, and travels as an int of bytes from there.

[Note: budgets] A tier's byte budget has one name from the job down: ``accelerator_bytes``,
``host_bytes`` and ``disk_bytes`` in ``TrainConfig.memory``, colossal-zero's ``GeminiConfig``
and colossal-chunk's ``ChunkConfig`` (the command line's ``--accelerator-budget`` and friends
are parsed into them). None and 0 mean the same in every layer: None is no limit (the whole
device for the accelerator), 0 is none of that tier, so ``disk_bytes=0`` (the default of the
job and of Gemini) is no disk tier and ``disk_bytes=None`` a disk tier without a limit. The
training job refuses ``disk_bytes=None``: it checks the disk directory's free space and the
tiers' room against a number before anything runs.
"""

from __future__ import annotations

import re

from colossal_contracts import ConfigError

__all__ = ["parse_bytes"]

_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_UNITS.update({"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40})


def parse_bytes(value: int | str | None, *, what: str = "a byte budget") -> int | None:
    """``512MiB``, ``2GB``, ``1.5G``, ``4096`` -> bytes; an int of bytes stays itself and None
    stays None. ``ConfigError`` naming ``what`` for a negative int or text that is not a size."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        if isinstance(value, int) and value < 0:
            raise ConfigError(f"{what} must be >= 0, got {value}")
        return value
    if not isinstance(value, str):
        raise ConfigError(
            f"{what} must be an int of bytes or a size such as '512MiB', got "
            f"{type(value).__name__} {value!r}"
        )
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?)?b?\s*", value.lower())
    if not m:
        raise ConfigError(
            f"cannot read {value!r} as a size ({what}: not a size); write bytes or a unit: "
            "512MiB, 2GiB, 1.5GB"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])
