"""Measured device speeds: a FedScale-format capacity trace, and which trace client each simulated device is.

FedScale (``fedscale/cloud``) ships its clients' measured capacities as
``{client_id: {"computation": ms per training sample, "communication": kbit/s}}``, a pickle (its own files) or
JSON. With ``--capacity-file`` a device's training time is ``samples per task x computation x cost / 1000``
simulated seconds, and its download and upload times each ``model bits / (communication x 1000)``
(``common.delays.DeviceDelays``).

A fleet larger (or smaller) than the trace takes its clients by a seeded rule: device ``d`` is the client at
position ``stable_seed("capacity", seed, d) mod (number of clients)`` of the sorted client ids, so every process
maps every device the same way, whatever its order.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
from collections.abc import Mapping

from common.choices import ConfigError
from common.seeds import stable_seed


@functools.lru_cache(maxsize=4)
def load_capacities(path: str) -> tuple[tuple[str, float, float], ...]:
    """The trace's ``(client id, ms per sample, kbit/s)``, sorted by client id; ``ConfigError`` naming the fix for a
    file that is missing, unreadable or not in FedScale's format."""
    fix = "give a FedScale capacity file: {client_id: {'computation': ms per sample, 'communication': kbit/s}}"
    if not os.path.isfile(path):
        raise ConfigError(f"--capacity-file {path}: no such file; {fix}")
    try:
        if path.endswith(".json"):
            with open(path) as f:
                raw = json.load(f)
        else:
            with open(path, "rb") as f:
                raw = pickle.load(f)  # FedScale ships pickles; the user names the file
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as ex:
        raise ConfigError(f"--capacity-file {path}: cannot read it ({type(ex).__name__}: {ex}); {fix}") from ex
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(f"--capacity-file {path}: holds no clients; {fix}")
    out = []
    for client, entry in raw.items():
        try:
            comp, comm = float(entry["computation"]), float(entry["communication"])
        except (TypeError, KeyError, ValueError) as ex:
            raise ConfigError(
                f"--capacity-file {path}: client {client!r} is not {{computation, communication}}; {fix}"
            ) from ex
        if not (comp >= 0 and comm > 0):
            raise ConfigError(f"--capacity-file {path}: client {client!r} has computation {comp}, communication {comm}")
        out.append((str(client), comp, comm))
    return tuple(sorted(out))


def device_capacity(path: str, seed: int, device_id: str) -> tuple[float, float]:
    """(ms per training sample, kbit/s) of the trace client device ``device_id`` is (see the module docstring)."""
    clients = load_capacities(path)
    _, comp, comm = clients[stable_seed("capacity", seed, device_id) % len(clients)]
    return comp, comm
