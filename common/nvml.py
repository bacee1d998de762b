"""The project's one NVML probe: each GPU's name, memory and utilisation, as NVML reports them.

The worker planner (``simulation.planner.probe_hardware``: each visible GPU's total and free memory, once) and the
system monitor (``evaluation.monitor.NvmlSource``: utilisation and memory at every sample) both read GPUs here.
NVML numbers GPUs physically; ``visible_indices`` maps ``CUDA_VISIBLE_DEVICES`` onto those numbers. Any failure
(no ``pynvml``, no driver, no GPU) leaves the probe unavailable, and a reading NVML refuses (the utilisation of a
MIG device, say) is ``None``: a reader never gets zeros it did not measure.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory in bytes.

    Attributes:
        total: its size.
        used: in use, by any process.
        free: not in use.
    """

    total: int
    used: int
    free: int


def _quiet(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # an NVMLError of any kind: the reading is unknown
        return None


class Nvml:
    """NVML, opened once for several readings (close it, or use ``with``). ``available`` is False, silently (a
    debug log line), when NVML cannot start or finds no GPU."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self.names: list[str] = []
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:  # ImportError, NVMLError_LibraryNotFound, driver mismatch, ...
            logger.debug("NVML unavailable: %s", e)
            return
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            names = [pynvml.nvmlDeviceGetName(h) for h in handles]
        except Exception as e:
            logger.debug("NVML could not list GPUs: %s", e)
            handles, names = [], []
        if not handles:
            _quiet(pynvml.nvmlShutdown)
            return
        self._nvml, self._handles = pynvml, handles
        self.names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]

    @property
    def available(self) -> bool:
        return self._nvml is not None

    @property
    def count(self) -> int:
        """GPUs NVML sees (all of them, whatever ``CUDA_VISIBLE_DEVICES`` says)."""
        return len(self._handles)

    def memory(self, index: int) -> GpuMemory | None:
        """GPU ``index``'s memory (NVML's numbering); ``None`` when NVML does not say."""
        if self._nvml is None:
            return None
        mem = _quiet(lambda: self._nvml.nvmlDeviceGetMemoryInfo(self._handles[index]))
        return GpuMemory(int(mem.total), int(mem.used), int(mem.free)) if mem is not None else None

    def utilisation(self, index: int) -> float | None:
        """GPU ``index``'s utilisation in percent over NVML's last sample period; ``None`` when NVML does not say."""
        if self._nvml is None:
            return None
        return _quiet(lambda: float(self._nvml.nvmlDeviceGetUtilizationRates(self._handles[index]).gpu))

    def close(self) -> None:
        if self._nvml is not None:
            _quiet(self._nvml.nvmlShutdown)
            self._nvml = None

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def visible_indices(count: int) -> list[int]:
    """The NVML numbers of the GPUs this process may use: those ``CUDA_VISIBLE_DEVICES`` lists by number (an empty
    value: none), or all ``count``. GPUs listed by UUID are not mapped: then all count."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    ids = [part.strip() for part in visible.split(",") if part.strip()]
    if not ids:
        return []
    if not all(i.isdigit() for i in ids):
        return list(range(count))
    return [int(i) for i in ids if int(i) < count]
