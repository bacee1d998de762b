"""SystemMonitor: sampling thread, GPU-less fallback, low-utilisation diagnosis, summary, status and TensorBoard."""

from __future__ import annotations

import json
import time

import pytest

from evaluation.monitor import NvmlSource, PsutilSource, SystemMonitor
from evaluation.utilisation import diagnose, format_status, summarize, write_tensorboard
from tests.fakes.monitor_fakes import FakeGpuSource, FakeHostSource, NoGpuSource, break_nvml

PER_DEVICE_CTX = {"engine": "per-device", "num_workers": 4, "cpu_cores": 16, "compute_device": "cuda"}
GOOD_CTX = {"engine": "vectorized", "num_workers": 4, "cpu_cores": 16, "compute_device": "cuda"}


def _flags(warning: str) -> list[str]:
    """The ``--flags`` a warning names; diagnose may name only --engine, --num-workers and --compute-device."""
    return [w for w in warning.replace(",", " ").replace(";", " ").replace(")", " ").split() if w.startswith("--")]


def _assert_only_real_flags(warnings: list[str]) -> None:
    for w in warnings:
        assert _flags(w), f"no flag named: {w}"
        assert set(_flags(w)) <= {"--engine", "--num-workers", "--compute-device"}, w
        assert "--data-device" not in w and "--local-batch-size" not in w and "--num-leaf-nodes" not in w


def _run(gpu, host, n: int, **kw) -> SystemMonitor:
    mon = SystemMonitor(interval=1.0, gpu_source=gpu, host_source=host, **kw)
    for _ in range(n):
        mon.sample_once()
    return mon


def test_low_gpu_util_with_per_device_engine_warns_to_use_vectorized_engine():
    mon = _run(FakeGpuSource(util_percent=[12.0]), FakeHostSource(cpu_percent=[40.0]), 6, low_util_window=5)
    warnings = mon.diagnose(PER_DEVICE_CTX)
    assert len(warnings) == 1
    assert "per-device" in warnings[0] and "--engine vectorized" in warnings[0]
    assert "30%" in warnings[0]
    _assert_only_real_flags(warnings)


def test_high_gpu_util_gives_no_warning():
    mon = _run(FakeGpuSource(util_percent=[85.0, 95.0]), FakeHostSource(cpu_percent=[99.0]), 20, low_util_window=5)
    assert mon.diagnose(PER_DEVICE_CTX | {"num_workers": 1}) == []


def test_short_dip_below_the_window_gives_no_warning():
    utils = [90.0, 10.0, 10.0, 90.0, 10.0, 10.0, 10.0, 90.0]
    mon = _run(FakeGpuSource(util_percent=utils), FakeHostSource(), len(utils), low_util_window=4)
    assert mon.diagnose(PER_DEVICE_CTX) == []


def test_no_gpu_source_reports_gpus_none_and_no_warning():
    mon = _run(NoGpuSource(), FakeHostSource(cpu_percent=[99.0]), 12, low_util_window=3)
    sample = mon.latest()
    assert sample["gpus"] is None
    assert sample["cpu_percent"] == 99.0 and sample["ram_total_gb"] == 16.0
    assert json.loads(json.dumps(sample))["gpus"] is None  # null in JSON, never zeros
    assert mon.diagnose(PER_DEVICE_CTX) == []
    assert summarize(mon.samples())["gpus"] is None


def test_cpu_saturation_with_per_device_engine_is_cpu_bound_and_suggests_vectorized():
    mon = _run(FakeGpuSource(util_percent=[5.0]), FakeHostSource(cpu_percent=[97.0]), 5, low_util_window=5)
    warnings = mon.diagnose(PER_DEVICE_CTX)
    assert len(warnings) == 1
    assert "CPU-bound" in warnings[0] and "(16 cores)" in warnings[0] and "--engine vectorized" in warnings[0]
    _assert_only_real_flags(warnings)


