"""The user docs name only what exists: every repository path, every ``python ...`` entry point and every relative
link in ``README.md``, ``ARCHITECTURE.md``, ``CONTRIBUTING.md``, ``GPU_FIX_NOTES.md``, ``PERFORMANCE_OPTIMIZATION.md``
and ``docs/`` must resolve, and so must every benchmark they or ``benchmarks/gpu_checks.sh`` name, in code or prose, so a renamed file or a retired script fails CI instead of misleading a reader. The README stays a
short guide (the depth goes in ``docs/``)."""

from __future__ import annotations

import glob
import importlib.util
import os
import re

import pytest

from tests.conftest import REPO

DOCS = ["README.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "GPU_FIX_NOTES.md", "PERFORMANCE_OPTIMIZATION.md"] + sorted(
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


BENCH_PATH = re.compile(r"(?<![\w./-])benchmarks/[\w./-]*\w\.(?:py|sh)\b")
BENCH_MODULE = re.compile(r"-m\s+(benchmarks(?:\.\w+)+)")
# (doc, path) of a benchmark a doc names that is not in this repository on purpose, and why
ELSEWHERE = {
    (
        "docs/history/issue-33-cpu-per-update.md",
        "benchmarks/bench_send_path.py",
    ): "the unmerged copy-once branch's, run there",
}


def missing_benchmarks(doc: str, root: str = REPO) -> list[str]:
    """Benchmark scripts (``benchmarks/.../x.py`` or ``.sh``) and modules (``python -m benchmarks.x.y``) that
    ``doc`` names anywhere, prose included, that do not exist, unless ``ELSEWHERE`` says why."""
    text = open(os.path.join(root, doc)).read()
    named = set(BENCH_PATH.findall(text))
    named |= {m.replace(".", "/") + ".py" for m in BENCH_MODULE.findall(text)}
    return sorted(
        f"{doc}: {path} does not exist"
        for path in named
        if (doc, path) not in ELSEWHERE
        and not os.path.isfile(os.path.join(root, path))
        and not os.path.isfile(os.path.join(root, path[: -len(".py")], "__init__.py"))  # python -m a package
    )


@pytest.mark.parametrize("doc", [*DOCS, "benchmarks/gpu_checks.sh"])
def test_every_benchmark_the_docs_and_the_gpu_checks_name_exists(doc):
    """A GPU lease is short: a step of ``gpu_checks.sh`` that names a moved script would spend it failing."""
    assert missing_benchmarks(doc) == []


def test_the_benchmark_check_catches_a_moved_script_and_module_and_keeps_an_exemption(tmp_path, monkeypatch):
    (tmp_path / "benchmarks" / "perf").mkdir(parents=True)
    (tmp_path / "benchmarks" / "perf" / "bench_engine.py").write_text("")
    (tmp_path / "notes.md").write_text(
        "Run python benchmarks/bench_engine.py (moved), then `python -m benchmarks.perf.bench_engine`, "
        "python -m benchmarks.bench_protocol, tests/benchmarks/test_seed_slice.py and benchmarks/gone.sh.\n"
    )
    monkeypatch.setitem(ELSEWHERE, ("notes.md", "benchmarks/gone.sh"), "a test's exemption")
    assert missing_benchmarks("notes.md", str(tmp_path)) == [
        "notes.md: benchmarks/bench_engine.py does not exist",
        "notes.md: benchmarks/bench_protocol.py does not exist",
    ]


def test_the_readme_is_a_short_guide():
    lines = open(os.path.join(REPO, "README.md")).read().splitlines()
    assert len(lines) <= 250, len(lines)


PACKAGES = ("common", "processors", "simulation", "fedrevive", "aggregation", "evaluation", "scheduling", "jobs")
DOTTED = re.compile(r"``((?:" + "|".join((*PACKAGES, "benchmarks")) + r")(?:\.\w+)+)")


def _module_file(parts: list[str], root: str) -> str | None:
    base = os.path.join(root, *parts)
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _top_level_names(path: str) -> set[str]:
    """Names a module defines or imports at its top level (functions, classes, assignments, imports)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def stale_docstring_names(root: str = REPO) -> list[str]:
    """Dotted names of this project in docstrings (``package.module`` or ``package.module.name``) whose module
    does not exist, or whose first name after the module is not defined there."""
    import ast

    problems = []
    for package in (*PACKAGES, "benchmarks", "examples"):
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                tree = ast.parse(open(path).read(), path)
                nodes = [tree] + [
                    n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                ]
                for node in nodes:
                    doc = ast.get_docstring(node, clean=False) or ""
                    for dotted in DOTTED.findall(doc):
                        parts = dotted.split(".")
                        split = next((i for i in range(len(parts), 0, -1) if _module_file(parts[:i], root)), 0)
                        where = os.path.relpath(path, root)
                        if split == 1 and parts[1] in _top_level_names(_module_file(parts[:1], root)):
                            continue  # a name the package itself defines
                        if split < 2:
                            problems.append(f"{where}: ``{dotted}``: no module {'.'.join(parts[:2])}")
                        elif split < len(parts) and parts[split] not in _top_level_names(
                            _module_file(parts[:split], root)
                        ):
                            problems.append(f"{where}: ``{dotted}``: {'.'.join(parts[:split])} has no {parts[split]}")
    return sorted(set(problems))


def test_every_module_named_in_a_docstring_exists():
    assert stale_docstring_names() == []


def test_the_docstring_check_catches_a_missing_module_and_a_missing_name(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "__init__.py").write_text("")
    (tmp_path / "jobs" / "api.py").write_text(
        '"""See ``jobs.hierarchy.start``, ``jobs.api.run``, ``jobs.api.nothing`` and ``jobs.api``."""\n'
        "def run():\n    pass\n"
    )
    assert stale_docstring_names(str(tmp_path)) == [
        "jobs/api.py: ``jobs.api.nothing``: jobs.api has no nothing",
        "jobs/api.py: ``jobs.hierarchy.start``: no module jobs.hierarchy",
    ]


FILE = re.compile(r"`([\w./-]+\.py)`")


def architecture_rows() -> list[tuple[str, list[str]]]:
    """(concern, the project files its row names) of ARCHITECTURE.md's "where things are" table."""
    text = open(os.path.join(REPO, "ARCHITECTURE.md")).read()
    table = text[text.index("| concern | the file |") :].split("\n\n")[0].splitlines()[2:]
    rows = []
    for line in table:
        question, the_file = [c.strip() for c in line.strip().strip("|").split(" | ", 1)]
        rows.append((question, FILE.findall(the_file)))
    return rows


def test_each_architecture_row_answers_with_one_file():
    rows = architecture_rows()
    assert len(rows) >= 30
    assert [(q, f) for q, f in rows if len(set(f)) != 1] == []
    assert len({q for q, _ in rows}) == len(rows)  # each question once


DOC_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(sorted(TOP_LEVEL)) + r")/[\w./-]*\w)")


