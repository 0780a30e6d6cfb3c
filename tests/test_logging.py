"""What the library and the workers say: through ``logging``, workers' lines tagged with
their rank (switchable off), nothing lost when a worker writes much or dies."""

from __future__ import annotations

import ast
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import synkhronos as synk
from synkhronos.api import routines

ROOT = Path(__file__).resolve().parents[1]


def talk(state, lines):
    """A routine: each worker prints ``lines[0]`` lines and one to stderr, and logs a
    warning and an info record (an unfinished last line too)."""
    if state.rank:
        for i in range(int(lines[0])):
            print(f"line {i} of rank {state.rank}")
        print(f"error of rank {state.rank}", file=sys.stderr)
        logging.getLogger("synkhronos.tests").warning("rank %d warns", state.rank)
        logging.getLogger("other.library").info("rank %d informs", state.rank)
        print("unfinished", end="")
    return []


def die(state):
    """A routine: each worker prints, logs, then is killed before it can reply."""
    if state.rank:
        print(f"last words of rank {state.rank}")
        logging.getLogger("synkhronos.tests").error("rank %d dies", state.rank)
        os.kill(os.getpid(), signal.SIGKILL)
    return []


def _threads() -> set:
    return set(threading.enumerate())


def test_worker_records_reach_rank0_logging_with_their_rank(caplog, capfd):
    before = _threads()
    with caplog.at_level(logging.INFO):  # before the fork: the workers send what it lets by
        synk.fork(2, backend="cpu")
        routines.run(talk, np.array([3]))
        synk.close()  # every line and record a worker wrote is passed on by now
    assert _threads() <= before  # the reading thread ended
    (warned,) = [r for r in caplog.records if r.name == "synkhronos.tests"]
    assert warned.levelno == logging.WARNING and warned.rank == 1
    assert warned.getMessage() == "[rank 1] rank 1 warns"
    (informed,) = [r for r in caplog.records if r.name == "other.library"]
    assert informed.rank == 1 and informed.getMessage().endswith("rank 1 informs")
    out, err = capfd.readouterr()
    assert out.splitlines()[-4:] == [
        *(f"[rank 1] line {i} of rank 1" for i in range(3)),
        "[rank 1] unfinished",
    ]
    assert "[rank 1] error of rank 1\n" in err


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_the_rank_prefix_can_be_switched_off(how, capfd, caplog, monkeypatch):
    if how == "environment":
        monkeypatch.setenv("SYNK_RANK_PREFIX", "0")
        synk.fork(2, backend="cpu")
    else:
        synk.fork(2, backend="cpu", rank_prefix=False)
    try:
        routines.run(talk, np.array([1]))
    finally:
        synk.close()
    out, err = capfd.readouterr()
    assert "line 0 of rank 1\n" in out and "[rank" not in out
    assert "error of rank 1\n" in err and "[rank" not in err
    (warned,) = [r for r in caplog.records if r.name == "synkhronos.tests"]
    assert warned.getMessage() == "rank 1 warns" and warned.rank == 1


def test_nothing_is_lost_when_a_worker_writes_much_or_dies(caplog, capfd):
    synk.fork(2, backend="cpu")
    try:
        # About 2.5 MB: more than the pipe holds, while rank 0 waits for the routine.
        routines.run(talk, np.array([100_000]))
        with pytest.raises(synk.WorkerDied):
            routines.run(die)
    finally:
        synk.close()
    out, _ = capfd.readouterr()
    lines = [ln for ln in out.splitlines() if ln.startswith("[rank 1] line ")]
    assert lines == [f"[rank 1] line {i} of rank 1" for i in range(100_000)]
    assert out.endswith("[rank 1] unfinishedlast words of rank 1\n")  # the same line
    assert any(r.getMessage() == "[rank 1] rank 1 dies" for r in caplog.records)


@pytest.mark.parametrize("silenced", [False, True])
def test_warnings_show_without_logging_configured(tmp_path, silenced):
    """With no logging configuration, a worker's warning reaches rank 0's stderr (through
    logging's last resort), tagged, and its info record does not; a level on the
    "synkhronos" logger silences the library's records."""
    script = tmp_path / "user.py"
    silence = "logging.getLogger('synkhronos').setLevel(logging.ERROR)\n" if silenced else ""
    script.write_text(
        "import logging\nimport numpy as np\nimport synkhronos as synk\n"
        "from synkhronos.api import routines\nfrom test_logging import talk\n"
        f"{silence}synk.fork(2, backend='cpu')\n"
        "routines.run(talk, np.array([0]))\nsynk.close()\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("[rank 1] rank 1 warns\n" in done.stderr) is not silenced, done.stderr
    assert "informs" not in done.stderr
    assert "[rank 1] error of rank 1\n" in done.stderr  # printed, not logged


def test_the_library_never_prints():
    """Every message of the library goes through logging (``print`` nowhere)."""
    printing = []
    for path in (ROOT / "synkhronos").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "print"
            ):
                printing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not printing, printing
