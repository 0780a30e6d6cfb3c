"""``python -m synkhronos port FILE_OR_DIR... [--check] [--diff]``: a Theano/Lasagne program's
import lines rewritten to :mod:`synkhronos.theano` and :mod:`synkhronos.extensions.lasagne`,
and the names it uses that the port does not provide.

The imports are found by Python's parser (:mod:`ast`, with the statements' source
positions) and only their text is replaced; every other character of the file stays as it
was, comments and formatting included. ``from theano.X import ...`` keeps its names list
and changes its module; ``import theano.X`` becomes ``from synkhronos import theano``
(which loads every submodule), ``import theano.X as Y`` becomes ``from synkhronos.theano
import X as Y``; Lasagne's likewise under ``synkhronos.extensions``.

The check imports the port's modules named by the program's imports (their names come
from the program, so they are imported by name) and reports, with its line, each module,
``from X import name`` and attribute chain (``T.nnet.foo``, ``theano.config.device``) that
the port lacks, each string naming a module of the port (the rewrite leaves strings as
they are), and each truth test of a parameter that defaults to None (``if not W:``: a
PyTensor variable has no truth value), before the program runs.

>>> print(port_source("import theano.tensor as T  # tensors\\nx = T.matrix()\\n"), end="")
from synkhronos.theano import tensor as T  # tensors
x = T.matrix()
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

__all__ = ["Gap", "find_gaps", "main", "port_source"]

# The port's home of each ported top-level package.
HOMES = {"theano": "synkhronos", "lasagne": "synkhronos.extensions"}
CONVERTER_HINT = (
    "not Python 3: a Python 2 program needs converting first (e.g. `futurize -w FILE` from "
    "the `future` package, or `2to3 -w FILE` on Python 3.12 or older), then porting"
)


def _ported(module: str) -> str | None:
    """The port's name for the Theano/Lasagne module ``module`` (None: not one of them)."""
    top = module.split(".")[0]
    return f"{HOMES[top]}.{module}" if top in HOMES else None


def _import_or_none(module: str) -> ModuleType | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _import_text(alias: ast.alias) -> str:
    """One name of an ``import`` statement, as a statement of its own, ported."""
    as_part = f" as {alias.asname}" if alias.asname else ""
    ported = _ported(alias.name)
    if ported is None:
        return f"import {alias.name}{as_part}"
    if alias.asname:  # the alias binds the submodule itself
        parent, _, last = ported.rpartition(".")
        return f"from {parent} import {last}{as_part}"
    # Importing the port's package loads all its submodules (a test checks it), so the name
    # the statement binds, the package, reaches theano.X.Y as before.
    top = alias.name.split(".")[0]
    return f"from {HOMES[top]} import {top}"


def _lines(text: str) -> list[str]:
    """``text``'s lines as Python counts them (str.splitlines also splits at form feeds)."""
    return io.StringIO(text, newline="").readlines()


def _from_module_span(segment: str) -> tuple[int, int]:
    """Character offsets, in a ``from X import ...`` statement's text, of ``X``."""
    tokens = tokenize.generate_tokens(io.StringIO(segment, newline="").readline)
    lines = _lines(segment)

    def offset(row: int, col: int) -> int:
        return sum(len(line) for line in lines[: row - 1]) + col

    start = end = None
    for token in tokens:
        if token.type == tokenize.NAME and token.string == "from" and start is None:
            continue
        if token.type == tokenize.NAME and token.string == "import":
            break
        if token.type in (tokenize.NAME, tokenize.OP):
            start = offset(*token.start) if start is None else start
            end = offset(*token.end)
    assert start is not None and end is not None, segment
    return start, end


def _char_offsets(source: str) -> list[int]:
    """The offset in ``source`` of each line's start (index 1 is line 1)."""
    offsets = [0, 0]
    for line in _lines(source):
        offsets.append(offsets[-1] + len(line))
    return offsets


def _position(source_lines: list[str], line_starts: list[int], lineno: int, col: int) -> int:
    """A node's position (its line and UTF-8 byte column, as :mod:`ast` gives) as an offset."""
    line = source_lines[lineno - 1]
    return line_starts[lineno] + len(line.encode()[:col].decode())


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        and any(_ported(a.name) for a in node.names)
        or isinstance(node, ast.ImportFrom)
        and node.level == 0
        and node.module
        and _ported(node.module)
    ]


