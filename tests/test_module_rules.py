"""House rules over the ``kbgraph`` package and the ``loadtest`` scripts, read from their source
with ``ast``:

- no module reads another module's underscore names: an attribute access ``x._name``, where
  ``x`` is not ``self`` or ``cls``, whose ``_name`` some other module of the package defines
  (a module-level name, a class attribute or method, a ``self._name`` assignment, a slot) and
  the accessing module does not;
- nor imports one (``from kbgraph.x import _name``; a package's private module, as
  ``kbgraph.graphalgo._kernels``, is its package's own to import from);
- every module is at most ``MAX_LINES`` lines long (the tests' modules too);
- no import circle among the modules, an import inside a function or under
  ``TYPE_CHECKING`` counted as any other (``from kbgraph.a import b`` is an import of the
  module ``kbgraph.a.b`` when there is one, else of ``kbgraph.a``).

Underscore names of other libraries (``os._exit``) are theirs to allow; dunders are public.

The tests themselves test through public faces, and share helpers through ``tests/support.py``
and the helper modules beside it, never through a test module: at most
``MAX_TEST_PRIVATE_READS`` places in ``tests/`` read another object's underscore name
(``x._name``, ``getattr(x, "_name")``, ``monkeypatch.setattr(x, "_name", ...)``, an underscore
name or module imported from ``kbgraph``), each one a face too narrow to widen for a test alone.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT

PACKAGE = ROOT / "kbgraph"
CHECKED = (PACKAGE, ROOT / "loadtest")  # the module rules' scope
TESTS = ROOT / "tests"
MAX_LINES = 600
MAX_TEST_PRIVATE_READS = 10
ATTRIBUTE_CALLS = {"getattr", "setattr", "delattr", "hasattr"}
OWN = {"self", "cls"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _modules() -> list[Path]:
    return sorted(p for folder in CHECKED for p in folder.rglob("*.py"))


def _targets(node: ast.AST) -> Iterator[ast.expr]:
    if isinstance(node, ast.Assign):
        yield from node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        yield node.target


def _names_in(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _names_in(element)
    elif isinstance(target, ast.Starred):
        yield from _names_in(target.value)


def _self_attributes(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Attribute):
        if isinstance(target.value, ast.Name) and target.value.id in OWN:
            yield target.attr
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _self_attributes(element)


def defined(tree: ast.Module) -> set[str]:
    """The underscore names a module defines: at its top level, in its classes' bodies
    (methods, attributes, ``__slots__``) and as ``self._name`` / ``cls._name`` targets."""
    names: set[str] = set()
    scopes: list[list[ast.stmt]] = [tree.body]
    scopes.extend(c.body for c in ast.walk(tree) if isinstance(c, ast.ClassDef))
    for body in scopes:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(stmt.name)
            for target in _targets(stmt):
                names.update(_names_in(target))
                if isinstance(target, ast.Name) and target.id == "__slots__":
                    value = stmt.value  # type: ignore[union-attr]
                    if isinstance(value, ast.Tuple | ast.List | ast.Set):
                        names.update(
                            e.value
                            for e in value.elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        )
    for node in ast.walk(tree):
        for target in _targets(node):
            names.update(_self_attributes(target))
    return {n for n in names if _private(n)}


def foreign_accesses(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, ``x._name``) of every access to an underscore attribute of something that is
    not ``self`` or ``cls``."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in OWN:
            continue
        yield node.lineno, f"{ast.unparse(node.value)}.{node.attr}"


def private_imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, ``module._name``) of every ``from <kbgraph module> import _name``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and module.split(".")[0] != PACKAGE.name:
                continue
            for alias in node.names:
                if _private(alias.name):
                    yield node.lineno, f"{'.' * node.level}{module}.{alias.name}"


def violations(sources: dict[str, str]) -> list[str]:
    """``where: x._name (defined in ...)`` for each module of ``sources`` (name -> text) that
    reads an underscore name another of them defines and it does not."""
    trees = {name: ast.parse(text) for name, text in sources.items()}
    owners: dict[str, set[str]] = {}
    for name, tree in trees.items():
        for attr in defined(tree):
            owners.setdefault(attr, set()).add(name)
    found = []
    for name, tree in trees.items():
        for line, access in foreign_accesses(tree):
            attr = access.rsplit(".", 1)[1]
            others = owners.get(attr, set()) - {name}
            if others and name not in owners[attr]:
                found.append(f"{name}:{line}: {access} (defined in {', '.join(sorted(others))})")
        found.extend(f"{name}:{line}: imports {what}" for line, what in private_imports(tree))
    return found


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in _modules()}


def private_reads(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, what) of every read of another object's underscore name a test module makes:
    ``x._name`` (``x`` not ``self``/``cls``), ``getattr``/``setattr``/``delattr``/``hasattr``
    (``monkeypatch``'s too) with an underscore name, and an underscore name or private module
    imported from ``kbgraph``."""
    yield from foreign_accesses(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            name = node.args[1]
            if (
                called in ATTRIBUTE_CALLS
                and isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and _private(name.value)
            ):
                yield node.lineno, f"{called}(..., {name.value!r})"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE.name):
            for alias in node.names:
                if _private(alias.name):
                    yield node.lineno, f"from {node.module} import {alias.name}"


def test_no_module_reads_another_modules_underscore_names() -> None:
    assert violations(_sources()) == []


