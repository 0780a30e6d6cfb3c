"""Every module under ``synkhronos/`` is documented (no Sphinx build needed).

The rule: a core module (outside ``synkhronos.extensions``) is named in an ``automodule``
directive of ``docs/internals.rst``. An extension module is named in one of ``api.rst``,
``lasagne.rst`` or ``internals.rst``, or its package is named in one of the user pages and
imports from it (its public names are documented through the package, as the Lasagne layers
are).
"""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import synkhronos

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXTENSIONS = "synkhronos.extensions"
USER_PAGES = ("api.rst", "lasagne.rst", "asynchronous.rst")


def _modules() -> set[str]:
    found = {"synkhronos"}
    for info in pkgutil.walk_packages(synkhronos.__path__, "synkhronos."):
        found.add(info.name)
    return found


def _automodules(*pages: str) -> set[str]:
    text = "\n".join((DOCS / page).read_text() for page in pages)
    return set(re.findall(r"^\.\. automodule:: *(\S+)", text, re.MULTILINE))


def _documented_through_package(module: str, api: set[str]) -> bool:
    package, _, leaf = module.rpartition(".")
    if package not in api:
        return False
    init = ROOT.joinpath(*package.split("."), "__init__.py").read_text()
    return f"from {module} import" in init or f"from .{leaf} import" in init


def test_walk_finds_the_modules():
    modules = _modules()
    assert {"synkhronos.worker", "synkhronos.comm.shm", EXTENSIONS} <= modules


def test_core_modules_are_in_internals():
    core = {m for m in _modules() if not m.startswith(EXTENSIONS)}
    missing = core - _automodules("internals.rst")
    assert not missing, f"add an automodule directive to docs/internals.rst for {missing}"


def test_extension_modules_are_documented():
    api = _automodules(*USER_PAGES)
    named = api | _automodules("internals.rst")
    missing = {m for m in _modules() if m.startswith(EXTENSIONS) and m not in named
               and not _documented_through_package(m, api)}
    assert not missing, f"document {missing} with automodule in docs/api.rst or lasagne.rst"


def test_no_directive_names_a_missing_module():
    stale = _automodules(*USER_PAGES, "internals.rst") - _modules()
    assert not stale, stale
