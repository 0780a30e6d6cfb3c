"""Log records from a worker to rank 0: one JSON line each, on a pipe of their own.

A worker's logging (the library's, and any other library's or routine's) is not printed
by the worker: :func:`forward_records` gives its root logger a :class:`RecordWriter`,
which writes every record, formatted, as one line to a pipe that rank 0 reads
(:mod:`synkhronos.session.worker_output`); rank 0 turns the line back into a record
(:func:`decode`) and hands it to its own logger of the same name, with the worker's rank
attached. The pipe carries nothing else, so no other output of the worker can garble a
record, and a record of any length arrives whole (each worker has its own pipe).

Examples
--------
>>> import logging
>>> record = logging.makeLogRecord({"name": "synkhronos.x", "levelno": 30,
...                                  "levelname": "WARNING", "msg": "%d left", "args": (3,)})
>>> decode(encode(record)).getMessage()
'3 left'
"""

from __future__ import annotations

import json
import logging
import os

LOG_FD_VAR = "SYNK_LOG_FD"  # the worker's end of its record pipe
LOG_LEVEL_VAR = "SYNK_LOG_LEVEL"  # the lowest level rank 0 may want a record of

# What a record keeps on its way (the message and traceback travel formatted).
_FIELDS = (
    "name",
    "levelno",
    "levelname",
    "pathname",
    "filename",
    "module",
    "lineno",
    "funcName",
    "created",
    "msecs",
    "relativeCreated",
    "thread",
    "threadName",
    "process",
    "processName",
    "stack_info",
)
_FORMATTER = logging.Formatter()


def encode(record: logging.LogRecord) -> bytes:
    """``record`` as one line of JSON: its fields, its message with the arguments put in,
    and its traceback as text."""
    fields = {key: getattr(record, key, None) for key in _FIELDS}
    fields["msg"] = record.getMessage()
    if record.exc_info and not record.exc_text:
        record.exc_text = _FORMATTER.formatException(record.exc_info)
    fields["exc_text"] = record.exc_text
    return json.dumps(fields, default=str).encode() + b"\n"


def decode(line: bytes) -> logging.LogRecord:
    """The record a line of :func:`encode` holds (its message final: no arguments)."""
    fields = json.loads(line)
    fields["args"] = None
    return logging.makeLogRecord(fields)


class RecordWriter(logging.Handler):
    """Writes each record, as :func:`encode` makes it, to the file descriptor ``fd``.

    A record is written whole even when the pipe takes it in parts; one that cannot be
    written (rank 0 is gone) is dropped, as the process is about to be ended.
    """

    def __init__(self, fd: int):
        super().__init__()
        self.fd = fd

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = memoryview(encode(record))
            while data:
                data = data[os.write(self.fd, data) :]
        except BrokenPipeError:
            pass
        except Exception:  # noqa: BLE001 - logging's own way to report a failed record
            self.handleError(record)


def forward_records() -> None:
    """(Worker) Send every log record at or above rank 0's lowest wanted level to rank 0,
    if rank 0 gave this process a pipe for them (:data:`LOG_FD_VAR`)."""
    fd = os.environ.pop(LOG_FD_VAR, None)
    if fd is None:
        return
    os.set_inheritable(int(fd), False)  # this worker's own children have no rank 0 to reach
    root = logging.getLogger()
    root.addHandler(RecordWriter(int(fd)))
    root.setLevel(int(os.environ.pop(LOG_LEVEL_VAR, logging.WARNING)))


def lowest_level() -> int:
    """The lowest level any logger of this process lets through: what a worker must
    forward so that rank 0's loggers can decide as they would for their own records."""
    manager = logging.getLogger().manager
    loggers = [
        logging.getLogger(),
        *(logger for logger in manager.loggerDict.values() if isinstance(logger, logging.Logger)),
    ]
    return min(logger.getEffectiveLevel() for logger in loggers)
