"""demos/resnet50.py runs a data-parallel ResNet-50 step on 2 ranks, as a user would run it.

In a file of its own, apart from the other demos (tests/test_demos.py): it is the longest,
and the test processes (pytest-xdist) take a file at a time.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_demos import run_demo


@pytest.mark.slow
def test_resnet50(tmp_path: Path) -> None:
    out = run_demo(
        "resnet50.py",
        *("--ranks", "2", "--batch-size", "2", "--steps", "1", "--backend", "cpu"),
        cwd=tmp_path,
    )
    assert "images/s in total" in out
    # Every BatchNormLayer's running mean and inv_std: identical on both ranks, and moved.
    count, spread, moved = re.search(
        r"batch-norm running state: (\d+) variables, largest difference between ranks (\S+), "
        r"largest change since initialisation (\S+)",
        out,
    ).groups()
    assert int(count) == 2 * 53  # ResNet-50's 53 BatchNormLayers: mean and inv_std each
    assert float(spread) == 0.0 and float(moved) > 0.0
