"""What crosses NVFlare's routing proxy to and from a real device: JSON-safe weights.

A real device (NVFlare's HTTP device client, a phone app) reaches a leaf through NVFlare's routing proxy, whose
answers are JSON: a model or diff travels as nested lists of numbers, NVFlare's own convention on that path (its
``BuffModelManager`` sends lists, its ``ETTaskProcessor`` returns them). The leaf converts once at each crossing:
a version's weights to lists when a device first asks for it (cached per version), a device's diff back to float32
arrays when it reports. Summing and aggregation never see lists; simulated devices never take this path.
"""

from __future__ import annotations

import numpy as np

from common.finite import nonfinite_entry
from common.protocol import DEVICE_EXTRA_PREFIX

# task metadata: what a device needs to train this job as the simulation would (data, model, optimiser, seed, the
# method's device hook); a real device with its own data and model may ignore it
DEVICE_SETTINGS_META = "edgesim_device_settings"


def to_wire(weights: dict) -> dict:
    """Arrays as nested lists (JSON-safe); anything else as it is."""
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in weights.items()}


def from_wire(weights: dict) -> dict[str, np.ndarray]:
    """A device's diff as float32 arrays (nested lists keep their shape); refuses anything that is not numbers."""
    out = {}
    for k, v in weights.items():
        try:
            out[k] = np.asarray(v, dtype=np.float32)
        except (TypeError, ValueError) as ex:  # a ragged list, a string, a dict: not an array of numbers
            raise ValueError(f"entry {k!r} of a device's result is not an array of numbers ({ex})") from ex
    return out


def diff_problem(diff: dict[str, np.ndarray], weights: dict) -> str:
    """Why a real device's diff cannot go into the model trained from ``weights`` ("" if it can): a missing or
    unknown entry, a wrong shape, a value that is not finite. A device's own reports (``DEVICE_EXTRA_PREFIX``) and
    the server's extra state for devices are not model entries."""
    model = {k: v for k, v in weights.items() if not k.startswith(DEVICE_EXTRA_PREFIX)}
    entries = {k: v for k, v in diff.items() if not k.startswith(DEVICE_EXTRA_PREFIX)}
    if set(model) != set(entries):
        missing, unknown = sorted(set(model) - set(entries)), sorted(set(entries) - set(model))
        return f"its entries differ from the model's (missing {missing[:3]}, unknown {unknown[:3]})"
    for k, v in entries.items():
        if v.shape != np.shape(model[k]):
            return f"entry {k!r} has shape {v.shape}, the model's {np.shape(model[k])}"
    name = nonfinite_entry(diff)
    return f"entry {name!r} is not finite" if name else ""
