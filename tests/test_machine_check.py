"""``python -m synkhronos check`` and ``sweep``: a clear non-zero exit when /dev/shm is too
small, leftovers of dead programs named with the command that removes them. (``make test``
runs the whole check, self-test included, on the test machine.)"""

from __future__ import annotations

import os
import subprocess
import sys

from synkhronos.tools import machine_check
from synkhronos.transport import names, shm


def test_a_tiny_dev_shm_is_a_clear_failure(monkeypatch):
    monkeypatch.setattr(shm, "free_bytes", lambda: 2**20)
    ran = []
    monkeypatch.setattr(machine_check, "self_test", lambda backend: ran.append(backend))
    said: list[str] = []
    assert machine_check.check(say=said.append) == 1
    assert not ran  # nothing forked on a /dev/shm that cannot hold it
    assert (
        "CANNOT WORK: /dev/shm has 1 MiB free, less than the 32 MiB synkhronos needs "
        "at least; free space there, or enlarge it (e.g. docker run --shm-size=8g)" in said
    )
    assert said[-1] == "failed"
    assert any(line.startswith("fork() would start: ") for line in said)


def test_leftovers_are_named_and_swept(capsys, tmp_path, monkeypatch):
    # In a folder of its own: in /dev/shm, a fork in another test process would sweep the
    # pretended dead program before the check lists it.
    monkeypatch.setattr(names, "SHM_DIR", str(tmp_path))
    prefix = f"synk_{os.getpid()}_{'e' * 16}"
    (tmp_path / f"{prefix}_s0_x").write_bytes(bytes(64))
    (tmp_path / f"{prefix}{names.LOCK_SUFFIX}").touch(0o600)  # unlocked: its program died
    lines, any_left = machine_check._leftovers()
    assert any_left and f"  {prefix}: 2 names, 0 MiB" in lines, lines
    assert lines[-1].endswith("-m synkhronos sweep")
    assert machine_check.main(["sweep"]) == 0
    assert f"{prefix}: removed 2 names, ended 0 worker(s)" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


def test_sweep_cache_removes_the_compile_caches(tmp_path):
    """A run with its own base compile folder leaves compiled code there; ``sweep --cache``
    removes it (in a child process: the compile folder is fixed when PyTensor starts)."""
    env = {**os.environ, "PYTENSOR_FLAGS": f"base_compiledir={tmp_path}"}
    compile_and_sweep = (
        "import numpy as np, pytensor, pytensor.tensor as pt\n"
        "from synkhronos.tools import machine_check\n"
        "x = pt.vector('x')\n"
        "pytensor.function([x], x * 2)(np.ones(3))\n"
        "folders = machine_check.cache_folders()\n"
        "print(all(f.is_dir() for f in folders))\n"
        "machine_check.main(['sweep', '--cache'])\n"
        "print(any(f.exists() for f in folders))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", compile_and_sweep], env=env, capture_output=True, text=True
    ).stdout.splitlines()
    assert out[0] == "True", out  # both folders were there
    assert any(line.startswith(f"removed {tmp_path}") for line in out), out
    assert out[-1] == "False", out  # and are gone
