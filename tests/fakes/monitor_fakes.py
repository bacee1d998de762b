"""Scripted stand-ins for ``simulation.monitor``'s host and GPU sources, for tests and dry runs.

Each ``read()`` returns the next scripted value; after the script runs out the last value repeats.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class FakeHostSource:
    """Host readings from scripted CPU percentages and fixed (or scripted) RAM use."""

    def __init__(
        self,
        cpu_percent: Sequence[float] = (50.0,),
        ram_used_gb: Sequence[float] = (4.0,),
        ram_total_gb: float = 16.0,
    ) -> None:
        self._cpu = list(cpu_percent)
        self._ram = list(ram_used_gb)
        self._total = ram_total_gb
        self.reads = 0

    def read(self) -> dict[str, float]:
        i = self.reads
        self.reads += 1
        return {
            "cpu_percent": self._cpu[min(i, len(self._cpu) - 1)],
            "ram_used_gb": self._ram[min(i, len(self._ram) - 1)],
            "ram_total_gb": self._total,
        }


class FakeGpuSource:
    """GPU readings: ``util_percent[k]`` and ``mem_used_gb[k]`` are the k-th read's values for every GPU."""

    def __init__(
        self,
        util_percent: Sequence[float] = (90.0,),
        mem_used_gb: Sequence[float] = (2.0,),
        mem_total_gb: float = 80.0,
        num_gpus: int = 1,
        name: str = "Fake GPU",
    ) -> None:
        self._util = list(util_percent)
        self._mem = list(mem_used_gb)
        self._total = mem_total_gb
        self._num = num_gpus
        self._name = name
        self.reads = 0
        self.closed = False

    def read(self) -> list[dict[str, Any]] | None:
        i = self.reads
        self.reads += 1
        return [
            {
                "index": g,
                "name": self._name,
                "util_percent": self._util[min(i, len(self._util) - 1)],
                "mem_used_gb": self._mem[min(i, len(self._mem) - 1)],
                "mem_total_gb": self._total,
            }
            for g in range(self._num)
        ]

    def close(self) -> None:
        self.closed = True


class NoGpuSource:
    """A machine without a usable GPU: every read is ``None``."""

    def read(self) -> None:
        return None


def break_nvml(monkeypatch) -> None:
    """Make ``pynvml.nvmlInit`` fail as it does on a machine without the NVIDIA driver (skip without pynvml)."""
    import pytest

    pynvml = pytest.importorskip("pynvml")

    def fail():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
