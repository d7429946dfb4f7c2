"""pytest plugin: the ``world`` fixture hands out one cached ``World`` per size per session."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ._world import World


@pytest.fixture(scope="session")
def world() -> Iterator[Callable[[int], World]]:
    """``world(n)`` returns the session's n-rank world, starting it on first use."""
    worlds: dict[int, World] = {}

    def get(n: int) -> World:
        if n not in worlds:
            worlds[n] = World(n)
        return worlds[n]

    yield get
    for w in worlds.values():
        w.close()
