"""synkhronos.api.calls without forking: the rule for reusing a kept call, the kept call's
matching of arguments, and what every call's command does around it (a session stand-in
that runs rank 0's part and records what the call asked of it)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from synkhronos.api import calls
from synkhronos.api.calls import KeptCall, reuses, run_command
from synkhronos.api.planning import PLAIN, CallOptions
from synkhronos.transport.shared_arrays import Data


class _Agreed:
    def __init__(self):
        self.agreed: list = []

    def agree(self, variables):
        self.agreed += list(variables)


class _Session:
    """What run_command uses of a session: execute runs ``local(*args)``."""

    def __init__(self, n_ranks=1, verify_every=None, timeline_path=None, sliceable_ids=()):
        self.n_ranks, self.verify_every, self.timeline_path = n_ranks, verify_every, timeline_path
        self.alone = n_ranks == 1
        self.sliceable_ids = set(sliceable_ids)
        self.agreed = _Agreed()
        self.commands: list = []
        self.forgotten = 0
        self.broken = False

    def execute(self, code, arrays, local, args=()):
        self.commands.append((code, arrays))
        return local(*args)

    def forget_lengths(self):
        self.forgotten += 1


def test_the_rule_for_reusing_a_kept_call():
    session = _Session()
    assert reuses(session, PLAIN) and reuses(session, CallOptions(num_slices=1))
    assert not reuses(session, CallOptions(batch=3))
    assert not reuses(session, CallOptions(output_subset=[0]))
    session.timeline_path = "/tmp/timeline.json"  # a timeline shows the plan: none kept
    assert not reuses(session, PLAIN)


def _kept(args, hosts, count=None):
    return KeptCall(args, hosts, len(args) if count is None else count, ["message"], None, True)


def test_a_kept_call_matches_the_same_data_of_the_same_layouts():
    x, c = Data(np.zeros((5, 3))), Data(np.float64(2.0))
    kept = _kept((x, c), [None, None])
    assert kept.matches((x, c))
    x.data[:] = 1.0  # in place: the same layout
    assert kept.matches((x, c))
    assert not kept.matches((c, x)) and not kept.matches((x,)) and not kept.matches((x, c, c))
    assert not kept.matches((Data(np.zeros((5, 3))), c))  # another Data alike
    assert not kept.matches((x.data, c))  # no numpy array in its place
    assert not kept.matches((x, 2.0))
    x.set_value(np.zeros((7, 3)))  # another length
    assert not kept.matches((x, c))


def test_a_kept_call_takes_numpy_arrays_only_like_its_own():
    x = Data(np.zeros((5, 3), np.float32))
    kept = _kept((x,), [((5, 3), np.dtype(np.float32))])
    assert kept.matches((np.ones((5, 3), np.float32),))
    assert kept.matches((x,))
    assert not kept.matches((np.ones((5, 3), np.float64),))
    assert not kept.matches((np.ones((6, 3), np.float32),))
    assert not kept.matches((np.ones((5, 6), np.float32)[:, ::2],))  # not C-contiguous
    unaligned = np.frombuffer(np.zeros(61, np.uint8).data, np.float32, 15, 1).reshape(5, 3)
    assert not unaligned.flags.aligned and not kept.matches((unaligned,))
    assert not kept.matches(([[0.0] * 3] * 5,))  # a list is no array


def test_a_chains_kept_call_matches_its_scattered_inputs_and_count_only():
    x = Data(np.zeros((4, 2)))
    kept = _kept((x,), [None], count=3)  # the broadcast inputs are checked by its run
    assert kept.matches((x, 1.0, np.float64(2)))
    assert not kept.matches((x, 1.0))


def test_keeping_a_call_keeps_no_data_alive():
    x = Data(np.zeros(3))
    kept = _kept((x,), [None])
    del x
    gc.collect()
    assert kept._refs[0]() is None


def test_run_command_records_what_the_call_wrote(monkeypatch):
    session = _Session(sliceable_ids={7})
    leaves = ["w"]
    got = run_command(session, 5, ["a"], lambda x: ("outputs", x), (3,), ["r"], (leaves, {3}))
    assert got == ("outputs", 3) and session.commands == [(5, ["a"])]
    assert session.agreed.agreed == [] and session.forgotten == 0  # one rank: no records
    run_command(session, 5, [], lambda: None, (), [], ([], {7}))  # wrote a sliceable variable
    assert session.forgotten == 1
    sent: list = []
    monkeypatch.setattr(calls, "send_changes", lambda s, reads: sent.append(reads))
    session.alone = False  # several ranks, on this node or others
    run_command(session, 5, [], lambda: None, (), ["r"], (leaves, set()))
    assert sent == [["r"]] and session.agreed.agreed == ["w"]


def test_run_command_notes_what_may_differ_on_an_error():
    session = _Session()

    def fails():
        raise ValueError("a step failed")

    with pytest.raises(ValueError, match="a step failed") as info:
        run_command(session, 5, [], fails, (), [], ([], {1}), note="the ranks may disagree on w")
    assert info.value.__notes__ == ["the ranks may disagree on w"]
    with pytest.raises(ValueError) as info:
        run_command(session, 5, [], fails, (), [], ([], set()))
    assert not getattr(info.value, "__notes__", None)
