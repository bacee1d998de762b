"""The evaluator's system monitoring: per-version system figures, the end-of-run summary and low-GPU warnings.

Fast and NVFlare-job free: the helpers are pure functions, and the evaluator's event handlers are called directly
with a bare ``FLContext`` and a monitor on scripted (fake) sources.
"""

from __future__ import annotations

import glob
import json
import threading
import time

import pytest
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.app_constant import AppConstants

from evaluation.global_evaluator import GlobalModelEvaluator, diagnose_context, version_record
from jobs.results import format_summary
from processors.models import build_model
from simulation.monitor import SystemMonitor, aggregate, system_fields
from simulation.monitor_fakes import FakeGpuSource, FakeHostSource, NoGpuSource

GPU_FIELDS = ("gpu_util_percent", "vram_used_gb", "vram_total_gb")
HOST_FIELDS = ("cpu_percent", "ram_used_gb", "ram_total_gb")


def _samples(gpu, host, n: int) -> list[dict]:
    mon = SystemMonitor(interval=1.0, gpu_source=gpu, host_source=host)
    return [mon.sample_once() for _ in range(n)]


def test_version_record_without_gpu_has_null_gpu_fields_and_numeric_host_fields():
    stretch = aggregate(_samples(NoGpuSource(), FakeHostSource(cpu_percent=[40.0, 60.0], ram_used_gb=[3.0, 5.0]), 2))
    first = version_record(1, 0.1, 2.0, 0.5, 100.0, None, 8, stretch)
    record = version_record(3, 0.4, 6.0, 0.5, 104.0, first, 8, stretch)
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
    record = version_record(2, 0.3, 3.0, 0.1, 1.0, None, 8, aggregate(_samples(gpu, FakeHostSource(), 2)))
    system = record["system"]
    assert system["gpu_util_percent"] == pytest.approx(30.0)
    assert system["vram_used_gb"] == 6.0 and system["vram_total_gb"] == 80.0
    assert all(isinstance(system[k], float) for k in HOST_FIELDS)


def test_no_samples_give_all_null_system_fields():
    fields = system_fields(aggregate([]))
    assert fields["num_samples"] == 0
    assert all(fields[k] is None for k in GPU_FIELDS + HOST_FIELDS)


def test_diagnose_context_reads_the_drivers_run_info():
    run_info = {
        "config": {"compute_device": "auto", "engine": "per-device", "num_workers": None},
        "environment": {"compute_device": "cuda:0", "cpu_cores": 16},
        "planner": {"num_workers": 3},
    }
    assert diagnose_context(run_info, "auto") == {
        "compute_device": "cuda:0",
        "engine": "per-device",
        "num_workers": 3,
        "cpu_cores": 16,
    }
    assert diagnose_context({"config": {"engine": "auto"}}, "cpu")["engine"] is None
    assert diagnose_context({}, "cpu")["compute_device"] == "cpu"


class _FakeMonitorEvaluator(GlobalModelEvaluator):
    """The evaluator with its monitor on scripted sources, sampling every 10 ms."""

    def __init__(self, gpu, host, **kw):
        super().__init__(**kw)
        self._fake_sources = (gpu, host)

    def _make_monitor(self):
        gpu, host = self._fake_sources
        return SystemMonitor(interval=0.01, gpu_source=gpu, host_source=host, low_util_window=5).start()


def _run_evaluator(tmp_path, gpu, host, run_info: dict, versions=(1, 2, 3)) -> tuple[dict, str]:
    ev = _FakeMonitorEvaluator(
        gpu,
        host,
        model="cifar10_convnet",
        dataset={"name": "synthetic", "synthetic_size": 200, "seed": 0},
        compute_device="cpu",
        results_dir=str(tmp_path),
        max_model_version=max(versions),
        updates_per_version=8,
        run_info=run_info,
    )
    ctx = FLContext()
    ev._start_run("start_run", ctx)
    monitor = ev._sysmon
    assert monitor is not None and monitor.running
    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    for version in versions:
        time.sleep(0.08)  # a few samples per version
        ctx.set_prop(AppConstants.CURRENT_ROUND, version, private=True, sticky=False)
        ctx.set_prop(AppConstants.GLOBAL_MODEL, {"weights": weights}, private=True, sticky=False)
        ev._evaluate("global_weights_updated", ctx)
    ev._end_run("end_run", ctx)
    assert not monitor.running and ev._sysmon is None  # the thread was joined
    assert not any(t.name == "system-monitor" and t.is_alive() for t in threading.enumerate())
    count = len(monitor.samples())
    time.sleep(0.05)
    assert len(monitor.samples()) == count  # nothing samples after END_RUN
    return json.loads((tmp_path / "metrics.json").read_text()), str(tmp_path)


