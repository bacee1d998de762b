"""Objects named by an import path ``package.module:Name`` (a user's model, data function or method)."""

from __future__ import annotations

import importlib


def import_object(path: str, what: str) -> object:
    """The object ``path`` (``package.module:Name``, ``Name`` may be dotted) names; ``ValueError`` naming the fix
    otherwise (``what``: the flag or option it came from, e.g. ``--method``)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} {path!r}: give an import path package.module:Name")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as ex:
        raise ValueError(f"{what} {path!r}: cannot import {attr} from {module_name} ({ex})") from ex
    return obj
