"""Layers only point down: a module never imports a project package from a layer above its own, nor a package
beside it in the same layer (see ARCHITECTURE.md). Checked on every import statement, at any depth in a file."""

from __future__ import annotations

import ast
import os

from tests.conftest import REPO

# bottom to top; packages in one tuple are peers and must not import each other
LAYERS = [
    ("common",),
    ("processors",),
    ("simulation",),
    ("fedrevive",),
    ("aggregation", "evaluation", "scheduling"),
    ("jobs",),
]
LEVEL = {package: i for i, layer in enumerate(LAYERS) for package in layer}


def project_imports(path: str) -> set[str]:
    """Top-level project packages a file imports."""
    tree = ast.parse(open(path).read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & set(LEVEL)


def upward_imports() -> list[str]:
    found = []
    for package, level in LEVEL.items():
        for root, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(root, name)
                for imported in project_imports(path):
                    if imported != package and LEVEL[imported] >= level:
                        found.append(
                            f"{os.path.relpath(path, REPO)} imports {imported} (layer {LEVEL[imported]} >= {level})"
                        )
    return found


def test_no_module_imports_from_its_own_layer_or_above():
    assert upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from jobs.config import JobConfig\n")
    assert project_imports(str(bad)) == {"jobs"}


def module_name(path: str) -> str:
    """``jobs/run/driver.py`` -> ``jobs.run.driver``; a package's ``__init__.py`` -> the package."""
    parts = os.path.relpath(path, REPO)[: -len(".py")].split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runs_at_import(body: list[ast.stmt]):
    """The import statements a module executes when it is imported: its top level, its class bodies and the
    branches of its ``if``/``try``/``with`` blocks, but not function bodies, nor ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if test not in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                yield from _runs_at_import(node.body)
            yield from _runs_at_import(node.orelse)
        elif isinstance(node, (ast.Try, ast.With, ast.ClassDef)):
            for block in ("body", "orelse", "finalbody"):
                yield from _runs_at_import(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                yield from _runs_at_import(handler.body)


def _imports_anywhere(node: ast.AST):
    """Every import statement under ``node``, function bodies included, but not ``if TYPE_CHECKING:`` blocks (an
    annotation's name, never imported when the code runs)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for other in child.orelse:
                if isinstance(other, (ast.Import, ast.ImportFrom)):
                    yield other
                else:
                    yield from _imports_anywhere(other)
        else:
            yield from _imports_anywhere(child)


def import_graph(anywhere: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports at import time (``anywhere``: in any statement, function bodies
    included, ``TYPE_CHECKING`` blocks not; ``from a import b`` counts ``a.b`` when that is a module, else ``a``)."""
    paths = {}
    for package in LEVEL:
        for root, _, files in os.walk(os.path.join(REPO, package)):
            paths.update(
                {module_name(os.path.join(root, f)): os.path.join(root, f) for f in files if f.endswith(".py")}
            )
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        found = set()
        tree = ast.parse(open(path).read(), path)
        statements = _imports_anywhere(tree) if anywhere else _runs_at_import(tree.body)
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif node.level == 0 and node.module:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in paths else node.module)
        graph[module] = {m for m in found if m in paths and m != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_between_modules():
    assert import_cycles(import_graph()) == []


def test_no_import_cycle_even_through_imports_inside_functions():
    """A lazy import hides a cycle from the import-time check, not from a reader who follows it: none is left."""
    assert import_cycles(import_graph(anywhere=True)) == []


def test_the_cycle_check_sees_a_cycle_and_ignores_type_checking_imports(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import c\nimport b\n")
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert import_cycles(graph) == [["a", "b"]]
    assert [ast.unparse(n) for n in _runs_at_import(ast.parse(a.read_text()).body)] == [
        "from typing import TYPE_CHECKING",
        "import b",
    ]


MAX_LINES = 400
WHY_LONGER = "Over 400 lines:"  # how a module's docstring says why it is longer


def long_modules() -> list[str]:
    """Modules over ``MAX_LINES`` lines whose docstring does not say why (``WHY_LONGER``)."""
    found = []
    for top in (*LEVEL, "benchmarks", "examples", "tests"):
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(root, name)
                text = open(path).read()
                lines = text.count("\n")
                if lines > MAX_LINES and WHY_LONGER not in (ast.get_docstring(ast.parse(text)) or ""):
                    found.append(f"{os.path.relpath(path, REPO)}: {lines} lines")
    return found


def test_every_module_is_under_400_lines_or_says_why():
    assert long_modules() == []
