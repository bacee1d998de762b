"""Layers only point down: a module never imports a project package from a layer above its own, nor a package
beside it in the same layer (see ARCHITECTURE.md). Checked on every import statement, at any depth in a file.

``benchmarks/`` and ``examples/`` sit above every layer: they may import any project package, and no project
package imports them (the tests may). A package is a process: the server's packages (``scheduling``, ``aggregation``,
``evaluation``) import nothing from the leaf's (``simulation``); what both run lives in ``common``. Inside ``benchmarks/`` the shared library (``lib``) imports no bench, and a
purpose (``perf``, ``repro``, ``peers``, ``checks``) imports only itself and ``lib``. No import circle anywhere,
benchmarks and examples included, imports inside functions included."""

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
ABOVE = ("benchmarks", "examples")  # above every layer: they import the project, the project never imports them
SHARED = "benchmarks.lib"  # what every purpose of benchmarks/ may import besides itself
SERVER = ("aggregation", "evaluation", "scheduling")  # the server's process
LEAF = "simulation"  # the leaf's process: the server never runs its code
MAX_TOP_BENCHMARKS = 12  # modules directly in benchmarks/ (the rest sit in a sub-package by purpose)


def project_imports(path: str) -> set[str]:
    """Top-level project packages a file imports (``benchmarks`` and ``examples`` included)."""
    tree = ast.parse(open(path).read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & (set(LEVEL) | set(ABOVE))


def upward_imports() -> list[str]:
    found = []
    for package, level in LEVEL.items():
        for root, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(root, name)
                for imported in project_imports(path):
                    if imported in ABOVE:
                        found.append(f"{os.path.relpath(path, REPO)} imports {imported} (above every layer)")
                    elif imported != package and LEVEL[imported] >= level:
                        found.append(
                            f"{os.path.relpath(path, REPO)} imports {imported} (layer {LEVEL[imported]} >= {level})"
                        )
    return found


def test_no_module_imports_from_its_own_layer_or_above():
    assert upward_imports() == []


def server_imports_of_the_leaf(root: str = REPO) -> list[str]:
    """Files of the server's packages that import the leaf's package (at any depth in the file)."""
    found = []
    for package in SERVER:
        for folder, _, files in os.walk(os.path.join(root, package)):
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                if LEAF in project_imports(path):
                    found.append(os.path.relpath(path, root))
    return found


def test_the_servers_packages_import_nothing_from_the_leafs():
    assert server_imports_of_the_leaf() == []


def test_the_process_check_sees_a_server_module_importing_the_leaf(tmp_path):
    (tmp_path / "scheduling").mkdir()
    (tmp_path / "scheduling" / "a.py").write_text("def f():\n    from simulation.bulk_link import LeafBulk\n")
    (tmp_path / "scheduling" / "b.py").write_text("from common.protocol import BULK\n")
    assert server_imports_of_the_leaf(str(tmp_path)) == [os.path.join("scheduling", "a.py")]


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from jobs.config import JobConfig\n    from benchmarks.lib import harness\n")
    assert project_imports(str(bad)) == {"jobs", "benchmarks"}


def module_name(path: str, root: str = REPO) -> str:
    """``jobs/run/driver.py`` -> ``jobs.run.driver``; a package's ``__init__.py`` -> the package."""
    parts = os.path.relpath(path, root)[: -len(".py")].split(os.sep)
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


def import_graph(anywhere: bool = False, root: str = REPO) -> dict[str, set[str]]:
    """Module -> the project modules it imports at import time (``anywhere``: in any statement, function bodies
    included, ``TYPE_CHECKING`` blocks not; ``from a import b`` counts ``a.b`` when that is a module, else ``a``).
    The project's packages, ``benchmarks`` and ``examples``; an example imported by its bare name (``examples/`` on
    ``sys.path``, as the examples and the benches that run them put it) counts as ``examples.<name>``."""
    paths = {}
    for package in (*LEVEL, *ABOVE):
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            paths.update(
                {
                    module_name(os.path.join(folder, f), root): os.path.join(folder, f)
                    for f in files
                    if f.endswith(".py")
                }
            )
    bare = {m.split(".", 1)[1]: m for m in paths if m.startswith("examples.") and m.count(".") == 1}
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
        if module.split(".")[0] in ABOVE:
            found = {bare.get(m, m) for m in found}
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


def benchmark_purpose(module: str) -> str:
    """``benchmarks.perf.bench_engine`` -> ``benchmarks.perf``; a module directly in ``benchmarks`` -> itself."""
    return ".".join(module.split(".")[:2])


def crossed_purposes(graph: dict[str, set[str]]) -> list[str]:
    """Imports inside ``benchmarks`` that cross its purposes: ``lib`` importing any bench, or a purpose importing
    another purpose than itself and ``lib``."""
    found = []
    for module, imported in sorted(graph.items()):
        if not module.startswith("benchmarks."):
            continue
        own = benchmark_purpose(module)
        for other in sorted(m for m in imported if m.startswith("benchmarks.")):
            allowed = {own} if own == SHARED else {own, SHARED}
            if benchmark_purpose(other) not in allowed and other != "benchmarks":
                found.append(f"{module} imports {other}")
    return found


def test_benchmarks_import_only_their_own_purpose_and_the_shared_library():
    assert crossed_purposes(import_graph(anywhere=True)) == []


def test_the_purpose_check_sees_a_bench_importing_another_purpose():
    graph = {
        "benchmarks.perf.a": {"benchmarks.lib.harness", "benchmarks.perf.b", "jobs.api", "examples.scaffold"},
        "benchmarks.perf.b": {"benchmarks.repro.c"},
        "benchmarks.lib.harness": {"benchmarks.perf.a"},
    }
    assert crossed_purposes(graph) == [
        "benchmarks.lib.harness imports benchmarks.perf.a",
        "benchmarks.perf.b imports benchmarks.repro.c",
    ]


def test_the_graph_has_benchmarks_and_examples_and_sees_their_cycles_inside_functions(tmp_path):
    """A cycle between two benches through an import inside a function, and between two examples through their
    bare names, are found; the same imports are no cycle at import time."""
    for folder in ("benchmarks", "benchmarks/perf", "examples", "jobs"):
        (tmp_path / folder).mkdir()
        if folder.startswith("benchmarks"):
            (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "benchmarks" / "perf" / "bench.py").write_text("def main():\n    from benchmarks.perf import report\n")
    (tmp_path / "benchmarks" / "perf" / "report.py").write_text("from benchmarks.perf.bench import GOAL\n")
    (tmp_path / "examples" / "one.py").write_text("import jobs.api\n\ndef f():\n    from two import g\n")
    (tmp_path / "examples" / "two.py").write_text("from one import f\n")
    (tmp_path / "jobs" / "api.py").write_text("")
    anywhere = import_graph(anywhere=True, root=str(tmp_path))
    assert anywhere["examples.one"] == {"examples.two", "jobs.api"}
    assert import_cycles(anywhere) == [
        ["benchmarks.perf.bench", "benchmarks.perf.report"],
        ["examples.one", "examples.two"],
    ]
    assert import_cycles(import_graph(root=str(tmp_path))) == []


def test_benchmarks_keep_at_most_a_few_modules_at_their_top():
    """The benches sit in a sub-package by purpose (``perf``, ``repro``, ``peers``, ``checks``, ``lib``)."""
    top = [f for f in os.listdir(os.path.join(REPO, "benchmarks")) if f.endswith(".py") and f != "__init__.py"]
    assert len(top) <= MAX_TOP_BENCHMARKS, sorted(top)


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