def test_cpu_saturation_with_vectorized_engine_suggests_fewer_workers():
    mon = _run(FakeGpuSource(util_percent=[5.0]), FakeHostSource(cpu_percent=[97.0]), 5, low_util_window=5)
    warnings = mon.diagnose(GOOD_CTX)
    assert len(warnings) == 1 and "CPU-bound" in warnings[0] and "--num-workers 2" in warnings[0]
    assert "--engine" not in warnings[0]
    _assert_only_real_flags(warnings)


def test_single_worker_is_reported_with_num_workers_flag():
    samples = _run(FakeGpuSource(util_percent=[5.0]), FakeHostSource(cpu_percent=[30.0]), 5).samples()
    warnings = diagnose(samples, GOOD_CTX | {"num_workers": 1}, window=5)
    assert len(warnings) == 1 and "--num-workers 8" in warnings[0] and "one at a time" in warnings[0]
    _assert_only_real_flags(warnings)


def test_cpu_data_context_gives_no_data_device_advice():
    """Data always lives on the compute device: a stale ``data_device`` key must not produce --data-device advice."""
    samples = _run(FakeGpuSource(util_percent=[5.0]), FakeHostSource(cpu_percent=[30.0]), 5).samples()
    warnings = diagnose(samples, GOOD_CTX | {"data_device": "cpu"}, window=5)
    assert len(warnings) == 1 and "--num-workers 8" in warnings[0]  # the generic advice: more work in flight
    _assert_only_real_flags(warnings)


def test_every_rule_names_only_real_flags():
    samples = _run(FakeGpuSource(util_percent=[3.0]), FakeHostSource(cpu_percent=[20.0]), 5).samples()
    contexts = [
        {},
        {"compute_device": "cpu"},
        {"compute_device": "cuda:0", "engine": "per-device", "num_workers": 1, "cpu_cores": 2},
        GOOD_CTX,
        PER_DEVICE_CTX,
    ]
    for ctx in contexts:
        warnings = diagnose(samples, ctx, window=5)
        assert warnings, ctx
        _assert_only_real_flags(warnings)


def test_compute_on_cpu_with_idle_gpu_suggests_compute_device_cuda():
    samples = _run(FakeGpuSource(util_percent=[0.0]), FakeHostSource(), 5).samples()
    warnings = diagnose(samples, GOOD_CTX | {"compute_device": "cpu"}, window=5)
    assert len(warnings) == 1 and "--compute-device cuda" in warnings[0]
    _assert_only_real_flags(warnings)


def test_thread_samples_at_the_interval_and_stops_cleanly():
    gpu, host = FakeGpuSource(), FakeHostSource()
    with SystemMonitor(interval=0.01, gpu_source=gpu, host_source=host) as mon:
        time.sleep(0.25)
        assert mon.running
    assert not mon.running
    samples = mon.samples()
    assert 5 <= len(samples) <= 40
    times = [s["t"] for s in samples]
    assert times == sorted(times) and times[0] < 0.05
    assert min(b - a for a, b in zip(times, times[1:], strict=False)) >= 0.008
    count = len(samples)
    time.sleep(0.05)
    assert len(mon.samples()) == count  # nothing sampled after stop()
    assert not gpu.closed  # an injected source belongs to the caller


def test_failing_source_does_not_kill_the_thread():
    class Broken:
        def read(self):
            raise RuntimeError("GPU fell off the bus")

    mon = SystemMonitor(interval=0.01, gpu_source=Broken(), host_source=FakeHostSource()).start()
    time.sleep(0.05)
    mon.stop()
    assert len(mon.samples()) >= 2 and all(s["gpus"] is None for s in mon.samples())


