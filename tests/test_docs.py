"""The user docs name only what exists: every repository path, every ``python ...`` entry point and every relative
link in ``README.md``, ``ARCHITECTURE.md``, ``GPU_FIX_NOTES.md``, ``PERFORMANCE_OPTIMIZATION.md`` and ``docs/``
must resolve, so a renamed file or a retired script fails CI instead of misleading a reader. The README stays a
short guide (the depth goes in ``docs/``)."""

from __future__ import annotations

import glob
import importlib.util
import os
import re

import pytest

from tests.conftest import REPO

DOCS = ["README.md", "ARCHITECTURE.md", "GPU_FIX_NOTES.md", "PERFORMANCE_OPTIMIZATION.md"] + sorted(
    os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
)
TOP_LEVEL = {e for e in os.listdir(REPO) if not e.startswith(".")}
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"^[\w.*-]+(/[\w.*-]+)*/?$")
ENTRY = re.compile(r"\bpython3?\s+(-m\s+([\w.]+)|([\w./-]+\.py))")


def snippets(text: str) -> list[str]:
    """Inline code spans and the lines of fenced blocks."""
    blocks = FENCE.findall(text)
    rest = FENCE.sub("", text)
    return CODE.findall(rest) + [line for block in blocks for line in block.splitlines()]


def repository_paths(snippet: str) -> list[str]:
    """Tokens of a snippet that name a path inside this repository (first part a top-level entry)."""
    found = []
    for token in snippet.split():
        token = token.strip("\"'(),;:").split("::")[0]
        if "<" in token or "{" in token or not PATH.match(token):
            continue
        if "/" in token and token.split("/")[0] in TOP_LEVEL:
            found.append(token)
    return found


def python_files_in_repo() -> set[str]:
    names = set()
    for _folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        names.update(f for f in files if f.endswith(".py"))
    return names


def nvflare_files() -> set[str]:
    import nvflare

    root = os.path.dirname(nvflare.__file__)
    return {f for _, _, files in os.walk(root) for f in files if f.endswith(".py")}


def problems_in(doc: str) -> list[str]:
    text = open(os.path.join(REPO, doc)).read()
    problems = []
    ours, theirs = python_files_in_repo(), nvflare_files()
    for snippet in snippets(text):
        for path in repository_paths(snippet):
            if not glob.glob(os.path.join(REPO, path.rstrip("/"))):
                problems.append(f"{doc}: path {path} does not exist")
        for module, script in ((m.group(2), m.group(3)) for m in ENTRY.finditer(snippet)):
            if module and importlib.util.find_spec(module) is None:
                problems.append(f"{doc}: entry point python -m {module} does not import")
            if script and not os.path.exists(os.path.join(REPO, script)):
                problems.append(f"{doc}: entry point python {script} does not exist")
        for token in snippet.split():
            token = token.strip("\"'(),;:").split("::")[0]
            if re.fullmatch(r"[\w-]+\.py", token) and token not in ours | theirs:
                problems.append(f"{doc}: file {token} exists neither here nor in NVFlare")
    for target in LINK.findall(text):
        if target.startswith(("http:", "https:", "#", "mailto:")):
            continue
        path = os.path.normpath(os.path.join(REPO, os.path.dirname(doc), target.split("#")[0]))
        if not os.path.exists(path):
            problems.append(f"{doc}: link {target} leads nowhere")
    return problems


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_and_entry_point_named_in_the_docs_exists(doc):
    assert problems_in(doc) == []


def test_the_checker_catches_a_stale_path_entry_point_and_link(tmp_path, monkeypatch):
    stale = tmp_path / "stale.md"
    stale.write_text(
        "See `tests/test_no_stall.py`, run `python benchmarks/compare_methods.py` or `python -m jobs.nothing`, "
        "and read [the guide](docs/missing.md). `jobs/api.py` and `python -m jobs.deploy` exist.\n"
    )
    monkeypatch.setattr("tests.test_docs.REPO", str(tmp_path))
    (tmp_path / "tests").mkdir()
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "api.py").write_text("")
    monkeypatch.setattr("tests.test_docs.TOP_LEVEL", {"tests", "jobs", "docs", "benchmarks"})
    problems = problems_in("stale.md")
    assert len(problems) == 5, problems  # the retired script counts twice: a path and an entry point
    assert any("tests/test_no_stall.py" in p for p in problems)
    assert any("compare_methods.py" in p for p in problems)
    assert any("jobs.nothing" in p for p in problems)
    assert any("docs/missing.md" in p for p in problems)


def test_the_readme_is_a_short_guide():
    lines = open(os.path.join(REPO, "README.md")).read().splitlines()
    assert len(lines) <= 250, len(lines)
