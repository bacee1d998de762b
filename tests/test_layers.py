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
