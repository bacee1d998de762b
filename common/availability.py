"""When a device is online: a pure function of (run seed, device id, simulated time), like its delays.

Models (``DelayConfig.availability``):

* ``always``: every device is online at every moment (the default; what the FedRevive reference simulates).
* ``diurnal``: a daily on/off pattern with a per-device phase. Device ``d`` has phase ``p_d`` drawn uniformly in
  [0, 1) from (seed, d); it is online while ``frac(t / period + p_d) < online``, so each day it is online for one
  session of ``online x period`` time units (the mean session length), at its own hour.
* a FedScale availability trace (pickle or JSON, as FedScale ships ``client_behave_trace``):
  ``{client_id: {"active": [t...], "inactive": [t...], "finish_time": T, ...}}``: the client is online from each
  ``active[k]`` to ``inactive[k]``, and the pattern repeats with period ``T``. Devices take trace clients by the
  seeded rule of ``common.capacity`` (position ``stable_seed("availability", seed, d) mod clients``).

The schedule (``scheduling.schedule``) selects only online devices, and a device that goes offline before its
update arrives drops out at that moment (``session_end``).
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import os
import pickle
from collections.abc import Mapping

import numpy as np

from common.choices import ConfigError
from common.seeds import stable_seed

NAMED = ("always", "diurnal")


@functools.lru_cache(maxsize=4)
def load_availability(path: str) -> tuple[tuple[str, tuple[float, ...], tuple[float, ...], float], ...]:
    """The trace's ``(client id, active starts, their ends, period)``, sorted by client id; ``ConfigError`` naming
    the fix for a missing or malformed file."""
    fix = "give a FedScale availability file: {client_id: {'active': [...], 'inactive': [...], 'finish_time': T}}"
    if not os.path.isfile(path):
        raise ConfigError(f"--availability {path}: no such file; use always, diurnal, or {fix}")
    try:
        if path.endswith(".json"):
            with open(path) as f:
                raw = json.load(f)
        else:
            with open(path, "rb") as f:
                raw = pickle.load(f)  # FedScale ships pickles; the user names the file
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as ex:
        raise ConfigError(f"--availability {path}: cannot read it ({type(ex).__name__}: {ex}); {fix}") from ex
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(f"--availability {path}: holds no clients; {fix}")
    out = []
    for client, entry in raw.items():
        try:
            starts = tuple(float(t) for t in entry["active"])
            ends = tuple(float(t) for t in entry["inactive"])
            period = float(entry["finish_time"])
        except (TypeError, KeyError, ValueError) as ex:
            raise ConfigError(f"--availability {path}: client {client!r} lacks active/inactive/finish_time") from ex
        windows_ok = len(starts) == len(ends) and all(a < b for a, b in zip(starts, ends, strict=True))
        ordered = all(b <= a for b, a in zip(ends, starts[1:], strict=False))
        if not (
            period > 0 and windows_ok and ordered and (not ends or ends[-1] <= period) and min(starts, default=0) >= 0
        ):
            raise ConfigError(
                f"--availability {path}: client {client!r} needs ordered windows active[k] < inactive[k] <= "
                "active[k+1] inside [0, finish_time]"
            )
        # windows that touch (one ends as the next starts) are one session: the device never goes offline between
        merged_starts, merged_ends = list(starts[:1]), list(ends[:1])
        for a, b in zip(starts[1:], ends[1:], strict=True):
            if a == merged_ends[-1]:
                merged_ends[-1] = b
            else:
                merged_starts.append(a)
                merged_ends.append(b)
        out.append((str(client), tuple(merged_starts), tuple(merged_ends), period))
    return tuple(sorted(out))


def check_named_availability(spec: str, period: float, online: float) -> None:
    """Refuse a named model's settings that cannot be used, naming the fix (no file is read)."""
    if spec == "diurnal" and not (period > 0 and 0 < online <= 1):
        raise ConfigError(
            f"--availability diurnal needs --availability-period > 0 and --availability-online in (0, 1]; got "
            f"{period} and {online}"
        )


def check_availability(spec: str, period: float, online: float) -> None:
    """Refuse a model that cannot be used, naming the fix: a named one's settings, or a trace file (read here)."""
    if spec in NAMED:
        check_named_availability(spec, period, online)
        return
    load_availability(spec)


