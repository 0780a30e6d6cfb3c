"""synk.save / synk.load: a run saved, trained on, and resumed in a fresh process follows
the same trajectory, exactly; what must agree is checked; the file is written whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytensor
import pytest

from tests import checkpoint_runs

ROOT = Path(__file__).resolve().parents[1]
FLAGS = "mode=FAST_COMPILE"


def _resumed(backend: str, runs: dict[str, Path]) -> dict[str, tuple[list[float], list]]:
    """Resume each kind's file in one fresh process (a fork each): per kind, the losses
    of its steps and its state."""
    out = next(iter(runs.values())).with_name("resumed.npz")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTENSOR_FLAGS=FLAGS)
    args = [str(a) for kind, path in runs.items() for a in (kind, path)]
    done = subprocess.run(
        [sys.executable, checkpoint_runs.__file__, backend, str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    with np.load(out) as saved:
        return {
            kind: (
                saved[f"{kind}_losses"].tolist(),
                [saved[key] for key in saved.files if key.startswith(f"{kind}_state_")],
            )
            for kind in runs
        }


def _check_same(first: tuple, resumed: tuple) -> None:
    (losses, state), (resumed_losses, resumed_state) = first, resumed
    assert resumed_losses == losses  # exactly
    assert len(resumed_state) == len(state)
    for mine, theirs in zip(state, resumed_state, strict=True):
        assert np.array_equal(mine, theirs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every kind trained, saved and trained on here (rank 0 and its workers compile in
    mode FAST_COMPILE, as the resuming process does), then resumed in one fresh process:
    kind -> (the later steps here, the same steps resumed)."""
    folder = tmp_path_factory.mktemp("checkpoints")
    paths = {kind: folder / f"{kind}.ckpt" for kind in checkpoint_runs.KINDS}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTENSOR_FLAGS", FLAGS)
        patch.setattr(pytensor.config, "mode", "FAST_COMPILE")
        first = {kind: checkpoint_runs.first(kind, str(path)) for kind, path in paths.items()}
    resumed = _resumed("cpu", paths)
    return {kind: (first[kind], resumed[kind]) for kind in paths}


@pytest.mark.parametrize("kind", checkpoint_runs.KINDS)
def test_a_resumed_run_follows_the_same_trajectory(kind, runs):
    _check_same(*runs[kind])


@pytest.mark.gpu
def test_a_resumed_run_on_gpu_ranks(tmp_path):
    """GPU ranks (on CPU devices in CI): device arrays saved and loaded, and a fused
    training step (one XLA program) resumed exactly."""
    pytest.importorskip("jax")
    from synkhronos.rank.backends import gpu

    if not gpu.on_cpu_devices() and len(gpu.visible_gpus()) < 2:
        pytest.skip("needs 2 GPUs, or JAX_PLATFORMS=cpu")
    path = tmp_path / "run.ckpt"
    first = checkpoint_runs.first("extensions_train", str(path), backend="gpu")
    _check_same(first, _resumed("gpu", {"extensions_train": path})["extensions_train"])


@pytest.fixture(scope="module")
def session():
    """2 ranks with a function whose shared variables are of every kind: ``w`` (equal on
    every rank), ``acc`` (an update from each rank's rows: different per rank), ``rows``
    (sliceable data) and a random generator."""
    import pytensor.tensor as pt

    import synkhronos as synk

    synk.fork(2, backend="cpu")
    x = pt.matrix("x")
    w = pytensor.shared(np.arange(3.0), name="w")
    acc = pytensor.shared(np.zeros(()), name="acc")
    rows = pytensor.shared(np.zeros((4, 3)), name="rows")
    rng = pytensor.shared(np.random.default_rng(0), name="noise_rng")
    next_rng, noise = pt.random.normal(size=(), rng=rng, return_next_rng=True)
    f = synk.function(
        [x],
        (x @ w).sum() + rows.sum() + noise,
        updates=[(acc, acc + x.sum()), (rng, next_rng)],
        sliceable_shareds=[rows],
        mode="FAST_COMPILE",
    )
    yield synk, f, w, acc, rng
    synk.close()


def _manifest(path) -> dict:
    import json

    with np.load(path) as archive:
        return json.loads(bytes(archive["manifest"]).decode())


def test_what_must_agree_is_checked(session, tmp_path, rng):
    synk, f, w, acc, noise_rng = session
    f(rng.normal(size=(5, 3)))  # acc: each rank's sum of its rows
    path = tmp_path / "run.ckpt"
    with pytest.raises(ValueError, match=r"disagree on 1 shared variable\(s\) .*: acc "):
        synk.save(path)
    assert not path.exists() and os.listdir(tmp_path) == []
    synk.save(path, extra={"epoch": 3, "seen": [1, 2]}, per_rank=["acc"])
    kinds = {v["name"]: v["kind"] for v in _manifest(path)["variables"]}
    assert kinds == {"w": "same", "acc": "per_rank", "rows": "data", "noise_rng": "generator"}
    saved_acc = [synk.get_value(r, acc) for r in range(2)]
    saved_w = w.get_value()
    draws = [float(f(np.zeros((2, 3)))) for _ in range(2)]  # moves the generators
    synk.broadcast(w, np.zeros(3))
    extra = synk.load(path)
    assert extra["epoch"] == 3 and extra["seen"].tolist() == [1, 2]
    assert [synk.get_value(r, acc) for r in range(2)] == saved_acc
    for r in range(2):
        assert np.array_equal(synk.get_value(r, w), saved_w)
    assert [float(f(np.zeros((2, 3)))) for _ in range(2)] == draws  # the same draws again


def test_load_refuses_what_does_not_match(session, tmp_path):
    synk, f, w, acc, noise_rng = session
    path = tmp_path / "run.ckpt"
    synk.save(path, per_rank=[acc])
    with np.load(path) as archive:
        arrays = dict(archive)
    manifest = _manifest(path)
    manifest["n_ranks"] = 3
    arrays["manifest"] = np.frombuffer(__import__("json").dumps(manifest).encode(), np.uint8)
    np.savez(tmp_path / "three.npz", **arrays)
    with pytest.raises(ValueError, match="per-rank values of 3 ranks"):
        synk.load(tmp_path / "three.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(2))
    with pytest.raises(ValueError, match="is not a synkhronos checkpoint"):
        synk.load(tmp_path / "other.npz")
    w.set_value(np.zeros(4))  # another shape than the file's
    with pytest.raises(
        ValueError,
        match=r"shared variable \d, w .* has shape \(4,\) here, "
        r"\(3,\) in the checkpoint",
    ):
        synk.load(path)
    synk.broadcast(w, np.zeros(3))
    with pytest.raises(TypeError, match="numbers"):
        synk.save(path, extra={"name": "run"})


def test_a_checkpoint_is_replaced_whole_or_not_at_all(session, tmp_path, monkeypatch):
    synk, *_ = session
    from synkhronos.api import checkpoints

    path = tmp_path / "run.ckpt"
    synk.save(path, extra={"version": 1}, per_rank=["acc"])

    def broken(file, **arrays):
        file.write(b"PK half an archive")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoints.np, "savez", broken)
    with pytest.raises(OSError, match="disk full"):
        synk.save(path, extra={"version": 2}, per_rank=["acc"])
    assert os.listdir(tmp_path) == ["run.ckpt"]  # no partial file left
    assert synk.load(path)["version"] == 1