def test_evaluator_records_system_figures_and_warns_on_low_gpu_use(tmp_path, capsys):
    run_info = {
        "config": {"engine": "per-device"},
        "environment": {"compute_device": "cuda:0", "cpu_cores": 8},
        "planner": {"num_workers": 4},
    }
    gpu = FakeGpuSource(util_percent=[12.0], mem_used_gb=[1.5], mem_total_gb=80.0)
    metrics, out = _run_evaluator(tmp_path, gpu, FakeHostSource(cpu_percent=[35.0]), run_info)
    records = metrics["versions"]
    assert [r["version"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["system"]["gpu_util_percent"] == 12.0 and r["system"]["vram_used_gb"] == 1.5
        assert r["system"]["vram_total_gb"] == 80.0 and r["system"]["cpu_percent"] == 35.0
        assert r["system"]["num_samples"] >= 1
    assert records[0]["devices_per_second"] is None and records[2]["devices_per_second"] > 0
    assert metrics["planner"]["num_workers"] == 4  # run_info is kept

    system = metrics["system"]
    assert system["num_samples"] >= 10 and system["gpus"][0]["util_percent_mean"] == 12.0
    assert len(system["warnings"]) == 1
    warning = system["warnings"][0]
    assert "below 30%" in warning and "per-device" in warning and "--engine vectorized" in warning

    printed = capsys.readouterr().out
    assert "[edgesim] version 3/3" in printed and "GPU 12% | VRAM 1.5/80.0 GB | CPU 35%" in printed
    assert "[edgesim] system: GPU0 mean 12%" in printed
    assert f"[edgesim] WARNING: {warning}" in printed
    assert glob.glob(f"{out}/tensorboard/events.out.tfevents.*")

    summary = format_summary({"total_seconds": 1.0, "versions_trained": 2, "final_accuracy": 0.1,
                              "best_accuracy": 0.1, "system": system}, out)  # fmt: skip
    assert "[edgesim] system: GPU0 mean 12%" in summary and "--engine vectorized" in summary


def test_evaluator_without_gpu_writes_null_gpu_fields_and_no_warning(tmp_path):
    metrics, _ = _run_evaluator(tmp_path, NoGpuSource(), FakeHostSource(cpu_percent=[97.0]), {}, versions=(1, 2))
    for r in metrics["versions"]:
        assert all(r["system"][k] is None for k in GPU_FIELDS), r
        assert r["system"]["cpu_percent"] == 97.0 and r["system"]["ram_total_gb"] == 16.0
    assert metrics["system"]["gpus"] is None and metrics["system"]["warnings"] == []


def test_evaluator_with_monitor_off_still_records(tmp_path):
    ev = GlobalModelEvaluator(
        model="cifar10_convnet",
        dataset={"name": "synthetic", "synthetic_size": 200, "seed": 0},
        compute_device="cpu",
        results_dir=str(tmp_path),
        max_model_version=1,
        monitor=False,
    )
    ctx = FLContext()
    ev._start_run("start_run", ctx)
    assert ev._sysmon is None
    ctx.set_prop(AppConstants.CURRENT_ROUND, 1, private=True, sticky=False)
    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    ctx.set_prop(AppConstants.GLOBAL_MODEL, {"weights": weights}, private=True, sticky=False)
    ev._evaluate("global_weights_updated", ctx)
    ev._end_run("end_run", ctx)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["versions"][0]["system"]["num_samples"] == 0 and "system" not in metrics
