"""fork's backend and rank count, from given machine facts (nothing measured or forked)."""

import logging

import pytest

from synkhronos.rank.backends import cpu_choice, gpu
from synkhronos.session import backend_choice


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A machine without MPI launcher, measurement or forced choice; set its GPU facts."""
    from synkhronos.transport import nodes

    for var in nodes.LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(cpu_choice.CHOICE_VAR, raising=False)
    monkeypatch.setenv(cpu_choice.CACHE_VAR, str(tmp_path))
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)

    def facts(gpus=(), missing=()):
        monkeypatch.setattr(gpu, "visible_gpus", lambda: list(gpus))
        monkeypatch.setattr(gpu, "gpu_packages_missing", lambda: list(missing))

    return facts


def test_gpus_with_the_extra_take_gpu(machine):
    machine(gpus=["0", "1"])
    assert backend_choice.auto_backend(deciding=False)[0] == "gpu"


def test_gpus_without_the_extra_warn_and_describe_the_cpu_choice(machine, caplog, monkeypatch):
    machine(gpus=["0"], missing=["JAX's CUDA plugin"])
    with caplog.at_level(logging.WARNING, "synkhronos"):
        choice, why = backend_choice.auto_backend(deciding=False)
    assert choice is None  # fork would measure the CPU backends first
    assert "JAX's CUDA plugin is missing" in why and "not measured" in why
    assert not caplog.records  # describing only
    monkeypatch.setenv(cpu_choice.CHOICE_VAR, "cpu")
    with caplog.at_level(logging.WARNING, "synkhronos"):
        assert backend_choice.auto_backend()[0] == "cpu"
    assert "JAX's CUDA plugin is missing" in caplog.text  # deciding: fork warns
    machine()
    assert backend_choice.auto_backend(deciding=False)[1].startswith("no GPU visible")


def test_forced_and_mpi_cpu_choices(machine, monkeypatch):
    machine()
    monkeypatch.setenv(cpu_choice.CHOICE_VAR, "jax-cpu")
    assert backend_choice.auto_cpu_backend() == ("jax-cpu", "SYNK_CPU_BACKEND=jax-cpu")
    monkeypatch.setenv("PMI_RANK", "0")  # a forced choice holds under MPI too
    assert backend_choice.auto_cpu_backend()[0] == "jax-cpu"
    monkeypatch.delenv(cpu_choice.CHOICE_VAR)
    choice, why = backend_choice.auto_cpu_backend()
    assert choice == "cpu" and "MPI launcher" in why


def test_chosen_backend_checks_its_arguments(machine, monkeypatch):
    machine()
    monkeypatch.setenv(cpu_choice.CHOICE_VAR, "cpu")
    with pytest.raises(ValueError, match="use_gpu=False.*backend='gpu'"):
        backend_choice.chosen_backend(False, "gpu")
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        backend_choice.chosen_backend(True, "tpu")
    assert backend_choice.chosen_backend(False, "auto") == "cpu"
    assert backend_choice.chosen_backend(True, "auto") == "cpu"  # no GPU visible


@pytest.mark.parametrize("n", [0, -2, 2.0, "2"])
def test_rank_count_must_be_a_positive_int(n):
    with pytest.raises(ValueError, match=f"n_parallel must be a positive int, got {n!r}"):
        backend_choice.ranks_and_gpus("cpu", n, None, 0)


def test_rank_count_default_is_the_cores():
    import os

    assert backend_choice.ranks_and_gpus("cpu", None, None, 0) == (
        len(os.sched_getaffinity(0)),
        None,
    )
    assert backend_choice.ranks_and_gpus("cpu", 3, None, 0) == (3, None)
