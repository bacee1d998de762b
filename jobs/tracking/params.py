"""A run's whole configuration as a tracker's flat parameters, named as its flags (``local-lr``, ``fr-s-max``)."""

from __future__ import annotations

import json

MAX_VALUE = 6000  # MLflow's longest parameter value (characters)


def value_text(value) -> str:
    """A parameter's value as text: lists and mappings as JSON, anything else as ``str`` gives it."""
    text = json.dumps(value) if isinstance(value, (list, tuple, dict)) else str(value)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 3] + "..."


def flat_params(config: dict, flag_prefix: str = "") -> dict[str, str]:
    """``JobConfig.to_dict()`` flattened: each part's field under its flag's name (``device_reuse`` ->
    ``device-reuse``), the method's settings under ``<flag_prefix>-<field>`` and the method as ``method``."""
    flat = {"method": value_text(config.get("method"))}
    for part, fields in config.items():
        if part in ("method", "method_settings") or not isinstance(fields, dict):
            continue
        flat |= {name.replace("_", "-"): value_text(v) for name, v in fields.items()}
    for name, v in (config.get("method_settings") or {}).items():
        flat[f"{flag_prefix}-{name}".replace("_", "-")] = value_text(v)
    return dict(sorted(flat.items()))
