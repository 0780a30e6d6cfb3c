"""backend="auto" on CPU ranks: the default mode or JAX mode, whichever measured faster."""

import json
import logging
import subprocess

import pytest

import synkhronos as synk
from synkhronos.rank.backends import cpu_choice
from synkhronos.session import backend_choice


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """No SYNK_CPU_BACKEND, a fresh cache directory, and a fake measurement that counts
    its runs; set ``measured.seconds`` (or ``measured.error``) before choosing."""
    monkeypatch.delenv(cpu_choice.CHOICE_VAR, raising=False)
    monkeypatch.setenv(cpu_choice.CACHE_VAR, str(tmp_path))

    class Fake:
        seconds = {"cpu": 4.0e-3, "jax-cpu": 2.0e-3}
        error = None
        runs: list = []

        def __call__(self, float_x):
            self.runs.append(float_x)
            if self.error:
                raise self.error
            return dict(self.seconds)

    fake = Fake()
    monkeypatch.setattr(cpu_choice, "_measure_in_child", fake)
    return fake


@pytest.mark.parametrize(
    ("cpu_ms", "jax_ms", "expected"),
    [(4.0, 2.0, "jax-cpu"), (4.5, 4.0, "jax-cpu"), (4.3, 4.0, "cpu"), (3.0, 4.0, "cpu")],
)
def test_choose_needs_the_margin(cpu_ms, jax_ms, expected):
    assert cpu_choice.choose({"cpu": cpu_ms, "jax-cpu": jax_ms}) == expected


def test_measured_once_then_remembered(measured, monkeypatch, caplog):
    import pytensor

    assert cpu_choice.known_choice() is None  # it would measure
    with caplog.at_level(logging.INFO, logger="synkhronos"):
        assert cpu_choice.faster_cpu_backend() == "jax-cpu"
    assert "timing PyTensor's default and JAX modes" in caplog.text
    assert "takes 'jax-cpu' on this CPU" in caplog.text
    choice, why = cpu_choice.known_choice()
    assert choice == "jax-cpu" and why.startswith("measured on this machine"), why
    (kept,) = json.loads(cpu_choice.cache_file().read_text()).values()  # one key so far
    assert kept == {"choice": "jax-cpu", "seconds": measured.seconds}
    measured.seconds = {"cpu": 1.0, "jax-cpu": 9.0}  # not asked again: the file answers
    assert cpu_choice.faster_cpu_backend() == "jax-cpu"
    assert len(measured.runs) == 1
    other = "float64" if pytensor.config.floatX == "float32" else "float32"
    monkeypatch.setattr(pytensor.config, "floatX", other)  # another key: measured anew
    assert cpu_choice.faster_cpu_backend() == "cpu"
    assert measured.runs == [measured.runs[0], other]
    assert sorted(
        e["choice"] for e in json.loads(cpu_choice.cache_file().read_text()).values()
    ) == ["cpu", "jax-cpu"]  # both keys kept
    monkeypatch.setenv("PYTENSOR_FLAGS", "linker=py")  # flags change the timing: a new key
    cpu_choice.faster_cpu_backend()
    assert len(measured.runs) == 3
    # So does OpenBLAS's kernel choice, which the measuring child inherits.
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Prescott")
    cpu_choice.faster_cpu_backend()
    assert len(measured.runs) == 4


def test_failed_measurement_gives_cpu_and_is_not_kept(measured, caplog):
    measured.error = subprocess.SubprocessError("exit 1: boom")
    assert cpu_choice.faster_cpu_backend() == "cpu"
    assert "the measurement of the CPU backends failed (exit 1: boom)" in caplog.text
    assert caplog.records[-1].levelno == logging.WARNING
    assert not cpu_choice.cache_file().exists()


def test_environment_decides(measured, monkeypatch):
    monkeypatch.setenv(cpu_choice.CHOICE_VAR, "cpu")
    assert cpu_choice.faster_cpu_backend() == "cpu"
    monkeypatch.setenv(cpu_choice.CHOICE_VAR, "jax")
    with pytest.raises(ValueError, match="SYNK_CPU_BACKEND='jax'"):
        cpu_choice.faster_cpu_backend()
    assert measured.runs == []


def test_mpi_launcher_keeps_cpu(measured, monkeypatch):
    monkeypatch.setenv("PMI_RANK", "0")
    assert backend_choice.auto_cpu_backend()[0] == "cpu"
    monkeypatch.setenv(cpu_choice.CHOICE_VAR, "jax-cpu")
    assert backend_choice.auto_cpu_backend()[0] == "jax-cpu"
    assert measured.runs == []


def test_fork_auto_takes_the_choice(measured):
    pytest.importorskip("jax")
    n = synk.fork(2, use_gpu=False)  # use_gpu=False: auto among the CPU backends
    try:
        assert n == 2 and synk.backend() == "jax-cpu"
    finally:
        synk.close()


def test_real_measurement_in_a_child():
    pytest.importorskip("jax")
    seconds = cpu_choice._measure_in_child("float32")
    assert set(seconds) == {"cpu", "jax-cpu"}
    assert all(0 < s < 1 for s in seconds.values())


def test_jax_mode_with_float32_warns_of_64_bit_values(monkeypatch):
    """With floatX float32, JAX's 64-bit mode is off: a function with 64-bit values says
    they are computed in 32 bits; one without says nothing."""
    jax = pytest.importorskip("jax")
    import warnings

    import numpy as np
    import pytensor
    import pytensor.tensor as pt

    monkeypatch.setattr(pytensor.config, "floatX", "float32")
    x64 = jax.config.jax_enable_x64
    synk.fork(2, backend="jax-cpu")
    try:
        wide, narrow = pt.matrix("wide", dtype="float64"), pt.matrix("narrow", dtype="float32")
        with pytest.warns(
            UserWarning,
            match=r"wide \(float64\), output 0 \(float64\) are "
            r"computed as 32-bit",
        ):
            f = synk.function([wide], (wide.sum(), "sum"))
        assert f(np.array([[1e8], [1.0], [1.0], [1.0]])) == np.float32(1e8)  # as warned
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            g = synk.function([narrow], (narrow.sum(), "sum"))
        assert g(np.ones((4, 2), "float32")) == 8
    finally:
        synk.close()
        jax.config.update("jax_enable_x64", x64)
