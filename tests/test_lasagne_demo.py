"""demos/lasagne_mnist.py, a Lasagne-style script, trains on one process, on two CPU ranks
and on two GPU ranks (CPU devices without a GPU); its own validation and weight-decay
functions (``theano.function``) run on rank 0 between the data-parallel steps."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[1] / "demos" / "lasagne_mnist.py"
EPOCHS = 6


@pytest.mark.slow  # about 13 s on one process, 16 s on two ranks, 66 s on two GPU ranks
@pytest.mark.parametrize(
    ("ranks", "backend"), [(1, "cpu"), (2, "cpu"), pytest.param(2, "gpu", marks=pytest.mark.gpu)]
)
def test_lasagne_mnist_trains(ranks: int, backend: str, tmp_path: Path) -> None:
    env = dict(os.environ)
    if backend == "cpu":
        # FAST_COMPILE: the default (Numba) mode takes about 100 s to compile the CNN's
        # graphs on a cold cache; the graphs and the training are the same. The ranks
        # inherit it. GPU ranks compile in JAX mode, and so do rank 0's own functions.
        env["PYTENSOR_FLAGS"] = "mode=FAST_COMPILE"
    else:
        pytest.importorskip("jax")
    result = subprocess.run(
        [sys.executable, str(DEMO), "--epochs", str(EPOCHS), "--samples", "300",
         "--ranks", str(ranks), "--backend", backend, "--no-download",
         "--data-dir", str(tmp_path / "no_mnist")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    assert f"{ranks} rank" in result.stdout
    losses = [float(v) for v in re.findall(r"training loss:\s+([\d.]+)", result.stdout)]
    accuracy = float(re.findall(r"validation accuracy:\s+([\d.]+)", result.stdout)[-1])
    assert len(losses) == EPOCHS and losses[-1] < losses[0]
    # Ten classes: chance is 10 %; 67 % (1 rank), 73 % (2 CPU ranks), 72.7 % (2 GPU ranks
    # on CPU devices, float32) measured.
    assert accuracy > 40
    # The weight decay: rank 0's own function of the parameters, after each epoch.
    penalties = [float(v) for v in re.findall(r"weight decay penalty:\s+([\d.]+)", result.stdout)]
    assert len(penalties) == EPOCHS and all(0 < p < 1 for p in penalties)


def _names_used_by_function(tree: ast.Module) -> dict[str, set[str]]:
    return {node.name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            for node in tree.body if isinstance(node, ast.FunctionDef)}  # fmt: skip


def test_demo_model_code_imports_only_the_port() -> None:
    """The model is Lasagne code whose synkhronos lines replace ``import lasagne`` and
    ``import theano``; synkhronos proper appears only where the session is forked and the
    training function's line says ``synk.function`` for ``theano.function``."""
    source = DEMO.read_text()
    imports = [line for line in source.splitlines()
               if line.startswith(("import ", "from ")) and "synkhronos" in line]  # fmt: skip
    assert imports == ["import synkhronos as synk",
                       "from synkhronos import theano",
                       "from synkhronos.extensions import lasagne",
                       "from synkhronos.theano import tensor as T  # noqa: N812 (Theano's "
                       "customary alias)"]  # fmt: skip
    assert "pytensor" not in source
    used = _names_used_by_function(ast.parse(source))
    assert {name for name, names in used.items()
            if "synk" in names} == {"compile_train_fn", "main"}  # fmt: skip
    assert "lasagne" in used["build_cnn"]
