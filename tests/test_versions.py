"""Installed versions, from the packages' metadata."""

import importlib.metadata

import numpy as np

from synkhronos.rank.versions import installed_versions


def test_versions_of_installed_and_missing_packages():
    found = installed_versions(["numpy", "pytensor", "surely-not-installed-pkg"])
    assert found["numpy"] == np.__version__
    assert found["pytensor"] == importlib.metadata.version("pytensor")
    assert found["surely-not-installed-pkg"] is None
    assert list(found) == ["numpy", "pytensor", "surely-not-installed-pkg"]
