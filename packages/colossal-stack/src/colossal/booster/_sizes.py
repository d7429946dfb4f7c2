"""Byte sizes as the plugins and the command line take them: ``512MiB``, ``2GB``, ``4096``."""

from __future__ import annotations

import re

from colossal_contracts import ConfigError

__all__ = ["parse_bytes"]

_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_UNITS.update({"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40})


def parse_bytes(value: int | str | None) -> int | None:
    """``512MiB``, ``2GB``, ``1.5G``, ``4096`` -> bytes; None stays None."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        if isinstance(value, int) and value < 0:
            raise ConfigError(f"a byte budget must be >= 0, got {value}")
        return value
    if not isinstance(value, str):
        raise ConfigError(
            f"a byte budget must be an int of bytes or a size such as '512MiB', got "
            f"{type(value).__name__} {value!r}"
        )
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?)?b?\s*", value.lower())
    if not m:
        raise ConfigError(
            f"cannot read {value!r} as a size; write bytes or a unit: 512MiB, 2GiB, 1.5GB"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])
