"""CPU ranks' backends and XLA's thread flags."""

import pytest

from synkhronos.rank.backends.cpu import XLA_ONE_THREAD, cpu_backend, jax_cpu_backend, xla_flags


def test_the_two_cpu_backends():
    cpu, jax_cpu = cpu_backend(), jax_cpu_backend()
    assert (cpu.name, cpu.mode, cpu.device_outputs) == ("cpu", None, False)
    assert (jax_cpu.name, jax_cpu.mode, jax_cpu.device_outputs) == ("jax-cpu", "JAX", False)
    assert cpu.writes_in_place and not jax_cpu.writes_in_place


@pytest.mark.parametrize(
    "flags, threads, expected",
    [
        ("", 1, XLA_ONE_THREAD),
        ("--xla_dump_to=/tmp/x", 1, f"--xla_dump_to=/tmp/x {XLA_ONE_THREAD}"),
        ("--xla_dump_to=/tmp/x", 3, "--xla_dump_to=/tmp/x"),
        ("--xla_cpu_multi_thread_eigen=true", 1, "--xla_cpu_multi_thread_eigen=true"),
    ],
)
def test_xla_flags_keep_the_users(flags, threads, expected):
    assert xla_flags(flags, threads) == expected
