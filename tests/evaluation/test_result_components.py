"""The server's result components working together: per-version records with system figures, one metrics.json,
the progress lines, TensorBoard events, the saved model, and the end-of-run summary with low-GPU warnings.

Fast and NVFlare-job free: the components' event handlers run on a stand-in engine (``tests/fakes/engine``) with a
system monitor on scripted sources.
"""

from __future__ import annotations

import glob
import json
import threading
import time

import pytest
import torch
from nvflare.apis.event_type import EventType
from nvflare.app_common.app_event_type import AppEventType

from common.result_files import RUN_FILES
from evaluation.evaluator import GlobalModelEvaluator
from evaluation.model_saver import GlobalModelSaver
from evaluation.monitor import SystemMonitor
from evaluation.progress import ProgressReporter
from evaluation.run_recorder import RunRecorder, run_summary, version_record
from evaluation.system_monitor import SystemMonitorComponent
from evaluation.tensorboard_writer import TensorBoardWriter
from evaluation.utilisation import aggregate, system_fields
from jobs.run.results import format_summary
from processors.models import build_model
from tests.fakes.engine import EventEngine, announce
from tests.fakes.monitor_fakes import FakeGpuSource, FakeHostSource, NoGpuSource

GPU_FIELDS = ("gpu_util_percent", "vram_used_gb", "vram_total_gb")
HOST_FIELDS = ("cpu_percent", "ram_used_gb", "ram_total_gb")
DATA = {"dataset": "synthetic", "synthetic_size": 200}


def _samples(gpu, host, n: int) -> list[dict]:
    mon = SystemMonitor(interval=1.0, gpu_source=gpu, host_source=host)
    return [mon.sample_once() for _ in range(n)]


def _evaluated(version: int, wall: float) -> dict:
    return {"version": version, "accuracy": 0.1 * version, "wall_seconds": wall, "eval_seconds": 0.5, "epoch": 1.0}


def test_version_record_without_gpu_has_null_gpu_fields_and_numeric_host_fields():
    stretch = aggregate(_samples(NoGpuSource(), FakeHostSource(cpu_percent=[40.0, 60.0], ram_used_gb=[3.0, 5.0]), 2))
    first = version_record(_evaluated(1, 2.0), None, 8, stretch)
    record = version_record(_evaluated(3, 6.0), first, 8, stretch)
    system = json.loads(json.dumps(record))["system"]
    assert all(system[k] is None for k in GPU_FIELDS), system  # null, never zero
    assert system["cpu_percent"] == pytest.approx(50.0)  # mean over the interval
    assert system["ram_used_gb"] == 5.0 and system["ram_total_gb"] == 16.0  # peak / total
    assert system["num_samples"] == 2
    assert record["seconds_per_version"] == pytest.approx(2.0)  # (6 - 2) s over 2 versions
    assert record["devices_per_second"] == pytest.approx(4.0)  # 8 updates a version, 2 versions in 4 s
    assert first["seconds_per_version"] is None and first["devices_per_second"] is None
    assert {"version", "accuracy", "wall_seconds", "eval_seconds", "epoch"} <= set(record)


def test_version_record_with_gpu_has_gpu_figures():
    gpu = FakeGpuSource(util_percent=[20.0, 40.0], mem_used_gb=[2.0, 6.0], mem_total_gb=80.0)
    record = version_record(_evaluated(2, 3.0), None, 8, aggregate(_samples(gpu, FakeHostSource(), 2)))
    system = record["system"]
    assert system["gpu_util_percent"] == pytest.approx(30.0)
    assert system["vram_used_gb"] == 6.0 and system["vram_total_gb"] == 80.0
    assert all(isinstance(system[k], float) for k in HOST_FIELDS)


def test_no_samples_give_all_null_system_fields():
    fields = system_fields(aggregate([]))
    assert fields["num_samples"] == 0
    assert all(fields[k] is None for k in GPU_FIELDS + HOST_FIELDS)


def test_run_summary_covers_the_recorded_versions():
    records = [version_record(_evaluated(v, 2.0 * v), None, 4, None) for v in (1, 2, 3)]
    summary = run_summary(records, 4)
    assert summary["versions_trained"] == 2 and summary["final_accuracy"] == pytest.approx(0.3)
    assert summary["seconds_per_version"] == 2.0 and summary["devices_per_second"] == 2.0