def stale_docstring_paths(root: str = REPO) -> list[str]:
    """Repository paths (``benchmarks/perf/bench_engine.py``, ``docs/engines.md``) named in any docstring of the
    project's packages, benchmarks and examples that do not exist."""
    import ast

    problems = []
    top_level = {e for e in os.listdir(root) if not e.startswith(".")}
    for top in (*PACKAGES, "benchmarks", "examples"):
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                tree = ast.parse(open(path).read(), path)
                nodes = [tree] + [
                    n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                ]
                for node in nodes:
                    for found in DOC_PATH.findall(ast.get_docstring(node, clean=False) or ""):
                        found = found.rstrip(".")
                        if found.split("/")[0] in top_level and not glob.glob(os.path.join(root, found)):
                            problems.append(f"{os.path.relpath(path, root)}: {found} does not exist")
    return sorted(set(problems))


def test_every_file_path_named_in_a_docstring_exists():
    assert stale_docstring_paths() == []


def test_the_docstring_path_check_catches_a_missing_file(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "bench_engine.py").write_text("")
    (tmp_path / "jobs" / "api.py").write_text(
        '"""Measured by ``benchmarks/null_trainer.py``; see benchmarks/bench_engine.py."""\n'
    )
    assert stale_docstring_paths(str(tmp_path)) == ["jobs/api.py: benchmarks/null_trainer.py does not exist"]


CONFLICT = re.compile(r"^(?:> )?(?:<{7}|>{7})(?: |$)|^(?:> )?={7}$", re.M)


def conflict_markers(text: str) -> list[int]:
    """The line numbers of a merge's conflict markers (``<<<<<<< HEAD``, ``=======``, ``>>>>>>> branch``), quoted in
    a block quote or not."""
    return [text.count("\n", 0, m.start()) + 1 for m in CONFLICT.finditer(text)]


def test_no_tracked_file_holds_a_merge_conflict_marker():
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    found = {}
    for name in tracked:
        if not name.endswith((".py", ".md", ".sh", ".toml", ".yaml", ".yml", ".cfg", ".txt")):
            continue
        with open(os.path.join(REPO, name), encoding="utf-8", errors="replace") as f:
            lines = conflict_markers(f.read())
        if lines:
            found[name] = lines
    assert not found, f"merge conflict markers left in: {found}"


def test_the_conflict_check_catches_markers_quoted_or_not():
    text = "a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> crossrun\n> <<<<<<< HEAD\n"
    assert conflict_markers(text) == [2, 4, 6, 7]
    assert conflict_markers("a heading\n=======\n") == [2]  # a setext underline of 7 is refused too: use #
    assert conflict_markers("=========\n<<<<<<<<\n") == []
