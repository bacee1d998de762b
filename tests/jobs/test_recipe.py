"""The recipe assembles the right components for each method and engine, and NVFlare writes every one of them
into the exported job's config (checked in the exported files, the form a deployment runs)."""

from __future__ import annotations

import json

import pytest

from jobs.cli import build_parser, config_from_args
from jobs.run.plan import prepare
from jobs.run.recipe import EdgeSimRecipe

RESULT_COMPONENTS = {
    "edgesim_evaluator",
    "edgesim_monitor",
    "edgesim_recorder",
    "edgesim_progress",
    "edgesim_tensorboard",
    "edgesim_model_saver",
}


def exported(tmp_path, method: str, *flags: str) -> tuple[dict, dict]:
    args = build_parser("test", method_choice=True).parse_args(
        [
            "--method",
            method,
            "--device-selection-size",
            "4",
            "--devices-per-leaf",
            "3",
            "--synthetic-size",
            "500",
            *flags,
        ]
    )
    cfg = config_from_args(args, method, presets=True)
    EdgeSimRecipe(cfg, prepare(cfg), results_dir=str(tmp_path / "out")).export(job_dir=str(tmp_path / "job"))
    app = tmp_path / "job" / cfg.run.job_name / "app" / "config"
    server = json.loads((app / "config_fed_server.json").read_text())
    client = json.loads((app / "config_fed_client.json").read_text())
    client_parts = {c["id"]: c for c in client["components"]}
    client_parts["executor"] = client["executors"][0]["executor"]  # the one task executor, under "executors"
    return {c["id"]: c for c in server["components"]}, client_parts


@pytest.mark.parametrize(
    "method, strategy",
    [
        ("fedavg", "aggregation.buffered_mean:BufferedMean"),
        ("fedbuff", "aggregation.buffered_mean:BufferedMean"),
        ("fedrevive", "aggregation.fedrevive_strategy:FedReviveStrategy"),
    ],
)
def test_each_method_gets_its_strategy_on_the_exact_time_server(tmp_path, method, strategy):
    server, client = exported(tmp_path, method)
    assert server["model_manager"]["path"] == "aggregation.global_model.GlobalModel"
    assert server["model_manager"]["args"]["strategy"] == strategy
    assert server["wf_assessor"]["path"] == "scheduling.exact_assessor.ExactTimeAssessor"
    assert RESULT_COMPONENTS <= set(server), "a result component is missing from the job"
    assert client["executor"]["path"] == "simulation.leaf_executor.EdgeSimExecutor"
    assert client["device_runner"]["path"].endswith("FastDeviceRunner")
    assert client["task_processor"]["path"].endswith("TrainingTaskProcessor")
    assert server["persistor"]["args"]["model"]["args"] == {"init_seed": 0}


def test_stock_simulator_uses_nvflares_own_pieces(tmp_path):
    server, client = exported(tmp_path, "fedavg", "--simulator", "stock")
    assert server["model_manager"]["path"] == "nvflare.edge.assessors.buff_model_manager.BuffModelManager"
    assert server["wf_assessor"]["path"] == "nvflare.edge.assessors.model_update.ModelUpdateAssessor"
    assert client["executor"]["path"] == "nvflare.edge.executors.edge_model_executor.EdgeModelExecutor"
    assert client["aggr_factory"]["path"].endswith("ModelUpdateDXOAggrFactory")
    assert client["device_runner"]["path"].endswith("StockDeviceRunner")
    assert client["task_processor"]["args"]["stock_delays"] is not None
    assert RESULT_COMPONENTS <= set(server)


def test_only_tensorboard_tracking_puts_tensorboards_writer_in_the_server():
    """MLflow and W&B are the driver's (``jobs.tracking``): the server's components are the same with them, and
    without ``tensorboard`` in ``--tracking`` it has no TensorBoard writer."""
    from jobs.run.components import make_result_components

    def components(tracking: str) -> set[str]:
        args = build_parser("test", method_choice=True).parse_args(["--method", "fedavg", "--tracking", tracking])
        return set(make_result_components(config_from_args(args, "fedavg", presets=True), {}, ""))

    assert RESULT_COMPONENTS <= components("tensorboard") == components("tensorboard,mlflow,wandb")
    assert components("mlflow") == components("none") == components("tensorboard") - {"edgesim_tensorboard"}
