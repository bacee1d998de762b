"""Objects named by an import path ``package.module:Name`` (a user's model, data function or method)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable


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


def import_path(obj: Callable, what: str) -> str:
    """``module:qualname`` of a class or function, importable by the job's processes. One defined in the script
    being run is named by the script's file, which the job ships (``jobs.run.recipe.ship_user_code``)."""
    module = obj.__module__
    if module == "__main__":
        main = sys.modules["__main__"]
        main_file = getattr(main, "__file__", None)
        if not main_file:
            raise ValueError(
                f"{what} {obj.__qualname__} is defined in an interactive session; define it in a "
                "module file (e.g. my_models.py) and import it from there"
            )
        spec = getattr(main, "__spec__", None)  # python -m package.module: its real name
        module = spec.name if spec is not None else os.path.splitext(os.path.basename(main_file))[0]
    if "<locals>" in obj.__qualname__:
        raise ValueError(f"{what} {obj.__qualname__} is defined inside a function; define it at module level")
    return f"{module}:{obj.__qualname__}"
