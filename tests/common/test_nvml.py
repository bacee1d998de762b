"""The one NVML probe (``common.nvml``), on a faked ``pynvml``: the planner sees the GPUs CUDA_VISIBLE_DEVICES
lets it use, with their memory; an unreadable field is None; no NVML means no GPU readings, never zeros."""

from __future__ import annotations

import pytest

from common.nvml import Nvml, visible_indices
from simulation import planner
from tests.fakes.monitor_fakes import break_nvml

GB = 1024**3


@pytest.fixture
def three_gpus(monkeypatch):
    pynvml = pytest.importorskip("pynvml")

    class Mem:
        def __init__(self, i):
            self.total, self.used, self.free = 80 * GB, i * GB, (80 - i) * GB

    def util(handle):
        if handle == 2:  # e.g. a MIG device
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

        class Util:
            gpu = 10 * handle

        return Util()

    for name, fn in {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 3,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: f"GPU {h}".encode(),
        "nvmlDeviceGetUtilizationRates": util,
        "nvmlDeviceGetMemoryInfo": Mem,
    }.items():
        monkeypatch.setattr(pynvml, name, fn)
    return pynvml


def test_the_planner_sees_the_visible_gpus_and_their_free_memory(three_gpus, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    gpus = planner._probe_gpus()
    assert [(g.name, g.total_bytes, g.free_bytes) for g in gpus] == [
        ("GPU 2", 80 * GB, 78 * GB),
        ("GPU 0", 80 * GB, 80 * GB),
    ]
    with Nvml() as nvml:
        assert nvml.names == ["GPU 0", "GPU 1", "GPU 2"]
        assert nvml.utilisation(1) == 10.0 and nvml.utilisation(2) is None  # refused by NVML: unknown, not 0
        assert nvml.memory(1).used == GB


def test_cuda_visible_devices_maps_onto_nvml_numbers(monkeypatch):
    for value, expected in (("1", [1]), ("", []), ("0,7", [0]), ("GPU-1234", [0, 1, 2])):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
        assert visible_indices(3) == expected, value
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_indices(3) == [0, 1, 2]


def test_without_nvml_there_are_no_readings(monkeypatch):
    break_nvml(monkeypatch)
    nvml = Nvml()
    assert not nvml.available and nvml.count == 0 and nvml.memory(0) is None and nvml.utilisation(0) is None
