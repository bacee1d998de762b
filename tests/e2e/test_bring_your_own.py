"""Bring your own: an NVFlare recipe with its own task processor runs on our simulator after
``use_fast_simulator``; a custom ``nn.Module`` with custom arrays runs through the Python API; the CLI takes a
model and a dataset by import path (and refuses a bad one clearly: ``tests/jobs/test_refused_in_process.py``); a
user's own method runs by import path. Real NVFlare runs, small."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import textwrap

from tests.conftest import PYTHON, REPO, job_args

EXAMPLES = os.path.join(REPO, "examples")
VERSION_LINE = re.compile(r"generated new model version (\d+) with (\d+) updates")


def test_a_users_recipe_and_processor_run_to_the_end_on_our_simulator(tmp_path):
    leaf_logs = tmp_path / "leaf_logs"
    proc = subprocess.run(
        [
            PYTHON,
            os.path.join(REPO, "examples", "drop_in_recipe.py"),
            "--devices-per-leaf",
            "6",
            "--selection",
            "8",
            "--versions",
            "3",
            "--steps",
            "3",
            "--dataset-size",
            "400",
            "--workspace",
            str(tmp_path / "ws"),
            "--results-dir",
            str(leaf_logs),
            "--update-interval",
            "0.3",
            "--job-timeout",  # how long a leaf waits for the job to reach it (the example's default: 120 s), with room
            "300",  # for a slow machine; a CI failure once blamed on it was fix 19's race (two leaves, one name)
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (server_log,) = glob.glob(str(tmp_path / "ws" / "**" / "server" / "log.txt"), recursive=True)
    with open(server_log) as f:
        versions = [tuple(map(int, m.groups())) for m in VERSION_LINE.finditer(f.read())]
    assert versions[-2:] == [(2, 8), (3, 8)]  # every round's 8 devices trained and applied
    client_configs = glob.glob(
        str(tmp_path / "ws" / "**" / "app_site-1" / "config" / "config_fed_client.json"), recursive=True
    )
    config = open(client_configs[0]).read()
    assert "simulation.leaf_runner.FastDeviceRunner" in config and "ExampleStyleProcessor" in config
    reports = []
    for leaf in ("site-1", "site-2"):
        plan = json.loads((leaf_logs / f"leaf_{leaf}_plan.json").read_text())
        assert plan["engine"] == "per-device" and plan["leaves_on_host"] == 2
        reports += [json.loads(line) for line in (leaf_logs / f"leaf_{leaf}.jsonl").read_text().splitlines()]
    assert len(reports) >= 16 and all(r["ok"] for r in reports)  # 2 rounds x 8 devices at least
    assert {r["version"] for r in reports} >= {1, 2}


def _users_package(root) -> str:
    package = root / "users_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(
        textwrap.dedent("""
        from torch import nn

        class Mlp(nn.Module):
            def __init__(self, init_seed=None):
                super().__init__()
                self.net = nn.Sequential(nn.Flatten(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

            def forward(self, x):
                return self.net(x)
    """)
    )
    (package / "data.py").write_text(
        textwrap.dedent("""
        import numpy as np

        def load():
            rng = np.random.default_rng(1)
            y = rng.integers(0, 4, 2400)
            x = (rng.normal(size=(4, 8))[y] + 0.5 * rng.normal(size=(2400, 8))).astype(np.float32)
            return x[:2000], y[:2000], x[2000:], y[2000:]
    """)
    )
    return str(root)


def test_own_models_and_data_run_through_the_python_api_and_by_import_path_on_the_cli(tmp_path):
    """A custom module and custom arrays through ``jobs.api`` (``examples/own_model_and_data.py``), and a model and
    a dataset by import path on the command line; the two jobs run at once."""
    api_home = tmp_path / "api"
    api_home.mkdir()
    api = subprocess.Popen(
        [PYTHON, os.path.join(REPO, "examples", "own_model_and_data.py")],
        cwd=api_home,
        env=os.environ | {"HOME": str(api_home)},  # the default results root is under ~
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cli_root = tmp_path / "cli"
    flags = job_args(
        cli_root,
        "--model",
        "users_pkg.models:Mlp",
        "--dataset",
        "users_pkg.data:load",
        "--max-model-version",
        "3",
        "--subset-size",
        "40",
        "--local-batch-size",
        "8",
    )
    cli = subprocess.Popen(
        [PYTHON, os.path.join(REPO, "jobs", "pt_job_fedavg.py"), *flags],
        cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": _users_package(tmp_path / "src")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        api_out, cli_out = api.communicate(timeout=400)[0], cli.communicate(timeout=400)[0]
    finally:
        for proc in (api, cli):
            if proc.poll() is None:
                proc.kill()
    assert api.returncode == 0, api_out[-3000:]
    (metrics_path,) = glob.glob(str(api_home / ".cache" / "edgesim-flare" / "**" / "metrics.json"), recursive=True)
    results = os.path.dirname(metrics_path)
    metrics = json.load(open(metrics_path))
    assert metrics["outcome"]["status"] == "completed" and metrics["versions"][-1]["version"] == 15
    assert metrics["versions"][-1]["accuracy"] > 0.5  # 3 separable classes: chance is 0.33
    assert os.path.isfile(os.path.join(results, "dataset.npz"))  # the arrays, as the run read them
    assert f"results in {results}" in api_out

    assert cli.returncode == 0, cli_out[-3000:]
    metrics = json.load(open(cli_root / "out" / "metrics.json"))
    assert metrics["config"]["training"]["model"] == "users_pkg.models:Mlp"
    assert [r["version"] for r in metrics["versions"]][-1] == 3 and metrics["versions"][-1]["accuracy"] > 0.25