def port_source(source: str, filename: str = "<source>") -> str:
    """``source`` with its Theano and Lasagne imports rewritten to the port's modules.

    Parameters
    ----------
    source : str
        A Python 3 program.
    filename : str
        For the syntax error's message.

    Returns
    -------
    str
        The same text but for the import statements.

    Raises
    ------
    SyntaxError
        If ``source`` does not parse; for Python 2 code the message says to convert it.
    """
    tree = _parse(source, filename)
    lines = _lines(source)
    starts = _char_offsets(source)
    edits = []
    for node in _imports(tree):
        assert node.end_lineno is not None and node.end_col_offset is not None
        start = _position(lines, starts, node.lineno, node.col_offset)
        end = _position(lines, starts, node.end_lineno, node.end_col_offset)
        if isinstance(node, ast.Import):
            edits.append((start, end, "; ".join(_import_text(a) for a in node.names)))
        else:
            ported = _ported(node.module or "")
            assert ported is not None  # _imports keeps Theano's and Lasagne's only
            name_start, name_end = _from_module_span(source[start:end])
            edits.append((start + name_start, start + name_end, ported))
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    return source


def _parse(source: str, filename: str) -> ast.Module:
    try:
        return ast.parse(source, filename)
    except SyntaxError as error:
        raise SyntaxError(f"{filename}:{error.lineno}: {error.msg}; {CONVERTER_HINT}") from None


@dataclass(frozen=True)
class Gap:
    """A Theano/Lasagne name a program uses that the port does not provide."""

    line: int
    name: str  # the original's dotted name, e.g. "theano.tensor.nnet.foo"
    reason: str

    def __str__(self) -> str:
        return f"{self.line}: {self.name}: {self.reason}"