def test_the_fleet_gives_the_failure_rate_and_the_plot_the_devices_online(tmp_path):
    from evaluation.plots import plot_accuracy

    records = [version_record(_evaluated(v, 2.0 * v), None, 4, None) for v in (1, 2, 3)]
    assert "failure_rate" not in run_summary(records, 4)  # no fleet figures: nothing claimed
    for r, (online, updates, failed) in zip(records[1:], ((7, 10, 2), (4, 22, 6)), strict=True):
        r["fleet"] = {"online": online, "devices": 10, "updates": updates, "failed": failed}
    assert run_summary(records, 4)["failure_rate"] == round(6 / 22, 4)
    plot_accuracy(records, str(tmp_path / "accuracy.png"), "fedbuff")
    assert (tmp_path / "accuracy.png").stat().st_size > 0


class ScriptedMonitor(SystemMonitorComponent):
    """The monitor component on scripted sources, sampling every 10 ms."""

    def __init__(self, gpu, host, **kw):
        super().__init__(**kw)
        self.sources = (gpu, host)

    def make_monitor(self):
        gpu, host = self.sources
        return SystemMonitor(interval=0.01, gpu_source=gpu, host_source=host, low_util_window=5).start()


def run_components(tmp_path, gpu, host, diagnose_context: dict, run_info: dict, versions=(1, 2, 3)) -> dict:
    """START_RUN, one GLOBAL_WEIGHTS_UPDATED per version, END_RUN, through every result component."""
    monitor = ScriptedMonitor(gpu, host, diagnose_context=diagnose_context)
    engine = EventEngine(
        {
            "evaluator": GlobalModelEvaluator(
                "cifar10_convnet", DATA, compute_device="cpu", max_model_version=max(versions)
            ),
            "monitor": monitor,
            "recorder": RunRecorder(str(tmp_path), run_info, updates_per_version=8, monitor_id="monitor"),
            "progress": ProgressReporter(max(versions)),
            "tensorboard": TensorBoardWriter(str(tmp_path)),
            "saver": GlobalModelSaver("cifar10_convnet", str(tmp_path)),
        }
    )
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    sampler = monitor._monitor
    assert sampler is not None and sampler.running
    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    for version in versions:
        time.sleep(0.08)  # a few samples per version
        announce(ctx, version, weights)
        engine.fire_event(AppEventType.GLOBAL_WEIGHTS_UPDATED, ctx)
    engine.fire_event(EventType.END_RUN, ctx)
    assert not sampler.running and monitor._monitor is None  # the thread was joined
    assert not any(t.name == "system-monitor" and t.is_alive() for t in threading.enumerate())
    count = len(sampler.samples())
    time.sleep(0.05)
    assert len(sampler.samples()) == count  # nothing samples after END_RUN
    return json.loads((tmp_path / "metrics.json").read_text())


