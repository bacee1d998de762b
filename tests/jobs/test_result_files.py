"""A run's result files are named once (``common.result_files``, plus a method's own ``Method.result_files``): the
end-of-run report, the downloader of a deployment's results, the folder check of a new run and the docs all name
the same files, and no module spells a file's name itself."""

from __future__ import annotations

import ast
import json
import os
import re

import pytest

from common import result_files
from common.result_files import METRICS, RUN_FILES, is_pattern
from fedrevive.config import LOG_FILE as FEDREVIVE_LOG
from jobs.methods import BUILT_IN, FedBuff
from jobs.run.outputs import prepare_output_dir
from jobs.run.remote import bring_home
from jobs.run.results import format_summary, result_files_of
from tests.conftest import REPO

PROJECT = ("common", "processors", "simulation", "fedrevive", "aggregation", "evaluation", "scheduling", "jobs")
PROJECT += ("benchmarks", "examples")
EVERY_METHOD = sorted({f for m in BUILT_IN.values() for f in result_files_of(m)})
RESULT_ENTRY = re.compile(r"^[\w<>-]+\.(?:json|jsonl|pt|png)$|^[\w-]+/(?:[\w<>-]+/)?$")


class WithLog(FedBuff):
    """A user's method whose strategy writes a log of its own."""

    result_files = ("my_method_log.jsonl",)


def make_entries(folder, files) -> list[str]:
    """Create one entry per file (a pattern gets two matches, a folder name a folder); their names."""
    names = []
    for pattern in files:
        for name in [pattern.replace("*", leaf) for leaf in ("C11", "C12")] if is_pattern(pattern) else [pattern]:
            path = folder / name
            if "." in name:
                path.write_text("{}")
            else:
                path.mkdir()
                (path / "inside").write_text("x")
            names.append(name)
    return names


def reported(line: str) -> set[str]:
    """The file names an end-of-run ``results:`` line lists, without a folder's ``/`` or a pattern's count."""
    listed = re.sub(r" \(\d+\)", "", line[line.index("(") + 1 : -1])
    return {n.strip().rstrip("/") for n in listed.split(",")}


def results_line(summary_text: str) -> str:
    return next(line for line in summary_text.splitlines() if line.startswith("[edgesim] results:"))


SUMMARY = {"total_seconds": 1.0, "versions_trained": 2, "final_accuracy": 0.5, "best_accuracy": 0.5}


@pytest.mark.parametrize("method", [*BUILT_IN.values(), WithLog()], ids=lambda m: m.label)
def test_the_report_and_the_downloader_name_every_file_of_the_method_and_nothing_else(method, tmp_path):
    files = result_files_of(method)
    assert set(RUN_FILES) <= set(files) and set(method.result_files) <= set(files)

    done = tmp_path / "done"
    done.mkdir()
    make_entries(done, files)
    (done / "notes.txt").write_text("mine")
    assert reported(results_line(format_summary(SUMMARY, str(done), files))) == set(files)

    app = tmp_path / "download" / "workspace" / "app_server"
    app.mkdir(parents=True)
    names = make_entries(app, files)
    for own in ("config", "custom"):
        (app / own).mkdir()
    (app / "config" / "config_fed_server.json").write_text("{}")
    (app / "stray.txt").write_text("not a result")
    home = tmp_path / "home"
    home.mkdir()
    assert bring_home(str(tmp_path / "download"), str(home), files) == sorted(names)
    assert not (home / "stray.txt").exists() and not (home / "config").exists()


def test_a_new_run_clears_the_files_of_its_method_and_of_the_built_in_ones(tmp_path):
    make_entries(tmp_path, result_files_of(WithLog()))
    (tmp_path / FEDREVIVE_LOG).write_text("{}")
    (tmp_path / "dataset.npz").write_text("an input")
    half_written = tmp_path / ".writing-123-456"  # a killed writer's folder (common.jsonio.replacing)
    half_written.mkdir()
    (half_written / "global_model.pt.tmp").write_text("half")
    prepare_output_dir(str(tmp_path), method_files=WithLog.result_files)
    assert sorted(os.listdir(tmp_path)) == ["dataset.npz"]


def test_a_user_methods_log_is_reported_once_it_exists(tmp_path):
    (tmp_path / METRICS).write_text(json.dumps({}))
    files = result_files_of(WithLog())
    assert "my_method_log.jsonl" not in results_line(format_summary(SUMMARY, str(tmp_path), files))
    (tmp_path / "my_method_log.jsonl").write_text("")
    assert "my_method_log.jsonl" in results_line(format_summary(SUMMARY, str(tmp_path), files))


def documented(doc: str, start: str, end: str) -> set[str]:
    """The result entries a doc names between ``start`` and ``end``, as ``common.result_files`` names them."""
    text = open(os.path.join(REPO, doc)).read()
    text = text[text.index(start) :]
    text = text[: text.index(end)]
    top_level = set(os.listdir(REPO))
    names = set()
    for token in re.findall(r"`([^`\n]+)`", text):
        if RESULT_ENTRY.match(token) and token.split("/")[0] not in top_level:
            names.add(token.split("/")[0].replace("<leaf>", "*"))
    return names


@pytest.mark.parametrize(
    "doc, start, end",
    [
        ("README.md", "`--output DIR` (default", "**The end of a run is safe.**"),
        ("docs/deployment.md", "**What a `prod` run does.**", "Ctrl-C aborts"),
    ],
)
def test_the_docs_list_the_files_the_report_and_the_downloader_name(doc, start, end):
    assert documented(doc, start, end) == set(EVERY_METHOD)


def test_no_module_spells_a_result_files_name_itself():
    """Only ``common/result_files.py`` (and FedRevive's config, for its own log) holds a result file's name."""
    names = {v for k, v in vars(result_files).items() if k.isupper() and isinstance(v, str) and "." in v}
    names |= {FEDREVIVE_LOG}
    owners = {os.path.join("common", "result_files.py"), os.path.join("fedrevive", "config.py")}
    found = []
    for package in PROJECT:
        for root, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                path = os.path.join(root, name)
                if not name.endswith(".py") or os.path.relpath(path, REPO) in owners:
                    continue
                for node in ast.walk(ast.parse(open(path).read(), path)):
                    if isinstance(node, ast.Constant) and node.value in names:
                        found.append(f"{os.path.relpath(path, REPO)}:{node.lineno} {node.value!r}")
    assert found == []
