"""The NVFlare code our fixes copy or rely on is the code they were written against (``jobs.nvflare_guard``),
and the names that leaked out of the ``nvflare_private.py`` modules fail here when NVFlare renames them; private
NVFlare names live only in those modules, each one in ``jobs.nvflare_guard.PRIVATE_MODULES``."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import re
import textwrap

import numpy as np
import pytest

from common import nvflare_private
from common.nvflare_private import SIMULATOR_GRACES, SIMULATOR_POLLS, TESTED_NVFLARE
from jobs import nvflare_guard
from jobs.nvflare_guard import (
    ALLOW_ENV,
    NVFLARE_COPIES,
    NVFLARE_RELIED_ON,
    PRIVATE_MODULES,
    changed_sources,
    installed_source,
    nvflare_problem,
)
from jobs.nvflare_private import INLINE_ARRAYS
from simulation.nvflare_private import NVFLARE_CLIENT_JOB_MODULE, NVFLARE_SIMULATOR_WORKER_MODULE
from tests.conftest import REPO

DO_TASK = "nvflare.edge.executors.hug.HierarchicalUpdateGatherer._do_task"


def test_the_installed_nvflare_is_the_tested_one_and_every_body_our_fixes_copy_or_rely_on_is_unchanged():
    assert nvflare_guard.installed_nvflare() == TESTED_NVFLARE
    changed = changed_sources()
    assert changed == [], f"NVFlare changed these: review each fix of the nvflare_private.py modules: {changed}"


def test_an_edited_nvflare_body_fails_the_digest_check_naming_it():
    def edited(path: str) -> str:  # NVFlare fixed something inside the loop our leaf executor copies
        source = installed_source(path)
        return source.replace("break", "continue", 1) if path == DO_TASK else source

    assert changed_sources(edited) == [f"{DO_TASK} (copied into ours)"]
    gone = {"nvflare.fuel.f3.cellnet.cell.Adapter.call"}  # renamed upstream
    assert changed_sources(lambda p: "" if p in gone else installed_source(p)) == [
        "nvflare.fuel.f3.cellnet.cell.Adapter.call (gone; relied on by a fix)"
    ]


def test_only_trailing_whitespace_leaves_a_digest_unchanged():
    source = installed_source(DO_TASK)
    assert nvflare_guard.source_digest(source + "   \n") == NVFLARE_COPIES[DO_TASK]
    assert nvflare_guard.source_digest(source.replace("    ", "  ", 1)) != NVFLARE_COPIES[DO_TASK]


def test_another_nvflare_is_warned_when_the_code_we_need_is_unchanged_and_refused_naming_it_when_it_changed(
    monkeypatch,
):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    assert nvflare_problem(TESTED_NVFLARE) == ("", False)
    line, stop = nvflare_problem("2.9.1")
    assert not stop and line.startswith(
        "warning: NVFlare 2.9.1 is installed; edgesim-flare is tested with NVFlare 2.9.0"
    )

    def edited(path: str) -> str:
        return installed_source(path) + ("\n        pass" if path == DO_TASK else "")

    line, stop = nvflare_problem("2.10.0", edited)
    assert stop and "\n" not in line
    assert f"{DO_TASK} (copied into ours)" in line
    assert "pip install nvflare==2.9.0" in line and f"{ALLOW_ENV}=1" in line  # the fix, named
    monkeypatch.setenv(ALLOW_ENV, "1")
    line, stop = nvflare_problem("2.10.0", edited)
    assert not stop and line.startswith("warning:") and DO_TASK in line


def test_every_copy_in_our_code_names_an_original_whose_digest_we_keep():
    """Each ``a copy of X`` in an nvflare_private.py is in its NVFLARE_COPIES, and each entry has its copy."""
    for module in PRIVATE_MODULES:
        named = re.findall(r"# a copy of ([A-Za-z_.]+) \(NVFLARE_COPIES\)", inspect.getsource(module))
        own = getattr(module, "NVFLARE_COPIES", {})
        assert sorted(named) == sorted(".".join(path.split(".")[-2:]) for path in own), module.__name__
    assert sum(len(getattr(m, "NVFLARE_COPIES", {})) for m in PRIVATE_MODULES) == len(NVFLARE_COPIES)  # no overlap


PACKAGES = ("common", "processors", "simulation", "fedrevive", "aggregation", "evaluation", "scheduling", "jobs")


def touches_private_nvflare(text: str) -> bool:
    """A module imports NVFlare's ``private`` package or marks a private attribute's use (``SLF001``)."""
    return bool(re.search(r"^\s*(from|import) nvflare\.private\b|noqa: SLF001", text, re.M))


def test_private_nvflare_names_live_only_in_the_nvflare_private_modules_and_each_is_checked():
    """A module that touches NVFlare's private names is an ``nvflare_private.py``, and each of those is one the
    guard and the name tests read (``PRIVATE_MODULES``): a new one cannot escape the checks."""
    found, outside = set(), []
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPO, package)):
            for name in (f for f in files if f.endswith(".py")):
                path = os.path.relpath(os.path.join(folder, name), REPO)
                if name == "nvflare_private.py":
                    found.add(path[: -len(".py")].replace(os.sep, "."))
                elif touches_private_nvflare(open(os.path.join(REPO, path)).read()):
                    outside.append(path)
    assert outside == []
    assert found == {m.__name__ for m in PRIVATE_MODULES}
    assert touches_private_nvflare("x = job._deploy_map  # noqa: SLF001 - reason\n")
    assert touches_private_nvflare("    from nvflare.private.fed.app import simulator\n")
    assert not touches_private_nvflare("from nvflare.edge.assessor import Assessor\n")


def _direct_sleepers(tree: ast.AST) -> set[str]:
    """The functions whose own body (not a function nested in it) calls ``time.sleep``."""
    found: set[str] = set()

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, getattr(child, "name", "<lambda>"))
                continue
            if isinstance(child, ast.Call) and ast.unparse(child.func) == "time.sleep" and function:
                found.add(function)
            visit(child, function)

    visit(tree, None)
    return found


def test_each_capped_sleep_is_called_directly_in_the_body_of_its_named_nvflare_function():
    """Fixes 10 and 11 cap a sleep by the name of the function that calls it (its frame's ``co_name``): the sleep
    must sit in that function's own body, not in a function nested in it, and the function must be one whose
    source we keep a digest of."""
    relied = {path.rsplit(".", 1)[1]: path for path in NVFLARE_RELIED_ON}
    for module_name, callers in (*SIMULATOR_POLLS.items(), *SIMULATOR_GRACES.items()):
        tree = ast.parse(textwrap.dedent(inspect.getsource(importlib.import_module(module_name))))
        direct = _direct_sleepers(tree)
        for caller in callers:
            assert caller in direct, f"{module_name}.{caller} no longer calls time.sleep itself: review fix 10/11"
            assert caller in relied and relied[caller].startswith(module_name), f"{caller}: no digest kept"


def test_nvflare_starts_its_job_processes_with_the_modules_and_flags_the_leaf_plan_matches():
    """Fix 16: the leaf counts NVFlare's client job processes by module and flag; a rename fails here."""
    assert importlib.util.find_spec(NVFLARE_CLIENT_JOB_MODULE) is not None
    assert importlib.util.find_spec(NVFLARE_SIMULATOR_WORKER_MODULE) is not None
    start_app = installed_source("nvflare.private.fed.client.client_executor.JobExecutor.start_app")
    assert f'("-m", "{NVFLARE_CLIENT_JOB_MODULE}")' in start_app and '("-n", job_id)' in start_app
    worker = installed_source("nvflare.private.fed.app.simulator.simulator_runner.SimulatorClientRunner.do_one_task")
    assert f"-m {NVFLARE_SIMULATOR_WORKER_MODULE} -o " in worker


def test_a_chunk_size_of_zero_puts_numpy_arrays_in_the_message_itself(monkeypatch):
    """Fix 14: INLINE_ARRAYS names NVFlare's numpy decomposer's chunk-size variable, and 0 makes it encode an array
    natively (in the message) even where a download would otherwise be set up (a cell in the FOBS context)."""
    from nvflare.apis.fl_constant import ConfigVarName
    from nvflare.app_common.decomposers.numpy_decomposers import NumpyArrayDecomposer
    from nvflare.fuel.utils.fobs import FOBSContextKey
    from nvflare.fuel.utils.fobs.decomposers import via_downloader

    decomposer = NumpyArrayDecomposer()
    (name,) = INLINE_ARRAYS
    assert decomposer._config_var_name(ConfigVarName.DOWNLOAD_CHUNK_SIZE) == name  # noqa: SLF001
    monkeypatch.setattr(via_downloader.acu, "get_int_var", lambda var, default: INLINE_ARRAYS.get(var, default))

    class Manager:
        fobs_ctx = {FOBSContextKey.CELL: object()}

    encoded = decomposer.decompose(np.arange(300_000, dtype=np.float32), Manager())
    assert encoded[via_downloader.EncKey.TYPE] == via_downloader.EncType.NATIVE


@pytest.mark.parametrize("function", ["setup"])
def test_the_simulator_reads_the_jobs_log_config_as_it_starts(function):
    """Fix 15: SimulatorRunner.setup applies the job's logging config (which names common.early_start)."""
    source = installed_source(f"nvflare.private.fed.app.simulator.simulator_runner.SimulatorRunner.{function}")
    assert "dynamic_log_config(" in source and "self.args.log_config" in source
    assert "log_config" in installed_source(f"{NVFLARE_SIMULATOR_WORKER_MODULE}.main")


def test_a_job_on_an_nvflare_whose_copied_code_changed_is_refused_in_one_line_before_anything_starts(
    monkeypatch, tmp_path, capsys
):
    from jobs.api import make_config
    from jobs.run import driver

    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.setattr(nvflare_guard, "installed_nvflare", lambda: "2.10.0")
    monkeypatch.setattr(
        nvflare_guard, "installed_source", lambda p: installed_source(p) + ("\n    pass" if p == DO_TASK else "")
    )
    cfg = make_config(output=str(tmp_path / "out"), max_model_version=2)
    assert driver.run(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: NVFlare 2.10.0 is installed") and DO_TASK in err[0]
    assert not (tmp_path / "out").exists()  # nothing started, no folder made


def test_each_nvflare_process_warns_once_when_its_nvflare_is_not_the_tested_one(monkeypatch, caplog):
    """A deployment's site may run another NVFlare than the machine that submitted the job."""
    import importlib.metadata

    monkeypatch.delitem(nvflare_private.ORIGINALS, "untested NVFlare", raising=False)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.10.0" if name == "nvflare" else "0")
    with caplog.at_level("WARNING", logger=nvflare_private.__name__):
        nvflare_private.warn_untested_nvflare()
        nvflare_private.warn_untested_nvflare()
    warnings = [r.getMessage() for r in caplog.records if r.name == nvflare_private.__name__]
    assert warnings == [
        "NVFlare 2.10.0 is installed; edgesim-flare's fixes to it (the nvflare_private.py modules) were written "
        "against NVFlare 2.9.0"
    ]
    monkeypatch.delitem(nvflare_private.ORIGINALS, "untested NVFlare")
