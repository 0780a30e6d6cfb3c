"""synkhronos.transport.log_records without forking: a record's round trip through one
JSON line, the pipe writer, and the level a worker forwards."""

from __future__ import annotations

import json
import logging
import os
from threading import Thread

import pytest

from synkhronos.transport import log_records


def _record(**extra) -> logging.LogRecord:
    fields = {"name": "synkhronos.t", "levelno": 40, "levelname": "ERROR", "lineno": 7}
    return logging.makeLogRecord({**fields, **extra})


def test_a_record_and_its_traceback_survive_one_line():
    try:
        raise ValueError("bad \n value")
    except ValueError as error:
        record = _record(msg="%s of %d", args=("part", 3), exc_info=(type(error), error, None))
    line = log_records.encode(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    back = log_records.decode(line)
    assert back.getMessage() == "part of 3" and back.args is None
    assert (back.name, back.levelno, back.levelname, back.lineno) == (
        "synkhronos.t",
        40,
        "ERROR",
        7,
    )
    assert back.exc_text is not None and "ValueError: bad" in back.exc_text
    # A field JSON cannot hold travels as its text.
    odd = json.loads(log_records.encode(_record(msg="m", threadName=object())))
    assert odd["threadName"].startswith("<object object")


def test_the_writer_puts_whole_records_on_the_pipe():
    read, write = os.pipe()
    try:
        writer = log_records.RecordWriter(write)
        long = "x" * 100_000  # more than a pipe takes at once: it is written in parts
        lines = []
        with os.fdopen(read, "rb", closefd=False) as reader:
            for message in ("first", "second"):
                writer.emit(_record(msg=message))
                lines.append(reader.readline())
            thread = Thread(target=writer.emit, args=(_record(msg=long),))
            thread.start()
            lines.append(reader.readline())
            thread.join()
        assert [log_records.decode(x).getMessage() for x in lines] == ["first", "second", long]
    finally:
        os.close(read)
        os.close(write)


def test_a_record_for_a_gone_rank_0_is_dropped():
    read, write = os.pipe()
    os.close(read)
    try:
        log_records.RecordWriter(write).emit(_record(msg="lost"))  # no BrokenPipeError
    finally:
        os.close(write)


def test_forward_records_hands_the_root_logger_a_writer(monkeypatch):
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    read, write = os.pipe()
    monkeypatch.setenv(log_records.LOG_FD_VAR, str(write))
    monkeypatch.setenv(log_records.LOG_LEVEL_VAR, str(logging.INFO))
    try:
        log_records.forward_records()
        assert log_records.LOG_FD_VAR not in os.environ
        assert root.level == logging.INFO and not os.get_inheritable(write)
        logging.getLogger("synkhronos.t").info("to %s", "rank 0")
        with os.fdopen(read, "rb", closefd=False) as reader:
            assert log_records.decode(reader.readline()).getMessage() == "to rank 0"
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        os.close(read)
        os.close(write)
    log_records.forward_records()  # without a pipe: nothing changes
    assert root.handlers == handlers


@pytest.mark.parametrize("wanted", [logging.DEBUG, logging.ERROR])
def test_lowest_level_is_that_of_the_most_talkative_logger(wanted):
    root = logging.getLogger()
    chatty = logging.getLogger("synkhronos.test_lowest_level")
    saved = root.level, chatty.level
    try:
        root.setLevel(logging.ERROR)
        chatty.setLevel(wanted)
        others = [
            lg.getEffectiveLevel()
            for lg in root.manager.loggerDict.values()
            if isinstance(lg, logging.Logger) and lg is not chatty
        ]
        assert log_records.lowest_level() == min([wanted, logging.ERROR, *others])
    finally:
        root.setLevel(saved[0])
        chatty.setLevel(saved[1])
