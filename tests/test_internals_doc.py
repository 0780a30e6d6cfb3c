"""Every module under ``synkhronos/`` is documented (no Sphinx build needed).

The rule: a core module (outside ``synkhronos.extensions``) is named in an ``automodule``
directive of ``docs/internals.rst``. An extension module is named in one of ``api.rst``,
``lasagne.rst`` or ``internals.rst``, or its package is named in one of the user pages and
imports from it (its public names are documented through the package, as the Lasagne layers
are).
"""

from __future__ import annotations

import ast
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
        if not info.name.endswith(".__main__"):  # a script: importing it runs it
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
    assert {"synkhronos.worker", "synkhronos.transport.comm.shm", EXTENSIONS} <= modules


def test_every_module_path_imports_a_module():
    """No name a package exports hides its module of that name (``import synkhronos.x as
    m`` must give the module, not a function ``x``), and no module defines a function or
    class named like itself."""
    import importlib

    for module in _modules() - {"synkhronos"}:
        package, _, leaf = module.rpartition(".")
        imported = importlib.import_module(module)
        found = getattr(importlib.import_module(package), leaf, None)
        assert found is imported, f"{package}.{leaf} is {found!r}"
        own = getattr(imported, leaf, None)
        assert getattr(own, "__module__", None) != module, f"{module} defines {leaf}"


def test_core_modules_are_in_internals():
    core = {m for m in _modules() if not m.startswith(EXTENSIONS)}
    missing = core - _automodules("internals.rst")
    assert not missing, f"add an automodule directive to docs/internals.rst for {missing}"


def test_extension_modules_are_documented():
    api = _automodules(*USER_PAGES)
    named = api | _automodules("internals.rst")
    missing = {
        m
        for m in _modules()
        if m.startswith(EXTENSIONS) and m not in named and not _documented_through_package(m, api)
    }
    assert not missing, f"document {missing} with automodule in docs/api.rst or lasagne.rst"


def test_no_directive_names_a_missing_module():
    stale = _automodules(*USER_PAGES, "internals.rst") - _modules()
    assert not stale, stale


# The audiences of internals.rst's table, lowest layer first; a module may import from its
# own package and from packages of a lower layer only. "session" and "worker" share a layer,
# as do "transport" and "ops" (Theano's Ops: below the Theano face and the Lasagne port);
# "tools", the command-line tools, is the top one.
LAYERS = {
    "transport": 0,
    "ops": 0,
    "rank": 1,
    "session": 2,
    "worker": 2,
    "api": 3,
    "": 4,
    "theano": 5,
    "tools": 6,
}
# The training function's split: a package inside api, below the rest of it.
SPLIT = "synkhronos.api.split"