def test_summarize_computes_peaks_and_means():
    gpu = FakeGpuSource(util_percent=[20.0, 80.0, 50.0], mem_used_gb=[1.0, 7.5, 3.0], num_gpus=2)
    host = FakeHostSource(cpu_percent=[10.0, 30.0, 50.0], ram_used_gb=[2.0, 9.0, 4.0])
    s = summarize(_run(gpu, host, 3).samples())
    assert s["num_samples"] == 3
    assert s["cpu_percent_mean"] == pytest.approx(30.0) and s["cpu_percent_max"] == 50.0
    assert s["ram_used_gb_peak"] == 9.0 and s["ram_total_gb"] == 16.0
    assert [g["index"] for g in s["gpus"]] == [0, 1]
    assert s["gpus"][0]["util_percent_mean"] == pytest.approx(50.0)
    assert s["gpus"][0]["util_percent_max"] == 80.0
    assert s["gpus"][1]["mem_used_gb_peak"] == 7.5 and s["gpu_mem_used_gb_peak"] == 7.5
    json.dumps(s)
    assert summarize([])["num_samples"] == 0


def test_format_status_shows_gpu_and_omits_it_when_none():
    base = {"t": 1.0, "cpu_percent": 45.0, "ram_used_gb": 6.2, "ram_total_gb": 24.0}
    gpu = {"index": 0, "name": "x", "util_percent": 87.0, "mem_used_gb": 3.1, "mem_total_gb": 80.0}
    assert format_status(base | {"gpus": [gpu]}) == "GPU 87% | VRAM 3.1/80.0 GB | CPU 45% | RAM 6.2/24.0 GB"
    assert format_status(base | {"gpus": None}) == "CPU 45% | RAM 6.2/24.0 GB"
    two = format_status(base | {"gpus": [gpu, gpu | {"index": 1, "util_percent": 5.0}]})
    assert two.startswith("GPU0 87% VRAM 3.1/80.0 GB | GPU1 5% VRAM")
    assert format_status(None) == ""


def test_write_tensorboard_adds_scalars_against_sample_time():
    class Writer:
        def __init__(self):
            self.calls = []

        def add_scalar(self, tag, value, global_step=None, walltime=None):
            self.calls.append((tag, value, global_step, walltime))

    samples = _run(FakeGpuSource(util_percent=[40.0]), FakeHostSource(), 2).samples()
    samples[1]["t"] = 3.0
    samples.append({"t": 4.0, "cpu_percent": 1.0, "ram_used_gb": 2.0, "ram_total_gb": 16.0, "gpus": None})
    w = Writer()
    assert write_tensorboard(samples, w, start_walltime=100.0) == 4 + 4 + 2
    tags = {c[0] for c in w.calls}
    assert tags == {"system/cpu_percent", "system/ram_used_gb", "system/gpu0/util_percent", "system/gpu0/mem_used_gb"}
    assert ("system/gpu0/util_percent", 40.0, 3, 103.0) in w.calls
    assert ("system/cpu_percent", 1.0, 4, 104.0) in w.calls


def test_nvml_init_failure_means_no_gpu_data(monkeypatch):
    break_nvml(monkeypatch)
    src = NvmlSource()
    assert not src.available and src.read() is None
    mon = SystemMonitor(gpu_source=src, host_source=FakeHostSource())
    assert mon.sample_once()["gpus"] is None


def test_nvml_source_reads_per_device_util_and_memory(monkeypatch):
    pynvml = pytest.importorskip("pynvml")

    class Util:
        gpu = 73

    class Mem:
        used = 3 * 1024**3
        total = 80 * 1024**3
        free = 77 * 1024**3

    def util(handle):
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return Util()

    for name, fn in {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: b"NVIDIA H100",
        "nvmlDeviceGetUtilizationRates": util,
        "nvmlDeviceGetMemoryInfo": lambda h: Mem(),
    }.items():
        monkeypatch.setattr(pynvml, name, fn)
    src = NvmlSource()
    gpus = src.read()
    src.close()
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA H100",
        "util_percent": 73.0,
        "mem_used_gb": 3.0,
        "mem_total_gb": 80.0,
    }
    assert gpus[1]["util_percent"] is None and gpus[1]["mem_used_gb"] == 3.0  # unreadable field: None, not 0


def test_psutil_source_reads_real_host():
    r = PsutilSource().read()
    assert 0.0 <= r["cpu_percent"] <= 100.0
    assert 0.0 < r["ram_used_gb"] <= r["ram_total_gb"]