def module_name(path: Path) -> str:
    """``kbgraph/a/b.py`` -> ``kbgraph.a.b``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(name: str, is_package: bool, tree: ast.Module, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports, anywhere in its text."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:  # an attribute of a module: that module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each
    sorted: every import circle lies within one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def import_graph(sources: dict[str, tuple[bool, str]]) -> dict[str, set[str]]:
    """module name -> the modules it imports, of ``sources`` (name -> (is package, text))."""
    known = set(sources)
    return {
        name: imported(name, is_package, ast.parse(text), known)
        for name, (is_package, text) in sources.items()
    }


def test_no_import_circle_among_the_packages_modules() -> None:
    """Nor among the ``loadtest`` scripts' (they import kbgraph, never the other way)."""
    sources = {module_name(p): (p.name == "__init__.py", p.read_text()) for p in _modules()}
    assert circles(import_graph(sources)) == []


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        # a circle through a function-level import, and one under TYPE_CHECKING
        (
            {
                "k.a": (False, "from k.b import f\n"),
                "k.b": (False, "def f():\n    from k.a import g\n"),
                "k.c": (False, "import k.a\n"),
            },
            [["k.a", "k.b"]],
        ),
        (
            {
                "k.a": (
                    False,
                    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from k.b import B\n",
                ),
                "k.b": (False, "from k import a\n"),
            },
            [["k.a", "k.b"]],
        ),
        # a package's __init__ importing a module that imports the package back
        (
            {"k": (True, "from .b import f\n"), "k.b": (False, "from k import X\n")},
            [["k", "k.b"]],
        ),
        # downhill only: a package's module importing a sibling through the package's name
        (
            {
                "k": (True, ""),
                "k.a": (False, "from k import b\n"),
                "k.b": (False, "import os\n"),
            },
            [],
        ),
    ],
)
def test_the_circle_finder_finds_what_it_should(
    sources: dict[str, tuple[bool, str]], expected: list[list[str]]
) -> None:
    assert circles(import_graph(sources)) == expected


def test_every_module_is_at_most_600_lines() -> None:
    """The tests' own modules too: a test file that outgrows the bound is split by subject."""
    modules = [*_modules(), *sorted(TESTS.rglob("*.py"))]
    long = {
        str(path.relative_to(ROOT)): n
        for path in modules
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_tests_read_few_underscore_names_of_other_objects() -> None:
    reads = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, what in private_reads(ast.parse(path.read_text()))
    ]
    assert len(reads) <= MAX_TEST_PRIVATE_READS, "\n".join(reads)


def test_no_test_module_serves_others_as_a_library() -> None:
    """What tests share lives in ``tests/support.py`` and the helper modules beside it (the
    modules not named ``test_*``), never in a test module another imports."""
    borrowed = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}"
        for path in sorted(TESTS.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").startswith(("tests.test_", "tests.conftest"))
    ]
    assert borrowed == []


# --- the checker itself ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "reader", "expected"),
    [
        # a method, read through an instance
        ("class A:\n    def _m(self): ...\n", "def f(a):\n    return a._m()\n", True),
        # an instance field set in __init__
        ("class A:\n    def __init__(self):\n        self._x = 1\n", "y = a._x\n", True),
        # a slot, a class attribute, a module-level function
        ("class A:\n    __slots__ = ('_s',)\n", "a._s = 2\n", True),
        ("class A:\n    _k: int = 0\n", "print(A._k)\n", True),
        ("def _helper(): ...\n", "import m\nm._helper()\n", True),
        # tuple targets count as definitions
        ("class A:\n    def f(self):\n        self._a, self._b = 1, 2\n", "a._b\n", True),
        # self/cls, a name the reader defines too, another library's, a dunder: allowed
        (
            "class A:\n    def _m(self): ...\n",
            "class B:\n    def f(self):\n        self._m()\n",
            False,
        ),
        (
            "class A:\n    _k = 0\n",
            "class B:\n    _k = 1\n    def eq(self, o): return o._k\n",
            False,
        ),
        ("x = 1\n", "import os\nos._exit(0)\n", False),
        # importing another module's private name; a private module's public names are fine
        ("def _h(): ...\n", "from kbgraph.owner import _h\n", True),
        ("def _h(): ...\n", "from .owner import _h\n", True),
        ("def h(): ...\n", "from kbgraph._owner import h\n", False),
        ("x = 1\n", "from os import _exit\n", False),
        ("class A:\n    def __len__(self): ...\n", "a.__len__()\n", False),
    ],
)
def test_the_checker_finds_what_it_should(owner: str, reader: str, expected: bool) -> None:
    found = violations({"owner.py": owner, "reader.py": reader})
    assert bool(found) is expected, found


@pytest.mark.parametrize(
    ("test", "expected"),
    [
        ("x._y\n", ["x._y"]),
        ("a.b._c()\n", ["a.b._c"]),
        ("monkeypatch.setattr(m, '_LIMIT', 3)\n", ["setattr(..., '_LIMIT')"]),
        ("getattr(x, '_y')\n", ["getattr(..., '_y')"]),
        ("from kbgraph.graphalgo import _kernels\n", ["from kbgraph.graphalgo import _kernels"]),
        # one's own, a dunder, another library's import, a public name: not counted
        ("self._y\ncls._z\nx.__len__()\nfrom numpy import _core\nsetattr(x, 'y', 1)\n", []),
    ],
)
def test_the_test_counter_counts_what_it_should(test: str, expected: list[str]) -> None:
    assert [what for _line, what in private_reads(ast.parse(test))] == expected


def test_the_jetstream_package_names_its_modules() -> None:
    """``kbgraph/log/jetstream/__init__``'s list of its jobs names each of its modules, and
    only modules that exist (it once named a ``follower`` that was ``consumer.py``)."""
    package = PACKAGE / "log" / "jetstream"
    text = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    jobs = text.split("Along its jobs:", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"``([a-z_]+)``", jobs))
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    assert named == modules
