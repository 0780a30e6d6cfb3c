"""synkhronos.transport.trace in one process: spans, counters, collecting and writing the
trace-event file, and doing nothing when no timeline runs."""

from __future__ import annotations

import contextlib
import json
import os
import stat

import numpy as np
import pytest

from synkhronos.transport import trace
from synkhronos.transport.names import new_session_name, sweep


@pytest.fixture
def session():
    name = new_session_name()
    yield name
    trace.stop()
    sweep(name)


def test_off_nothing_is_recorded(session):
    assert not trace.running()
    with trace.span("x", "compute"):
        pass
    trace.mark("x", "wait", 0)
    trace.count_bytes("reply", [b"abc"])
    manager = contextlib.nullcontext()
    assert trace.around(manager, "x", "compute") is manager
    assert trace.collect(session, 2) == []


def test_spans_nest_count_bytes_and_name_their_error(session):
    trace.start(session, 0)
    assert trace.running()
    assert stat.S_IMODE(os.stat(trace.file_of(session, 0)).st_mode) == 0o600
    with trace.span("call", "rank 0", {"rows": 11}):
        with trace.around(contextlib.nullcontext(), "inner", "compute"):
            trace.count_bytes("command", [np.zeros(5, np.uint8), np.zeros(7, np.uint8)])
        trace.count_bytes("command", [np.zeros(3, np.uint8), b"no nbytes"])
        with pytest.raises(KeyError), trace.span("bad", "compute"):
            raise KeyError("x")
    trace.stop()
    events = trace.collect(session, 1, first_rank=4)
    meta, *rest = events
    assert meta == {"name": "process_name", "ph": "M", "pid": 4, "args": {"name": "rank 4"}}
    spans = {e["name"]: e for e in rest if e["ph"] == "X"}
    assert [e["args"]["command"] for e in rest if e["ph"] == "C"] == [12, 15]
    assert all(e["pid"] == 4 for e in rest)
    call, inner, bad = spans["call"], spans["inner"], spans["bad"]
    assert call["args"] == {"rows": 11} and bad["args"] == {"error": "KeyError"}
    for child in (inner, bad):  # nested within the outer span on one clock
        assert call["ts"] <= child["ts"] and child["ts"] + child["dur"] <= call["ts"] + call["dur"]
    assert trace.collect(session, 1) == [meta | {"pid": 0, "args": {"name": "rank 0"}}]


def test_a_cut_line_is_skipped_and_a_later_timeline_appends(session):
    trace.follow(True, session, 1)
    trace.mark("wait", "wait", 0, {"n": 1})
    trace.follow(False, session, 1)
    trace.follow(False, session, 1)  # stopped already: nothing happens
    trace.follow(True, session, 1)  # the session's file exists: appended to
    trace.mark("again", "wait", 0)
    trace.follow(False, session, 1)
    with open(trace.file_of(session, 1), "ab") as file:
        file.write(b'{"name":"cut sho')  # a worker killed within its write
    names = [e["name"] for e in trace.collect(session, 2)]
    assert names == ["process_name", "wait", "again"]  # rank 0 never recorded: no entry


def test_write_makes_a_chrome_trace_file(session, tmp_path):
    trace.start(session, 0)
    with trace.span("s", "compute"):
        pass
    trace.stop()
    events = trace.collect(session, 1)
    trace.write(tmp_path / "t.json", events, node=2)
    loaded = json.loads((tmp_path / "t.json").read_text())
    assert loaded == {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"node": 2}}
