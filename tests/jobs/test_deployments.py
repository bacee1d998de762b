"""Deployments without standing one up: a downloaded job result comes home as a SimEnv run's files, the server's
progress lines are found in its log, the job ships every package its components import, the provisioning
project names the sites and ports, and ``jobs.deploy`` refuses bad folders before provisioning anything."""

from __future__ import annotations

import json
import subprocess

import pytest

from jobs.deploy import cli as deploy
from jobs.deploy.provisioning import port_count, project_dict
from jobs.methods import method_of
from jobs.run.remote import bring_home, progress_lines
from jobs.run.results import result_files_of
from tests.conftest import PYTHON


def test_a_downloaded_result_comes_home_without_the_jobs_own_files(tmp_path):
    downloaded = tmp_path / "download" / "job-1"
    app = downloaded / "workspace" / "app_server"
    for path, text in {
        "metrics.json": "{}",
        "events.jsonl": "",
        "leaf_C11.jsonl": "",
        "tensorboard/ev.0": "x",
        "config/config_fed_server.json": "{}",
        "custom/common/jsonio.py": "",
        ".__nvfl_sig.json": "{}",
    }.items():
        (app / path).parent.mkdir(parents=True, exist_ok=True)
        (app / path).write_text(text)
    (downloaded / "workspace" / "log.txt").write_text("server log")
    (downloaded / "meta.json").write_text(json.dumps({"status": "FINISHED:COMPLETED"}))
    results = tmp_path / "out"
    results.mkdir()
    copied = bring_home(str(downloaded), str(results), result_files_of(method_of("fedavg")))
    assert copied == ["events.jsonl", "leaf_C11.jsonl", "metrics.json", "tensorboard"]
    assert (results / "tensorboard" / "ev.0").read_text() == "x"
    assert (results / "nvflare" / "server" / "log.txt").read_text() == "server log"
    assert json.loads((results / "nvflare" / "job_meta.json").read_text())["status"] == "FINISHED:COMPLETED"
    assert not (results / "config").exists() and not (results / "custom").exists()


def test_progress_lines_are_found_in_the_servers_log():
    log = (
        "2026-11-22 12:43:44,877 - ExactTimeAssessor - INFO - [identity=edgesim] - all 4 leaves registered\n"
        "2026-11-22 12:43:45,001 - ProgressReporter - INFO - [identity=edgesim, run=1] - [edgesim] version 2/4 | "
        "accuracy 0.1100\n"
    )
    assert progress_lines(log) == ["[edgesim] version 2/4 | accuracy 0.1100"]


def test_the_exported_job_carries_every_module_its_components_import(tmp_path):
    """A deployment's sites need only NVFlare and the libraries: with the job's custom/ first on the path, every
    component class of the job, and every project module they import, comes from custom/, not from this checkout
    (nor from jobs/, the entry layer, which is not shipped). The export runs in this process (the packages shipped
    are a fixed list, ``common.job_files.SHIPPED_PACKAGES``, not what this process imported); the import check
    needs a fresh interpreter."""
    from jobs.pt_job_fedrevive import main

    assert main(["--method", "fedrevive", "--export-only", str(tmp_path / "job"), "--synthetic-size", "1000"]) == 0
    app = tmp_path / "job" / "edgesim_fedrevive" / "app"
    classes = []
    for name in ("config_fed_server.json", "config_fed_client.json"):
        config = json.loads((app / "config" / name).read_text())
        for comp in [*config.get("components", []), *config.get("executors", []), *config.get("workflows", [])]:
            comp = comp.get("executor", comp)
            if comp.get("path", "").split(".")[0] != "nvflare":
                classes.append(comp["path"])
    assert len(classes) >= 8
    ours = ("common", "processors", "simulation", "fedrevive", "aggregation", "scheduling", "evaluation", "jobs")
    check = (
        "import importlib, sys; sys.path.insert(0, sys.argv[1]); "
        "[importlib.import_module(p.rpartition('.')[0]) for p in sys.argv[2:]]; "
        f"bad = [n for n, m in sys.modules.items() if n.split('.')[0] in {ours!r} "
        "and not (getattr(m, '__file__', None) or '').startswith(sys.argv[1])]; "
        "assert not bad, bad"
    )
    proc = subprocess.run(
        [PYTHON, "-c", check, str(app / "custom"), *classes],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_provisioning_project_names_leaves_below_relays_with_distinct_ports():
    project, ports, leaves = project_dict(2, 4, list(range(9000, 9000 + port_count(2, 4))))
    assert leaves == ["C11", "C12", "C21", "C22"]
    assert len(set(ports.values())) == len(ports) == 13  # server, admin, 2 relays, 4 edge APIs, 5 internal
    kinds = {p["name"]: p["type"] for p in project["participants"]}
    assert [n for n, t in kinds.items() if t == "relay"] == ["R1", "R2"]
    assert {
        p["name"]: p.get("connect_to", {}).get("name") for p in project["participants"] if p["type"] == "client"
    } == {"C11": "R1", "C12": "R1", "C21": "R2", "C22": "R2"}
    with pytest.raises(ValueError, match="must be a positive multiple of --relays"):
        project_dict(2, 3, list(range(9000, 9008)))


def test_deploy_refuses_a_folder_in_use_and_a_folder_that_is_no_deployment(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert deploy.main(["up", str(tmp_path)]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert deploy.main(["down", str(tmp_path)]) == 2
    assert "not a deployment started by jobs.deploy" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"
