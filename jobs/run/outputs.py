"""The results folder of a run: checked before any process starts, never someone else's files overwritten.

A new run needs an empty (or new) folder, or the folder of an earlier run, whose result files
(``common.result_files``) it replaces; any
other non-empty folder is refused, so ``--output ~`` cannot clear a home directory. The folder must be creatable
and writable. NVFlare's own workspace (its logs, the job's apps) goes inside, in ``nvflare/attempt-N``: every run,
and every resume of it, gets its own, so two runs never share one.
"""

from __future__ import annotations

import glob
import os
import shutil

from common.choices import ConfigError
from common.jsonio import WRITING
from common.result_files import DATASET, HEARTBEAT, METRICS, NVFLARE, STOP_REQUEST, run_files
from jobs.methods import BUILT_IN

INPUT_FILES = (DATASET,)  # the Python API's copy of a user's arrays (jobs.api): an input, kept


def files_to_clear(method_files: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What a new run clears from the folder of an earlier one: every run's result files, this run's method's own
    and the built-in methods' (an earlier run may have used another method), and a heartbeat and half-written files
    a killed run left."""
    return (
        *run_files((*method_files, *(f for m in BUILT_IN.values() for f in m.result_files))),
        HEARTBEAT,
        STOP_REQUEST,
        WRITING + "*",
    )


def prepare_output_dir(path: str, resume: bool = False, method_files: tuple[str, ...] = ()) -> str:
    """Create (or, for a new run, clear the results of an earlier run in) ``path``; ``ConfigError`` naming the fix
    when it cannot be used. ``method_files``: the run's method's own result files (``Method.result_files``)."""
    path = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as ex:
        raise ConfigError(
            f"--output {path} cannot be created ({ex.strerror}: {ex.filename}); choose another folder"
        ) from ex
    if not resume:
        entries = [e for e in os.listdir(path) if e not in INPUT_FILES]
        if entries and METRICS not in entries:
            raise ConfigError(f"--output {path} is not empty and holds no earlier run: choose an empty or new folder")
        for pattern in files_to_clear(method_files):
            for entry in glob.glob(os.path.join(path, pattern)):
                shutil.rmtree(entry) if os.path.isdir(entry) else os.remove(entry)
    probe = os.path.join(path, ".edgesim-write-test")
    try:
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as ex:
        raise ConfigError(f"--output {path} is not writable ({ex.strerror}); choose another folder") from ex
    return path


def nvflare_workspace(results_dir: str) -> str:
    """A fresh folder for NVFlare's workspace of this attempt: ``<results>/nvflare/attempt-<n>``."""
    root = os.path.join(results_dir, NVFLARE)
    os.makedirs(root, exist_ok=True)
    n = 1 + sum(1 for e in os.listdir(root) if e.startswith("attempt-"))
    path = os.path.join(root, f"attempt-{n}")
    os.makedirs(path)
    return path
