"""A worker's pipes read by rank 0's thread, with a shell in place of a worker (no fork of
ranks): lines tagged with the global rank, records to rank 0's loggers, nothing lost."""

import logging
import os

from synkhronos.session import worker_output
from synkhronos.session.worker_output import WorkerOutput, prefix_wanted
from synkhronos.transport.log_records import LOG_FD_VAR, encode


def _record(msg, level=logging.WARNING, name="synkhronos.tests"):
    record = logging.LogRecord(name, level, __file__, 1, msg, None, None)
    return encode(record).decode().rstrip("\n")


def _run(output, script, **env):
    """bash in place of worker 1, writing to its stdout, stderr and record pipe."""
    process = output.spawn(1, ["bash", "-c", script], dict(os.environ, **env))
    output.start()
    assert process.wait(timeout=30) == 0
    output.close()


def test_lines_and_records_tagged_with_the_global_rank(capfd, caplog):
    output = WorkerOutput(prefix=True, first_rank=4)
    script = (
        'echo one; echo two; echo oops >&2; printf "%s\\n" "$REC" >&$' + LOG_FD_VAR + "; "
        "printf unfinished"
    )
    with caplog.at_level(logging.INFO):
        _run(output, script, REC=_record("rank 5 warns"))
    out, err = capfd.readouterr()
    assert out.splitlines() == ["[rank 5] one", "[rank 5] two", "[rank 5] unfinished"]
    assert err == "[rank 5] oops\n"
    (record,) = [r for r in caplog.records if r.name == "synkhronos.tests"]
    assert record.rank == 5 and record.getMessage() == "[rank 5] rank 5 warns"


def test_without_prefix_the_worker_writes_to_rank_0s_terminal(capfd, caplog):
    output = WorkerOutput(prefix=False)
    with caplog.at_level(logging.INFO):
        _run(output, 'echo plain; printf "%s\\n" "$REC" >&$' + LOG_FD_VAR, REC=_record("said"))
    out, _ = capfd.readouterr()
    assert out == "plain\n"
    (record,) = [r for r in caplog.records if r.name == "synkhronos.tests"]
    assert record.rank == 1 and record.getMessage() == "said"


def test_a_record_cut_off_and_records_below_the_level(caplog):
    output = WorkerOutput(prefix=True)
    script = (
        'printf "%s\\n" "$INFO" >&$' + LOG_FD_VAR + "; "
        'printf "{\\"name\\": \\"synk" >&$' + LOG_FD_VAR
    )
    with caplog.at_level(logging.WARNING):
        _run(output, script, INFO=_record("quiet", logging.INFO))
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("synkhronos")]
    assert messages == ['[rank 1] (a record cut off) b\'{"name": "synk\'']


def test_a_long_line_is_passed_on_in_pieces(capfd, monkeypatch):
    monkeypatch.setattr(worker_output, "MAX_LINE", 1000)
    output = WorkerOutput(prefix=True)
    # more than one read takes (64 KiB), without a newline: passed on read by read
    _run(output, "printf 'x%.0s' {1..100000}")
    out, _ = capfd.readouterr()
    pieces = out.splitlines()
    assert len(pieces) >= 2 and all(p.startswith("[rank 1] x") for p in pieces)
    assert sum(len(p) - len("[rank 1] ") for p in pieces) == 100000


def test_prefix_wanted(monkeypatch):
    monkeypatch.setenv(worker_output.PREFIX_VAR, "0")
    assert not prefix_wanted() and prefix_wanted(True)
    monkeypatch.setenv(worker_output.PREFIX_VAR, "1")
    assert prefix_wanted() and not prefix_wanted(False)
    monkeypatch.delenv(worker_output.PREFIX_VAR)
    assert prefix_wanted()


def test_closing_twice_and_without_a_thread():
    output = WorkerOutput(prefix=True)
    output.close()
    output.close()
