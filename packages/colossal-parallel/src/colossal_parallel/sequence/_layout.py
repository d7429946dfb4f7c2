"""Which tokens of a sequence each ``sp`` rank holds.

[Note: sequence layouts] ``contiguous``: rank ``r`` holds tokens ``[r*T/p, (r+1)*T/p)``.
``zigzag``: the sequence is cut in ``2p`` equal chunks and rank ``r`` holds chunks ``r`` and
``2p-1-r``, in that order. Under causal attention a contiguous split gives the last rank ``p``
times the work of the first; the zigzag split gives every rank the same work (one early and one
late chunk), which is why ring attention uses it. Ulysses gathers whole sequences and needs the
contiguous order.
"""

from __future__ import annotations

from typing import Literal

import torch

from colossal_contracts import ConfigError

__all__ = ["SEQ_LAYOUTS", "SeqLayout", "check_sequence", "sequence_positions"]

SeqLayout = Literal["contiguous", "zigzag"]
SEQ_LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag")


def _parts(size: int, layout: str) -> int:
    if layout not in SEQ_LAYOUTS:
        raise ConfigError(f"sequence layout must be one of {SEQ_LAYOUTS}, got {layout!r}")
    return 2 * size if layout == "zigzag" else size


def check_sequence(seq_len: int, size: int, layout: str) -> None:
    """``ConfigError`` unless a sequence of ``seq_len`` splits over ``size`` ranks in ``layout``."""
    parts = _parts(size, layout)
    if seq_len % parts:
        raise ConfigError(
            f"a sequence of {seq_len} tokens cannot be split over sp={size} ranks ({layout} "
            f"layout: {parts} equal chunks); use a sequence length that is a multiple of {parts}"
        )


def sequence_positions(
    seq_len: int, size: int, coord: int, layout: str, device: torch.device | None = None
) -> torch.Tensor:
    """The positions (ascending within each chunk) of the tokens rank ``coord`` holds."""
    check_sequence(seq_len, size, layout)
    c = seq_len // _parts(size, layout)
    if layout == "contiguous":
        return torch.arange(coord * c, (coord + 1) * c, device=device)
    first = torch.arange(coord * c, (coord + 1) * c, device=device)
    second = torch.arange((2 * size - 1 - coord) * c, (2 * size - coord) * c, device=device)
    return torch.cat([first, second])
