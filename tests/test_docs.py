"""The Sphinx documentation builds without a single warning (as ``make docs`` requires)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx")

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = (
    "index",
    "install",
    "tutorial",
    "model",
    "porting",
    "api",
    "benchmarks",
    "scaling",
    "limitations",
    "lasagne",
    "asynchronous",
    "pymc",
    "nodes",
    "internals",
    "logging",
    "timeline",
    "checkpoints",
    "check",
)
API_IDS = (
    "synkhronos.fork",
    "synkhronos.api.functions.Function",
    "synkhronos.transport.shared_arrays.Data",
    "synkhronos.all_reduce",
    "synkhronos.save",
    "synkhronos.extensions.train.make_train_function",
)


def test_docs_build_without_warnings(tmp_path: Path) -> None:
    # A subprocess keeps Sphinx's global state (registries, mocked modules) out of pytest.
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(DOCS), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    for page in PAGES:
        assert (tmp_path / f"{page}.html").is_file(), page
    api = (tmp_path / "api.html").read_text()
    for name in API_IDS:  # autodoc really imported and documented the API
        assert f'id="{name}"' in api, name
