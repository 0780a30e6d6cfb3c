#!/usr/bin/env bash
# Fetch, on a machine with the network, the wheels a lent GPU machine lacks, into .whl/
# (git-ignored). Its image has Python 3.12 with jax[cuda], cupy, numba, scipy, pytest and
# the rest; it lacks pytensor (and its small pure-Python dependencies), posix_ipc and
# threadpoolctl. bench/gpu_check.py's docstring gives the command to run there.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .whl \
    pytensor==3.0.7 posix_ipc==1.3.2 threadpoolctl==3.8.0 cons==0.4.7 etuples==0.3.10 \
    logical-unification==0.4.7 miniKanren==1.0.5
ls .whl
