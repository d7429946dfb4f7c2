"""The watchdog ([Note: watchdog]) on counters and a clock of the test's own: a frozen rank and
a stalled rank are named, slow steps, saves and finished ranks are not mistaken for them."""

from __future__ import annotations

import pytest

from colossal._watchdog import FROZEN_S, Watchdog, frozen_limit, stall_limit
from colossal_contracts import ConfigError


class _World:
    """Counters of every rank and a clock the test moves."""

    def __init__(self, world: int):
        self.now = 0.0
        self.counters = {(k, r): 0 for k in ("alive", "steps", "done") for r in range(world)}
        self.stopped: list[str] = []

    def read(self, kind: str, rank: int) -> int:
        return self.counters[(kind, rank)]

    def dog(self, rank: int) -> Watchdog:
        return Watchdog(rank, 3, self.read, stop_job=self.stopped.append, clock=lambda: self.now)

    def advance(self, seconds: float, dog: Watchdog, *, beating=(0, 1, 2), stepping=()) -> None:
        """``seconds`` pass in 1 s ticks; ``beating`` ranks beat, ``stepping`` ranks finish a
        step every second (this rank too, when it is among them)."""
        for _ in range(int(seconds)):
            self.now += 1.0
            for r in beating:
                self.counters[("alive", r)] += 1
            for r in stepping:
                self.counters[("steps", r)] += 1
                if r == dog.rank:
                    dog.step_done(1.0)
            dog.tick()


def test_a_frozen_rank_is_named_within_a_minute():
    w = _World(3)
    dog = w.dog(0)
    w.advance(10, dog, stepping=(0, 1, 2))
    w.advance(FROZEN_S + 2, dog, beating=(0, 2))  # rank 1 stopped: SIGSTOP
    assert len(w.stopped) == 1 and w.stopped[0].startswith("rank 1 stopped responding")
    assert FROZEN_S + 2 < 60


def test_a_rank_stuck_behind_the_others_is_named():
    w = _World(3)
    dog = w.dog(0)
    w.advance(5, dog, stepping=(0, 1, 2))
    w.counters[("steps", 1)] += 1  # rank 1 and 0 finished one more step; rank 2 is stuck
    dog.step_done(1.0)
    w.counters[("steps", 0)] += 1
    w.advance(stall_limit(dog.step_times) + 2, dog)
    assert len(w.stopped) == 1 and w.stopped[0].startswith("rank 2 stopped progressing"), w.stopped


def test_slow_steps_saves_and_finished_ranks_are_not_faults():
    w = _World(3)
    dog = w.dog(0)
    w.advance(3, dog, stepping=(0, 1, 2))
    for _ in range(3):  # steps of 30 s each: slower than before, but moving
        w.advance(30, dog)
        w.advance(1, dog, stepping=(0, 1, 2))
    dog.paused += 1  # a save of 100 s on every rank
    w.advance(100, dog)
    dog.paused -= 1
    w.advance(1, dog, stepping=(0, 1, 2))
    w.counters[("done", 2)] = 1  # rank 2 finished and left
    w.advance(FROZEN_S + 5, dog, beating=(0, 1), stepping=(0, 1))
    assert w.stopped == []


@pytest.mark.parametrize("times,limit", [([], 50.0), ([0.1] * 5, 40.0), ([2.2] * 5, 44.0)])
def test_stall_limit_follows_the_measured_steps_within_a_minute(times, limit):
    assert stall_limit(times) == pytest.approx(limit)


def test_a_lost_store_names_rank_0_only_during_training():
    w = _World(3)
    dog = w.dog(1)
    dog.store_lost()  # before the first step: a slow start, not a fault
    assert w.stopped == []
    w.advance(3, dog, stepping=(0, 1, 2))
    dog.paused += 1
    dog.store_lost()  # during a save: not judged
    dog.paused -= 1
    assert w.stopped == []
    dog.store_lost()
    assert len(w.stopped) == 1 and "rank 0, which hosts it" in w.stopped[0]
    w2 = _World(3)
    dog2 = w2.dog(1)
    w2.advance(3, dog2, stepping=(0, 1, 2))
    dog2.finished = True  # rank 0 finished and left with its store: the end of the run
    dog2.store_lost()
    assert w2.stopped == []


def test_the_heartbeat_limit_comes_from_the_environment_or_is_refused():
    assert frozen_limit({}) == FROZEN_S and frozen_limit({"COLOSSAL_HEARTBEAT_TIMEOUT": " "}) == 30
    assert frozen_limit({"COLOSSAL_HEARTBEAT_TIMEOUT": "12.5"}) == 12.5
    for bad in ("soon", "2", "nan", "inf", "-40"):
        with pytest.raises(ConfigError, match=r"COLOSSAL_HEARTBEAT_TIMEOUT=.* at least 5"):
            frozen_limit({"COLOSSAL_HEARTBEAT_TIMEOUT": bad})
