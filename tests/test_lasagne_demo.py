"""demos/lasagne_mnist.py, a Lasagne-style script, trains on one process and on two ranks."""

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


@pytest.mark.slow  # about 13 s on one process, 16 s on two ranks (warm compile cache)
@pytest.mark.parametrize("ranks", [1, 2])
def test_lasagne_mnist_trains(ranks: int, tmp_path: Path) -> None:
    # FAST_COMPILE: the default (Numba) mode takes about 100 s to compile the CNN's graphs
    # on a cold cache; the graphs and the training are the same. The ranks inherit it.
    env = {**os.environ, "PYTENSOR_FLAGS": "mode=FAST_COMPILE"}
    result = subprocess.run(
        [sys.executable, str(DEMO), "--epochs", str(EPOCHS), "--samples", "300",
         "--ranks", str(ranks), "--no-download", "--data-dir", str(tmp_path / "no_mnist")],
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
    assert accuracy > 40  # ten classes: chance is 10 %; 67 % (1 rank) and 73 % (2) measured


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
