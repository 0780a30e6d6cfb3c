"""fork and close: arguments refused before anything starts, one session at a time,
SIGTERM's handler set and given back (one fork of 2 CPU ranks)."""

import signal

import pytest

import synkhronos as synk
from synkhronos.session import launch


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"verify_every": 0}, "verify_every must be a positive int or None, got 0"),
        ({"verify_every": 2.5}, "verify_every must be a positive int or None, got 2.5"),
        ({"timeout": 0}, "timeout must be a positive number of seconds or None, got 0"),
        ({"timeout": -1.0}, "timeout must be a positive number"),
        ({"n_parallel": 0}, "n_parallel must be a positive int, got 0"),
        ({"use_gpu": False, "backend": "gpu"}, "use_gpu=False asks for CPU ranks"),
        ({"backend": "tpu"}, "unknown backend 'tpu'"),
    ],
)
def test_arguments_refused_before_anything_starts(kwargs, match, monkeypatch):
    monkeypatch.setattr(launch, "_start_guardian", lambda: pytest.fail("started"))
    with pytest.raises(ValueError, match=match):
        synk.fork(**{"n_parallel": 2, "backend": "cpu", **kwargs})
    with pytest.raises(RuntimeError, match=r"call synk.fork\(\) first"):
        launch.current()


def test_no_session_to_close_or_name():
    synk.close()  # nothing to close: nothing happens
    with pytest.raises(RuntimeError, match="not running"):
        synk.backend()


def test_gpus_counted_from_the_environment(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    assert synk.get_n_gpu() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert synk.get_n_gpu() == 0


def test_one_session_at_a_time_and_sigterm_given_back():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert synk.fork(2, backend="cpu") == 2
    try:
        assert synk.backend() == "cpu" and launch.current().n_ranks == 2
        assert signal.getsignal(signal.SIGTERM) is launch._on_sigterm
        with pytest.raises(RuntimeError, match="already forked"):
            synk.fork(2, backend="cpu")
    finally:
        synk.close()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with pytest.raises(RuntimeError, match="not running"):
        launch.current()
    synk.close()
