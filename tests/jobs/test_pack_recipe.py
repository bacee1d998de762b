"""A pack's job (``docs/packs.md``, step 3): each run's server components made once, ids suffixed by the run and
writing to the run's results folder, every run's device settings on the leaves (checked in the exported job's
config, the form NVFlare runs), and runs that cannot share a job refused in one line before anything starts."""

from __future__ import annotations

import json

import pytest

from jobs.build import build_config
from jobs.cli import build_parser, config_from_args
from jobs.pack_check import pack_refusal
from jobs.run.pack import run_pack
from jobs.run.plan import prepare
from jobs.run.recipe import EdgeSimPackRecipe

SMALL = ["--devices-per-leaf", "3", "--device-selection-size", "4", "--synthetic-size", "500"]


def checked(*flags: str, method: str = "fedbuff"):
    args = build_parser("test", method_choice=True).parse_args(["--method", method, *SMALL, *flags])
    return config_from_args(args, method, presets=True)


def test_runs_of_one_model_dataset_and_leaves_make_a_pack():
    assert pack_refusal([checked("--seed", "1"), checked("--seed", "2", "--local-lr", "0.05")]) is None


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--model", "resnet18"], "--model"),
        (["--dataset", "cifar10"], "--dataset"),
        (["--num-leaf-nodes", "3"], "--num-leaf-nodes"),
        (["--devices-per-leaf", "4", "--device-selection-size", "4"], "--devices-per-leaf"),
        (["--on-leaf-loss", "continue"], "--on-leaf-loss"),
    ],
)
def test_a_pack_refuses_runs_that_cannot_share_a_job_in_one_line(flags, flag):
    refusal = pack_refusal([checked(), checked(*flags)])
    assert refusal is not None and "\n" not in refusal
    assert refusal.startswith(f"run 1 has {flag} ")


def test_runs_that_all_go_on_without_a_lost_leaf_make_a_pack_whose_server_does_so(tmp_path):
    cfgs = [
        build_config(
            "fedbuff", {"output": str(tmp_path / f"s{s}"), "seed": s, "on_leaf_loss": "continue"}, presets=True
        )
        for s in (1, 2)
    ]
    assert pack_refusal(cfgs) is None
    dirs = [str(tmp_path / f"s{s}") for s in (1, 2)]
    EdgeSimPackRecipe(cfgs, [prepare(c) for c in cfgs], dirs).export(job_dir=str(tmp_path / "job"))
    app = tmp_path / "job" / cfgs[0].run.job_name / "app" / "config"
    server = {c["id"]: c for c in json.loads((app / "config_fed_server.json").read_text())["components"]}
    assert server["wf_assessor"]["args"]["on_leaf_loss"] == "continue"


def test_a_pack_takes_a_synchronous_run_beside_buffered_ones():
    # each leaf sums the synchronous run's selections and forwards the buffered runs' updates (per run)
    assert pack_refusal([checked(), checked(method="fedavg"), checked(method="fedrevive")]) is None


def test_run_pack_refuses_before_nvflare_starts(tmp_path, capsys):
    cfgs = [
        build_config("fedbuff", {"output": str(tmp_path / name), "synthetic_size": 500, **extra}, presets=True)
        for name, extra in (("a", {}), ("b", {"num_leaf_nodes": 3}))
    ]
    assert run_pack(cfgs) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: run 1 has --num-leaf-nodes 3, run 0 has 2") and "\n" not in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # no results folder, no workspace


def test_each_run_has_its_own_server_components_and_device_settings(tmp_path):
    cfgs = [
        build_config("fedbuff", {"output": str(tmp_path / f"seed-{s}"), "seed": s, "synthetic_size": 500}, presets=True)
        for s in (3, 4)
    ]
    dirs = [str(tmp_path / f"seed-{s}") for s in (3, 4)]
    EdgeSimPackRecipe(cfgs, [prepare(c) for c in cfgs], dirs).export(job_dir=str(tmp_path / "job"))
    app = tmp_path / "job" / cfgs[0].run.job_name / "app" / "config"
    server = {c["id"]: c for c in json.loads((app / "config_fed_server.json").read_text())["components"]}
    client = {c["id"]: c for c in json.loads((app / "config_fed_client.json").read_text())["components"]}
    runs = server["wf_assessor"]["args"]["runs"]
    assert server["wf_assessor"]["path"] == "scheduling.pack_assessor.PackAssessor"
    assert [r["seed"] for r in runs] == [3, 4] and [r["results_dir"] for r in runs] == dirs
    for run, results_dir in enumerate(dirs):
        assert server[runs[run]["persistor_id"]]["path"].endswith("PTFileModelPersistor")  # NVFlare names it
        assert runs[run]["global_model_id"] == f"model_manager.r{run}"
        assert server[f"model_manager.r{run}"]["args"]["seed"] == 3 + run
        assert server[f"model_manager.r{run}"]["args"]["results_dir"] == results_dir
        for name in ("edgesim_evaluator", "edgesim_recorder", "edgesim_model_saver"):
            assert server[f"{name}.r{run}"]["args"]["run"] == run
            assert server[f"{name}.r{run}"]["args"]["results_dir"] == results_dir
    assert server["edgesim_evaluator.r1"]["args"]["seed"] == 4
    assert runs[0]["persistor_id"] != runs[1]["persistor_id"]  # each run's initial model, from its own seed
    assert "edgesim_evaluator" not in server and "edgesim_progress" in server  # the progress line is the job's
    assert client["task_processor"]["args"]["seed"] == 3 and client["task_processor.r1"]["args"]["seed"] == 4
    assert client["device_runner"]["args"]["run_processor_ids"] == ["task_processor.r1"]