def test_components_record_system_figures_and_warn_on_low_gpu_use(tmp_path, capsys):
    context = {"compute_device": "cuda:0", "engine": "per-device", "num_workers": 4, "cpu_cores": 8}
    gpu = FakeGpuSource(util_percent=[12.0], mem_used_gb=[1.5], mem_total_gb=80.0)
    metrics = run_components(
        tmp_path, gpu, FakeHostSource(cpu_percent=[35.0]), context, {"planner": {"num_workers": 4}}
    )
    records = metrics["versions"]
    assert [r["version"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["system"]["gpu_util_percent"] == 12.0 and r["system"]["vram_used_gb"] == 1.5
        assert r["system"]["vram_total_gb"] == 80.0 and r["system"]["cpu_percent"] == 35.0
        assert r["system"]["num_samples"] >= 1
    assert records[0]["devices_per_second"] is None and records[2]["devices_per_second"] > 0
    assert metrics["planner"]["num_workers"] == 4  # run_info is kept
    assert metrics["summary"]["versions_trained"] == 2

    system = metrics["system"]
    assert system["num_samples"] >= 10 and system["gpus"][0]["util_percent_mean"] == 12.0
    assert len(system["warnings"]) == 1
    warning = system["warnings"][0]
    assert "below 30%" in warning and "per-device" in warning and "--engine vectorized" in warning

    printed = capsys.readouterr().out
    assert "[edgesim] version 3/3" in printed and "GPU 12% | VRAM 1.5/80.0 GB | CPU 35%" in printed
    assert f"[edgesim] WARNING: {warning}" in printed
    assert glob.glob(f"{tmp_path}/tensorboard/events.out.tfevents.*")
    model = build_model("cifar10_convnet")
    model.load_state_dict(torch.load(tmp_path / "global_model.pt"))

    summary = format_summary(
        {"total_seconds": 1.0, "versions_trained": 2, "final_accuracy": 0.1, "best_accuracy": 0.1, "system": system},
        str(tmp_path),
        RUN_FILES,
    )
    assert "[edgesim] system: GPU0 mean 12%" in summary and "--engine vectorized" in summary


def test_components_without_gpu_write_null_gpu_fields_and_no_warning(tmp_path):
    metrics = run_components(tmp_path, NoGpuSource(), FakeHostSource(cpu_percent=[97.0]), {}, {}, versions=(1, 2))
    for r in metrics["versions"]:
        assert all(r["system"][k] is None for k in GPU_FIELDS), r
        assert r["system"]["cpu_percent"] == 97.0 and r["system"]["ram_total_gb"] == 16.0
    assert metrics["system"]["gpus"] is None and metrics["system"]["warnings"] == []


def test_recorder_without_a_monitor_still_records(tmp_path):
    engine = EventEngine(
        {
            "evaluator": GlobalModelEvaluator("cifar10_convnet", DATA, compute_device="cpu", max_model_version=1),
            "recorder": RunRecorder(str(tmp_path), updates_per_version=8),
        }
    )
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    announce(ctx, 1, weights)
    engine.fire_event(AppEventType.GLOBAL_WEIGHTS_UPDATED, ctx)
    engine.fire_event(EventType.END_RUN, ctx)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["versions"][0]["system"]["num_samples"] == 0 and "system" not in metrics


def test_the_recorder_keeps_the_mean_group_size_and_the_progress_line_flags_low_groups(tmp_path, capsys):
    from common.protocol import LEAF_INFO
    from evaluation.events import VERSION_EVALUATED, VERSION_RECORD

    engine = EventEngine(
        {"recorder": RunRecorder(str(tmp_path), updates_per_version=2), "progress": ProgressReporter(3)}
    )
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)

    def leaf_info(plans: dict, groups: list[tuple[int, int]]) -> None:  # (selection, group size) per device line
        lines = [{"device": f"site-1#{i}", "selection": s, "group": g} for i, (s, g) in enumerate(groups)]
        ctx.set_prop(LEAF_INFO, {"plans": plans, "reports": {"site-1": lines}}, private=True, sticky=False)
        engine.fire_event(LEAF_INFO, ctx)

    def evaluated(version: int) -> dict:
        ctx.set_prop(VERSION_RECORD, _evaluated(version, float(version)), private=True, sticky=False)
        engine.fire_event(VERSION_EVALUATED, ctx)
        return json.loads((tmp_path / "metrics.json").read_text())

    plan = {"site-1": {"engine": "vectorized", "group_size": 100}}
    leaf_info(plan, [(1, 4)] * 8)  # the first selection: two groups of 4
    leaf_info({}, [(2, 6)] * 6)  # then one group of 6 (a release of several selections)
    metrics = evaluated(2)
    leaf_info({}, [(3, 1), (4, 1), (5, 2), (5, 2)])  # three calls: 1, 1 and 2 devices
    metrics = evaluated(3)
    assert metrics["groups"] == {
        "devices": 18,
        "mean_group_size": round(18 / 6, 2),
        "mean_group_size_after_first_selection": round(10 / 4, 2),
    }
    first, second = metrics["versions"]
    assert first["mean_group_size"] == round(14 / 3, 2) and second["mean_group_size"] == round(4 / 3, 2)
    assert second["groups_low"] and first["groups_low"]  # both far below the plan's 100
    printed = capsys.readouterr().out
    assert "version 3/3" in printed and "mean group 1.33 devices (low)" in printed
    engine.fire_event(EventType.END_RUN, ctx)


def test_each_leafs_bulk_link_is_printed_once_and_recorded_in_metrics_json(tmp_path, capsys):
    """The assessor's word on how each leaf's diffs and versions travel (``LEAF_INFO``'s ``bulk``): a line per leaf
    when it is settled or changes, and ``metrics.json``'s ``bulk``."""
    from common.protocol import LEAF_INFO

    recorder, progress = RunRecorder(str(tmp_path), {}, 2), ProgressReporter(5)
    engine = EventEngine({"recorder": recorder, "progress": progress})
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    wire = "wire: EDGESIM_BULK=wire in this site's environment"
    for bulk in ({"site-1": "shm"}, {"site-1": "shm", "site-2": wire}, {"site-1": "shm", "site-2": wire}):
        ctx.set_prop(LEAF_INFO, {"plans": {}, "reports": {}, "bulk": bulk}, private=True, sticky=False)
        engine.fire_event(LEAF_INFO, ctx)
    lines = [line for line in capsys.readouterr().out.splitlines() if "diffs and versions" in line]
    assert lines == [
        "[edgesim] site-1: diffs and versions through shared memory",
        "[edgesim] site-2: diffs and versions on NVFlare's wire (EDGESIM_BULK=wire in this site's environment)",
    ]
    assert json.loads((tmp_path / "metrics.json").read_text())["bulk"] == {"site-1": "shm", "site-2": wire}