def _module_gaps(node: ast.Import | ast.ImportFrom, bound: dict[str, str]) -> list[Gap]:
    """The gaps of one import statement; records in ``bound`` the names it binds to the
    original's dotted module paths."""
    gaps = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            ported = _ported(alias.name)
            if ported is None:
                continue
            if _import_or_none(ported) is None:
                gaps.append(Gap(node.lineno, alias.name, "no such module in the port"))
            top = alias.name.split(".")[0]
            bound[alias.asname or top] = alias.name if alias.asname else top
        return gaps
    assert node.module is not None
    ported = _ported(node.module)
    assert ported is not None
    module = _import_or_none(ported)
    if module is None:
        return [Gap(node.lineno, node.module, "no such module in the port")]
    for alias in node.names:
        if alias.name == "*":
            continue
        name = f"{node.module}.{alias.name}"
        if not hasattr(module, alias.name) and _import_or_none(f"{ported}.{alias.name}") is None:
            gaps.append(Gap(node.lineno, name, f"{ported} has no {alias.name}"))
        elif isinstance(getattr(module, alias.name, None), ModuleType):
            bound[alias.asname or alias.name] = name
    return gaps


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]`` (None if it does not start with a name)."""
    parts = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return [current.id, *reversed(parts)]


def _chain_gap(line: int, original: str, attributes: list[str]) -> Gap | None:
    """The first missing attribute of ``original.attr1.attr2...`` in the port: modules are
    followed, and one attribute of a non-module (``theano.config.device``) is checked."""
    ported = _ported(original)
    assert ported is not None
    value: object = _import_or_none(ported)
    path = original
    for attribute in attributes:
        if value is None:
            return None  # the module itself is reported where it is imported
        path = f"{path}.{attribute}"
        if not hasattr(value, attribute):
            return Gap(line, path, "not in the port")
        if not isinstance(value, ModuleType):
            return None
        value = getattr(value, attribute)
    return None


def _string_gap(node: ast.Constant) -> Gap | None:
    """A string that is the dotted name of a module the port has (``"lasagne.layers.dnn"``
    given to ``importlib.import_module``): the command rewrites import statements only.
    Undotted names (``backend = "theano"``) are left alone."""
    name = node.value
    if not isinstance(name, str) or "." not in name:
        return None
    if not all(part.isidentifier() for part in name.split(".")):
        return None
    ported = _ported(name)
    if ported is None or _import_or_none(ported) is None:
        return None
    return Gap(node.lineno, name, f"a module's name in a string, not rewritten: {ported}")


def _tested(node: ast.AST) -> list[ast.expr]:
    """The expressions ``node`` takes the truth value of (``if x:``, ``not x``, ``x or y``)."""
    if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
        return [node.test]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return [node.operand]
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    return []


def _truth_test_gaps(tree: ast.AST) -> list[Gap]:
    """Each truth test of a function's parameter that defaults to None (``if not W:``, the
    tutorials' way to make a weight the caller did not pass): a Theano variable was true,
    a PyTensor variable has no truth value, so the test raises where one is passed."""
    gaps = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        arguments = function.args
        positional = [*arguments.posonlyargs, *arguments.args]
        pairs = [
            *zip(
                positional[len(positional) - len(arguments.defaults) :],
                arguments.defaults,
                strict=True,
            ),
            *zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True),
        ]
        optional = {a.arg for a, d in pairs if isinstance(d, ast.Constant) and d.value is None}
        for node in ast.walk(function):
            for test in _tested(node):
                if isinstance(test, ast.Name) and test.id in optional:
                    gaps.append(
                        Gap(
                            test.lineno,
                            test.id,
                            f"a truth test of a parameter that defaults to None: a Theano "
                            f"variable was true, a PyTensor variable has no truth value "
                            f"(TypeError); write `{test.id} is None` (or `is not None`)",
                        )
                    )
    return gaps


def find_gaps(source: str, filename: str = "<source>") -> list[Gap]:
    """The Theano/Lasagne modules and names ``source`` uses that the port does not provide.

    Parameters
    ----------
    source : str
        A Python 3 program, before :func:`port_source`.
    filename : str
        For the syntax error's message.

    Returns
    -------
    list of Gap
        In line order; names reached through an attribute chain are checked while the
        chain goes through modules, and one step into a non-module; strings that name
        one of the port's modules (``"lasagne.layers"``) are listed too, as the port
        leaves them as they are.
    """
    tree = _parse(source, filename)
    bound: dict[str, str] = {}
    gaps = []
    for statement in _imports(tree):
        gaps.extend(_module_gaps(statement, bound))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):  # a.b.c and its prefix a.b: one gap, deduplicated
            chain = _attribute_chain(node)
            if chain and chain[0] in bound:
                gap = _chain_gap(node.lineno, bound[chain[0]], chain[1:])
                if gap:
                    gaps.append(gap)
        elif isinstance(node, ast.Constant):
            string_gap = _string_gap(node)
            if string_gap:
                gaps.append(string_gap)
    if bound:  # a program of Theano's or Lasagne's
        gaps.extend(_truth_test_gaps(tree))
    return sorted(set(gaps), key=lambda g: (g.line, g.name))


def _python_files(targets: list[Path]) -> list[Path]:
    """The ``.py`` files of ``targets`` (files, and folders walked outside hidden ones), in
    the order given, each once (a file named again, or inside a folder named too)."""
    files: list[Path] = []
    seen: set[Path] = set()
    for target in targets:
        walked = [target] if target.is_file() else sorted(target.rglob("*.py"))
        for path in walked:
            hidden = any(part.startswith(".") for part in path.relative_to(target).parts)
            if not hidden and path.resolve() not in seen:
                seen.add(path.resolve())
                files.append(path)
    return files


def _read(path: Path) -> str:
    with open(path, "rb") as raw:
        encoding, _ = tokenize.detect_encoding(raw.readline)
    with open(path, encoding=encoding, newline="") as text:
        return text.read()


def main(argv: list[str] | None = None) -> int:
    """``python -m synkhronos port FILE_OR_DIR... [--check] [--diff]``; returns the exit
    status: 1 if a file is not Python 3 or (with ``--check``) uses names the port lacks,
    else 0. Every file given, and every ``.py`` file under every folder given, is treated
    alike, and each is named in what is printed about it."""
    parser = argparse.ArgumentParser(
        prog="python -m synkhronos port",
        description="Rewrite a Theano/Lasagne program's imports to synkhronos' modules.",
    )
    parser.add_argument(
        "targets", nargs="+", type=Path, metavar="FILE_OR_DIR", help=".py files and folders"
    )
    parser.add_argument(
        "--check", action="store_true", help="report the names the port lacks; write nothing"
    )
    parser.add_argument("--diff", action="store_true", help="print a diff; write nothing")
    args = parser.parse_args(argv)
    missing = [str(target) for target in args.targets if not target.exists()]
    if missing:  # before any file is written
        parser.error(f"{', '.join(missing)}: no such file or folder")
    status = 0
    for path in _python_files(args.targets):
        source = _read(path)
        try:
            ported = port_source(source, str(path))
            gaps = find_gaps(source, str(path)) if args.check else []
        except SyntaxError as error:
            sys.stdout.write(f"{error.msg}\n")
            status = 1
            continue
        for gap in gaps:
            sys.stdout.write(f"{path}:{gap}\n")
        status = 1 if gaps else status
        if args.diff:
            old, new = _lines(source), _lines(ported)
            sys.stdout.writelines(difflib.unified_diff(old, new, str(path), str(path)))
        elif not args.check and ported != source:
            with open(path, "w", encoding="utf-8", newline="") as out:
                out.write(ported)
            sys.stdout.write(f"ported {path}\n")
    return status