class Availability:
    """One run's availability model (see the module docstring)."""

    def __init__(self, spec: str, seed: int, period: float = 24.0, online: float = 0.5):
        self.spec, self.seed, self.period, self.online_share = spec, seed, period, online
        self._fleet: tuple[int, np.ndarray] | None = None  # (pool size, each device's phase or trace client)

    @property
    def always(self) -> bool:
        return self.spec == "always"

    def _phase(self, device_id: str) -> float:
        return (stable_seed("availability-phase", self.seed, device_id) % 2**53) / 2**53

    def _client(self, device_id: str):
        clients = load_availability(self.spec)
        return clients[stable_seed("availability", self.seed, device_id) % len(clients)]

    def session(self, device_id: str, t: float) -> tuple[float, float]:
        """``(start, end)`` of the device's session that holds ``t``, or of its next one (``inf``: never online, or
        never offline again). ``end > t`` always, in floating point too: a session that ends at ``t`` by rounding is
        over, so a device is never dispatched into a session of zero length."""
        if self.always:
            return -math.inf, math.inf
        if self.spec == "diurnal":
            if self.online_share >= 1:
                return -math.inf, math.inf
            # day m's session is [(m - phase) x period, + online x period): computed from m alone, so the start
            # ``online_from`` gives is, to the bit, the start ``online`` finds there
            phase = self._phase(device_id)
            m = math.floor(t / self.period + phase) - 1
            while True:
                start = (m - phase) * self.period
                end = start + self.online_share * self.period
                if end > t:
                    return start, end
                m += 1
        _, starts, ends, period = self._client(device_id)
        if not starts:
            return math.inf, math.inf
        cycle, offset = divmod(t, period)
        k = bisect.bisect_right(starts, offset) - 1
        if k < 0 or offset >= ends[k]:
            cycle, k = self._next_window(cycle, k, len(starts))
        while True:
            start, end = cycle * period + starts[k], self._window_end(cycle, k, starts, ends, period)
            if end > t:
                return start, end
            cycle, k = self._next_window(cycle, k, len(starts))

    @staticmethod
    def _next_window(cycle: float, k: int, windows: int) -> tuple[float, int]:
        return (cycle, k + 1) if k + 1 < windows else (cycle + 1, 0)

    @staticmethod
    def _window_end(cycle: float, k: int, starts, ends, period: float) -> float:
        """The end of window ``k`` of ``cycle``; the last window, when it runs to the cycle's end and the next cycle
        opens online, goes on into that first window (``inf``: the device is always online)."""
        if k + 1 < len(starts) or ends[k] < period or starts[0] > 0.0:
            return cycle * period + ends[k]
        return math.inf if ends[0] >= period else (cycle + 1) * period + ends[0]

    def online_count(self, pool, t: float) -> int:
        """How many devices of ``pool`` (a ``scheduling.device_pool.DevicePool``, or any sized sequence of ids
        with ``device_at``) are online at ``t``: vectorised over the devices, their phases or trace clients drawn
        once per pool size."""
        n = len(pool)
        if self.always or n == 0:
            return n
        if self._fleet is None or self._fleet[0] != n:
            ids = [pool.device_at(i) for i in range(n)]
            if self.spec == "diurnal":
                keys = np.array([self._phase(d) for d in ids])
            else:
                clients = load_availability(self.spec)
                keys = np.array([stable_seed("availability", self.seed, d) % len(clients) for d in ids])
            self._fleet = (n, keys)
        keys = self._fleet[1]
        if self.spec == "diurnal":
            return int(np.count_nonzero((t / self.period + keys) % 1.0 < self.online_share))
        clients = load_availability(self.spec)
        per_client = np.array([self.online_client(c, t) for c in range(len(clients))])
        return int(np.count_nonzero(per_client[keys]))

    def online_client(self, index: int, t: float) -> bool:
        """Whether trace client ``index`` (in ``load_availability`` order) is online at ``t``."""
        _, starts, ends, period = load_availability(self.spec)[index]
        offset = t % period
        k = bisect.bisect_right(starts, offset) - 1
        return k >= 0 and offset < ends[k]

    def online(self, device_id: str, t: float) -> bool:
        """Whether the device is online at simulated time ``t``."""
        return self.always or self.session(device_id, t)[0] <= t

    def online_from(self, device_id: str, t: float) -> float:
        """The first moment at or after ``t`` the device is online (``inf``: never)."""
        return t if self.always else max(t, self.session(device_id, t)[0])

    def session_end(self, device_id: str, t: float) -> float:
        """When the session the device is in at ``t`` ends, or, offline at ``t``, when its next one ends (``inf``:
        never). The schedule bounds a dispatch by it."""
        return math.inf if self.always else self.session(device_id, t)[1]
