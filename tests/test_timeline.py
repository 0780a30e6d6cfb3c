"""The per-rank timeline of forked ranks: every rank's spans, nested, on one clock; kept
when a worker dies; summarised by ``python -m synkhronos timeline`` (its reading and tables
without ranks: test_timeline_report.py)."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytensor
import pytensor.tensor as pt
import pytest
from conftest import shm_entries

import synkhronos as synk
from synkhronos.api import routines
from synkhronos.rank.backends import gpu
from synkhronos.rank.outputs import HOST_BYTES_VAR
from synkhronos.session import launch
from synkhronos.tools import timeline_report
from synkhronos.transport import trace

x = pt.matrix("x")


def _step(n_features: int):
    """A named function (the loss and its gradient, averaged over the rows), its shared
    variable, and its plain PyTensor twin."""
    w = pytensor.shared(np.linspace(-1, 1, n_features), name="w")
    loss = ((x @ w) ** 2).mean()
    outputs = [loss, pytensor.grad(loss, w)]
    f = synk.function([x], [(o, "avg") for o in outputs], name="train_step")
    return f, w, pytensor.function([x], outputs)


def _ranks_of(timeline: timeline_report.Timeline, name: str) -> dict[int, int]:
    return {r: sum(s.name == name for s in spans) for r, spans in timeline.spans.items()}


@pytest.mark.parametrize("n_ranks", [2, 3])
def test_every_rank_has_its_spans_nested_on_one_clock(tmp_path, rng, n_ranks):
    data = rng.standard_normal((23, 4))  # 23 rows: uneven shares on 2 and 3 ranks
    synk.fork(n_ranks, backend="cpu")
    try:
        f, w, plain = _step(4)
        f(synk.data(data))  # compiled outside the timeline
        path = tmp_path / "t.json"
        with synk.timeline(path):
            results = [f(synk.data(data[: 23 - k])) for k in range(3)]
            synk.all_reduce(w, "avg")
        assert not trace.running()
        f(synk.data(data))  # after the timeline: not in the file
    finally:
        synk.close()
    for k, got in enumerate(results):  # the timeline changes no result
        for value, expected in zip(got, plain(data[: 23 - k]), strict=True):
            np.testing.assert_allclose(value, expected, rtol=1e-12)

    timeline = timeline_report.read(path)  # raises if a rank's spans do not nest
    assert sorted(timeline.spans) == list(range(n_ranks))
    for name in ("CALL", "train_step", "select rows", "share outputs", "all_reduce"):
        assert _ranks_of(timeline, name) == dict.fromkeys(
            range(n_ranks), 3 if name != "all_reduce" else 1
        ), name
    assert _ranks_of(timeline, "COLLECTIVE") == dict.fromkeys(range(n_ranks), 1)
    for spans in timeline.spans.values():
        for span in spans:
            if span.name == "train_step":
                assert span.depth >= 1 and span.cat == "compute"  # within its command
    # One clock: each worker's share of a call lies within rank 0's command, between the
    # command being sent and rank 0's wait for the ranks ending.
    sends = [s for s in timeline.spans[0] if s.name == "send"]
    waits = [s for s in timeline.spans[0] if s.name == "wait for ranks"]
    for rank in range(1, n_ranks):
        calls = [s for s in timeline.spans[rank] if s.name in ("CALL", "COLLECTIVE")]
        assert len(calls) == len(sends) == len(waits) == 4
        for call, send, wait in zip(calls, sends, waits, strict=True):
            assert send.start <= call.start and call.start + call.dur <= wait.start + wait.dur
    # bytes moved: the commands' arrays from rank 0, each worker's replies
    assert timeline.moved[0]["command"] > 0
    assert all(timeline.moved[r]["reply"] > 0 for r in range(1, n_ranks))
    assert all(timeline.moved[r]["collective"] == 32 for r in range(n_ranks))  # 4 float64


def die_on_rank_1(state):
    """A routine for the test below: rank 1 is killed within the command."""
    if state.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return []


def test_a_killed_worker_keeps_its_spans(tmp_path, rng):
    path = tmp_path / "t.json"
    synk.fork(2, backend="cpu", timeline=path)
    session = launch.current()
    try:
        f, _, _ = _step(3)
        for _ in range(2):
            f(rng.standard_normal((7, 3)))
        with pytest.raises(synk.WorkerDied, match="rank 1 died"):
            routines.run(die_on_rank_1)
    finally:
        synk.close()
    assert not shm_entries(session.name)  # the worker's file too
    timeline = timeline_report.read(path)
    assert _ranks_of(timeline, "CALL") == {0: 2, 1: 2}
    assert _ranks_of(timeline, "train_step") == {0: 2, 1: 2}
    assert _ranks_of(timeline, "ROUTINE") == {0: 1, 1: 0}  # rank 1 died within it
    assert _ranks_of(timeline, "wait for command")[1] == 4  # DISTRIBUTE, 2 CALLs, ROUTINE


def test_the_variable_records_from_fork_to_close(tmp_path, monkeypatch, rng):
    path = tmp_path / "env.json"
    monkeypatch.setenv(launch.TIMELINE_VAR, str(path))
    synk.fork(2, backend="cpu")
    try:
        f, _, _ = _step(3)
        f(rng.standard_normal((5, 3)))
        with pytest.raises(RuntimeError, match="one timeline at a time"):
            with synk.timeline(tmp_path / "other.json"):
                pass
    finally:
        synk.close()
    assert not (tmp_path / "other.json").exists()
    assert _ranks_of(timeline_report.read(path), "first call") == {0: 1, 1: 1}


def test_off_records_nothing(tmp_path, rng):
    synk.fork(2, backend="cpu")
    session = launch.current()
    try:
        f, _, _ = _step(3)
        f(rng.standard_normal((5, 3)))
        assert not trace.running()
        assert not [e for e in shm_entries(session.name) if "timeline" in e]
    finally:
        synk.close()


def test_the_command_prints_the_table_and_writes_the_picture(tmp_path, rng, capsys):
    path = tmp_path / "t.json"
    synk.fork(3, backend="cpu", timeline=path)
    try:
        f, _, _ = _step(3)
        for _ in range(4):
            f(rng.standard_normal((8, 3)))
    finally:
        synk.close()
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["args"]["name"] for e in events if e["ph"] == "M"} == {"rank 0", "rank 1", "rank 2"}
    assert timeline_report.main([str(path), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("|")}
    assert "rank 2: n, mean, total ms" in rows["phase"]
    assert rows["train_step"].count(", ") >= 3 * 2  # a cell on every rank
    png = tmp_path / "t.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
def test_gpu_ranks_mark_the_reduction_of_their_outputs(tmp_path, rng, monkeypatch):
    pytest.importorskip("jax")
    path = tmp_path / "gpu.json"
    monkeypatch.setenv(HOST_BYTES_VAR, "0")  # 12 bytes would go through the host replies
    n_ranks = synk.fork(2 if gpu.on_cpu_devices() else None, backend="gpu", timeline=path)
    try:
        xf = pt.matrix("xf", dtype="float32")
        f = synk.function([xf], (xf.sum(axis=0), "sum"), name="column_sums")
        data = rng.standard_normal((9, 3)).astype("float32")
        got = f(data)
    finally:
        synk.close()
    np.testing.assert_allclose(got, data.sum(axis=0), rtol=1e-5)
    timeline = timeline_report.read(path)
    for name in ("column_sums", "all_gather", "reduce"):  # the outputs met on the devices
        assert _ranks_of(timeline, name) == dict.fromkeys(range(n_ranks), 1), name
    assert all(timeline.moved[r]["collective"] == 12 for r in range(n_ranks))  # 3 float32
