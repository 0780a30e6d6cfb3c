"""synkhronos.tools.timeline_report without ranks: nesting, the steps, the tables, and the
command on a timeline file written here."""

from __future__ import annotations

import pytest

from synkhronos.tools import timeline_report
from synkhronos.transport import trace


def test_spans_that_overlap_without_nesting_are_refused():
    spans = [
        timeline_report.Span(0, "a", "c", 0.0, 10.0),
        timeline_report.Span(0, "b", "c", 5.0, 10.0),
    ]
    with pytest.raises(ValueError, match="'b' .* overlaps 'a'"):
        timeline_report.nest(spans)
    inner = [
        timeline_report.Span(0, "a", "c", 0.0, 10.0),
        timeline_report.Span(0, "b", "c", 2.0, 3.0),
    ]
    timeline_report.nest(inner)
    assert [(s.depth, s.own) for s in inner] == [(0, 7.0), (1, 3.0)]


def test_the_last_steps_leave_other_commands_out():
    span = timeline_report.Span
    spans = {
        0: [
            span(0, "CHAIN", "command", 0.0, 10.0),
            span(0, "CALL", "command", 12.0, 50.0),  # an evaluation between two steps
            span(0, "collect outputs", "outputs", 63.0, 1.0),  # its results: before a step
            span(0, "CHAIN", "command", 70.0, 10.0),
            span(0, "CHAIN", "command", 82.0, 10.0),
        ],
        1: [span(1, "wait for command", "wait", 11.0, 60.0), span(1, "CHAIN", "command", 71, 8)],
    }
    for ranks_spans in spans.values():
        timeline_report.nest(ranks_spans)
    timeline = timeline_report.Timeline(spans)
    assert timeline_report.steps_of(timeline, 2) == [(62.0, 80.0), (80.0, 92.0)]
    rows = timeline_report.table(timeline, timeline_report.steps_of(timeline, 2)).splitlines()
    phases = {row.split("|")[1].strip(): row for row in rows[2:]}
    assert set(phases) == {"CHAIN", "collect outputs", "wait for command"}
    assert "| 2, 0.010, 0.02 " in phases["CHAIN"]  # rank 0's two steps, in ms


def test_the_command_reads_a_file_and_writes_the_tables_and_the_picture(tmp_path, capsys):
    def span(rank, name, cat, ts, dur):
        return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": rank}

    events = [{"name": "process_name", "ph": "M", "pid": r, "args": {}} for r in (0, 1)]
    for k in range(3):
        events += [
            span(0, "CALL", "command", 100.0 * k, 80.0),
            span(0, "compute", "compute", 100.0 * k + 10, 30.0 + k),
            span(1, "CALL", "command", 100.0 * k + 5, 70.0),
            span(1, "compute", "compute", 100.0 * k + 10, 60.0),
        ]
    events += [
        {"name": "bytes moved", "ph": "C", "ts": 1.0, "pid": 1, "args": {"reply": 10}},
        {"name": "bytes moved", "ph": "C", "ts": 2.0, "pid": 1, "args": {"reply": 25}},
        {"name": "bytes moved", "ph": "C", "ts": 2.0, "pid": 0, "args": {"command": 7}},
    ]
    path = tmp_path / "t.json"
    trace.write(path, events)
    timeline = timeline_report.read(path)
    assert timeline.moved == {1: {"reply": 25}, 0: {"command": 7}}
    assert [s.own for s in timeline.spans[1] if s.name == "CALL"] == [10.0] * 3
    assert timeline_report.bytes_table(timeline).splitlines()[2:] == [
        "| 0 | 7 | 0 |",
        "| 1 | 0 | 25 |",
    ]
    assert timeline_report.main([str(path), "--steps", "2", "--last", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("|")}
    # The last step only: one span each; rank 1's compute the slowest.
    assert "| 1, 0.032, 0.03 " in rows["compute"] and "| 1, 0.060, 0.06 " in rows["compute"]
    assert rows["compute"].split("|")[-3].strip() == "1"
    assert f"wrote {tmp_path / 't.png'}" in out
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no spans"):
        timeline_report.steps_of(timeline_report.Timeline(), 1)