def _package(module: str) -> str:
    """The audience package of a core module ("" for synkhronos itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _source(module: str) -> Path:
    """The file of a synkhronos module or package."""
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _core_imports() -> dict[str, set[str]]:
    """Core module -> the synkhronos modules it imports (at any depth of its code)."""
    imports: dict[str, set[str]] = {}
    for module in _modules():
        if module.startswith(EXTENSIONS):
            continue
        found = set()
        for node in ast.walk(ast.parse(_source(module).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.level == 0, f"{module}: relative import of {node.module}"
                names = [f"{node.module}.{a.name}" for a in node.names]
                found.update(n if n in _modules() else node.module for n in names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        imports[module] = {m for m in found if m.startswith("synkhronos")}
    return imports


def test_tree_follows_the_audience_table():
    table = (DOCS / "internals.rst").read_text().split("One call's path")[0]
    listed = set(re.findall(r":mod:`~?(synkhronos[\w.]*)`", table))
    core = {m for m in _modules() if not m.startswith(EXTENSIONS)}
    assert {_package(m) for m in core} == set(LAYERS), "a core module outside the table"
    packages = {f"synkhronos.{p}" for p in LAYERS if p}
    assert packages <= listed, "every audience package is a row of the table"
    # every module outside the rank backends and communicators is named in its package's row
    leaves = {m for m in core - packages - {"synkhronos"} if m.count(".") == 2}
    assert leaves <= listed, f"name {leaves - listed} in internals.rst's table"
    # and so is every module of the split, a package inside api
    split = {m for m in core if m.startswith(f"{SPLIT}.")}
    assert split and split <= listed, f"name {split - listed} in internals.rst's table"


def test_imports_go_down_the_layers():
    for module, imported in _core_imports().items():
        for target in imported:
            # the extensions (the Lasagne port, the trainers) sit above the whole core
            assert not target.startswith(EXTENSIONS), f"{module} imports the extension {target}"
            own, theirs = _package(module), _package(target)
            if own == theirs:
                continue
            assert LAYERS[theirs] < LAYERS[own], (
                f"{module} (layer {own or 'synkhronos'}) imports {target} (layer "
                f"{theirs or 'synkhronos'}): imports go down internals.rst's table"
            )


def test_theano_face_maps_the_ops():
    """The Theano face takes Theano's Ops from ``synkhronos.ops``, as the Lasagne port
    does, and imports nothing from the extensions."""
    imports = _core_imports()
    theano = {t for m, found in imports.items() if _package(m) == "theano" for t in found}
    assert {"synkhronos.ops.nnet", "synkhronos.ops.pool", "synkhronos.ops.random_streams"} <= (
        theano
    )
    assert not {t for t in theano if t.startswith(EXTENSIONS)}
    ops = {t for m, found in imports.items() if _package(m) == "ops" for t in found}
    assert {_package(t) for t in ops} <= {"ops"}, "the Ops import no other synkhronos package"


def test_lasagne_port_takes_the_ops_from_the_core():
    """The Lasagne port imports the Ops from ``synkhronos.ops`` (it imports the Theano
    face only for the names of Lasagne's modules, ``theano`` and ``T``)."""
    port = ROOT / "synkhronos" / "extensions" / "lasagne"
    found = set()
    for path in port.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
    assert {"synkhronos.ops", "synkhronos.ops.nnet", "synkhronos.ops.pool"} <= found


def test_the_split_imports_nothing_else_of_api():
    """The split sits below the rest of api (training builds on it): it imports from its
    own modules and the lower packages only."""
    for module, imported in _core_imports().items():
        if module == SPLIT or module.startswith(f"{SPLIT}."):
            above = {m for m in imported if _package(m) == "api" and not m.startswith(SPLIT)}
            assert not above, f"{module} imports {above}"


def test_core_imports_have_no_cycles():
    graph = _core_imports()
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target in graph and not state.get(target):
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if not state.get(module):
            visit(module, [module])


# The core's functions stay short enough to read whole (issue #49); ruff's C901 (pyproject)
# bounds their branching.
MAX_FUNCTION_LINES = 60


def _lines_less_docstring(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    lines = function.end_lineno - function.lineno + 1
    first = function.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):
            lines -= first.end_lineno - first.lineno + 1
    return lines


def test_core_functions_are_short():
    long = []
    for module in sorted(_modules()):
        if module.startswith(EXTENSIONS) or _package(module) == "theano":
            continue
        for node in ast.walk(ast.parse(_source(module).read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = _lines_less_docstring(node)
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name} ({lines} lines)")
    assert not long, f"over {MAX_FUNCTION_LINES} lines less docstring: {long}"


def _test_file_of(module: str, stems: dict[str, int]) -> str:
    """``tests/test_<stem>.py``, or ``test_<folder>_<stem>.py`` where two modules of the core
    share the stem (``transport/shm.py`` and ``transport/comm/shm.py``)."""
    parts = module.split(".")
    stem = parts[-1]
    return f"test_{parts[-2]}_{stem}.py" if stems[stem] > 1 else f"test_{stem}.py"


def test_every_core_module_has_its_test_file():
    """A newcomer finds a module's tests by its name. The Theano face (re-exports, tested by
    ``test_theano_*.py``) and packages' ``__init__`` are outside the rule."""
    core = [
        m
        for m in _modules()
        if not m.startswith((EXTENSIONS, "synkhronos.theano"))
        and not ROOT.joinpath(*m.split("."), "__init__.py").exists()
    ]
    stems: dict[str, int] = {}
    for module in core:
        stems[module.rsplit(".", 1)[-1]] = stems.get(module.rsplit(".", 1)[-1], 0) + 1
    missing = sorted(
        f"{m} (tests/{_test_file_of(m, stems)})"
        for m in core
        if not (ROOT / "tests" / _test_file_of(m, stems)).exists()
    )
    assert not missing, "core modules without their test file: " + ", ".join(missing)
