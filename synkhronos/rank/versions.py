"""The installed versions of synkhronos and of the packages the ranks compute with, as the
installed packages' metadata gives them (nothing is imported).

Examples
--------
>>> installed_versions(["numpy", "surely-not-installed"])["surely-not-installed"] is None
True
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable

__all__ = ["installed_versions"]


def installed_versions(packages: Iterable[str]) -> dict[str, str | None]:
    """Each package's installed version, None for one not installed (synkhronos itself
    run from a checkout without installing it, say)."""
    found: dict[str, str | None] = {}
    for package in packages:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found
