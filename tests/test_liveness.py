"""Rank 0's watchdog, with fake process facts: no process is started or stopped."""

import os

import pytest

from synkhronos.session import liveness
from synkhronos.session.liveness import Watchdog, has_children, process_state
from synkhronos.transport.channel import WorkerHung


def test_process_state_of_this_process_and_of_none():
    state, ticks = process_state(os.getpid())
    assert state == "R" and ticks >= 0
    assert process_state(2**22 + 12345) == ("X", 0)  # above the kernel's pid limit
    assert not has_children(2**22 + 12345)


@pytest.fixture
def facts(monkeypatch):
    """Fake /proc facts and clock, per pid: state, CPU ticks, children."""
    table = {"now": 100.0, 11: ["S", 5, False], 12: ["S", 7, False]}
    monkeypatch.setattr(liveness.time, "monotonic", lambda: table["now"])
    monkeypatch.setattr(liveness, "process_state", lambda pid: tuple(table[pid][:2]))
    monkeypatch.setattr(liveness, "has_children", lambda pid: table[pid][2])
    return table


def test_a_rank_without_progress_is_named(facts):
    beats = {1: 0, 2: 0}
    dog = Watchdog([11, 12], beats.__getitem__, timeout=2.0)
    dog.check()  # baseline
    facts["now"] += 1.5
    facts[11][1] += 1  # rank 1 computes
    dog.check()
    facts["now"] += 1.5  # rank 2: 3 s without progress
    facts[11][1] += 1
    with pytest.raises(WorkerHung, match=r"rank 2 \(pid 12\).*2 s \(it is sleeping\)"):
        dog.check()


@pytest.mark.parametrize("progress", ["heartbeat", "ticks", "running", "child"])
def test_each_kind_of_progress_keeps_a_rank_alive(facts, progress):
    beat = [0]
    dog = Watchdog([11], lambda rank: beat[0], timeout=1.0)
    dog.check()
    for _ in range(5):
        facts["now"] += 0.8
        if progress == "heartbeat":
            beat[0] += 1
        elif progress == "ticks":
            facts[11][1] += 1
        elif progress == "running":
            facts[11][0] = "R"
        else:
            facts[11][2] = True
        dog.check()


def test_arm_takes_a_fresh_baseline_and_none_never_fires(facts):
    dog = Watchdog([11], lambda rank: 0, timeout=1.0)
    dog.check()
    facts["now"] += 5.0
    dog.arm()  # a new command: the idle time before it does not count
    dog.check()
    facts["now"] += 0.5
    dog.check()
    facts[11][0] = "T"
    facts["now"] += 1.0
    with pytest.raises(WorkerHung, match=r"stopped \(SIGSTOP\)"):
        dog.check()
    never = Watchdog([11], lambda rank: 0, timeout=None)
    never.check()
    facts["now"] += 1e6
    never.check()
