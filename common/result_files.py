"""Every file a run writes into its results folder, named once.

The writers (the server's run recorder, events writer, model saver, plots, TensorBoard writer, leaf-log writer,
checkpoints), the readers (the end-of-run report, the watchdog, ``--resume``, the benchmarks), the folder check of
a new run (``jobs.run.outputs``: it clears these before a run), the downloader of a deployment's results
(``jobs.run.remote``) and the README's list all use these names. A method's own files (FedRevive's
``fedrevive_log.jsonl``) are not here: the method declares them (``jobs.methods.Method.result_files``), and
``run_files`` adds them to the common ones.

``TENSORBOARD``, ``CHECKPOINT`` and ``NVFLARE`` are folders; ``LEAF_LOGS`` is a glob pattern (one file per leaf).
"""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Iterable

METRICS = "metrics.json"  # evaluation.run_recorder, its only writer
EVENTS = "events.jsonl"  # scheduling.exact_assessor (and --dry-run: scheduling.timeline)
GLOBAL_MODEL = "global_model.pt"  # evaluation.model_saver
ACCURACY_PLOT = "accuracy.png"  # evaluation.plots, drawn by the recorder (or the driver after an interrupt)
TENSORBOARD = "tensorboard"  # a folder: evaluation.tensorboard_writer
LEAF_LOG = "leaf_{leaf}.jsonl"  # one per leaf: evaluation.leaf_log_writer (the drop-in's leaves: on the leaf)
LEAF_LOGS = LEAF_LOG.format(leaf="*")
CHECKPOINT = "checkpoint"  # a folder: scheduling.checkpoint
# in CHECKPOINT: the lowest selection id a resume from the checkpoint trains again (scheduling.checkpoint writes it
# after the checkpoint itself; processors.device_state reads it to know which device states a resume can need)
SELECTION_FLOOR = "selection_floor.json"
# in CHECKPOINT: the tracker runs (MLflow, W&B) the driver logs the run to and the last version each holds
# (jobs.tracking.run_tracking), so --resume continues them
TRACKING_STATE = "tracking.json"
DEVICE_STATE = "device_state"  # a folder: per-device state of a method's training rule (processors.device_state)
ERROR_FEEDBACK = "error_feedback"  # a folder: each device's error-feedback residual (processors.compress)
NVFLARE = "nvflare"  # a folder: NVFlare's workspace of each attempt (jobs.run.outputs), a deployment's server logs
# the server's sign of life while it works after the outcome (common.heartbeat); read by the driver's watchdog and
# removed by the driver once the job has ended, so it is no result of the run
HEARTBEAT = "working.json"
# a request to end one run of a pack early, with its reason (jobs.sweep.pack writes it when the sweep prunes a trial
# whose pack goes on; scheduling.pack_assessor reads it and ends that run ``pruned``); an input, cleared by a new run
STOP_REQUEST = "stop_request.json"

# in a pack's folder (the folder of its runs' folders), not a run's: the runs in it, written as the pack starts
# (jobs.pack_folder), so that --resume of the pack's folder continues every run of it as one job again
PACK_MANIFEST = "pack.json"

# --dry-run writes the trace and its figures only
TIMELINE = "timeline.json"  # scheduling.timeline
DRY_RUN_FILES = (EVENTS, TIMELINE)

# the drop-in's leaves (simulation.leaf_runner with a leaf log folder) also write their worker plan there
LEAF_PLAN = "leaf_{leaf}_plan.json"

# an input, not a result: the Python API's copy of a user's arrays (jobs.api), kept when a run's results are cleared
DATASET = "dataset.npz"

# what every run writes, in the order the README lists them and the end-of-run report names them
RUN_FILES = (METRICS, EVENTS, GLOBAL_MODEL, ACCURACY_PLOT, TENSORBOARD, LEAF_LOGS, CHECKPOINT, NVFLARE)


def leaf_log(leaf: str) -> str:
    """The name of one leaf's report log."""
    return LEAF_LOG.format(leaf=leaf)


def run_files(method_files: Iterable[str] = ()) -> tuple[str, ...]:
    """Every file (name or glob pattern) a run writes: the common ones, then its method's own."""
    return RUN_FILES + tuple(f for f in method_files if f not in RUN_FILES)


def is_pattern(name: str) -> bool:
    """Whether ``name`` is a glob pattern (``leaf_*.jsonl``) rather than one file's name."""
    return any(c in name for c in "*?[")


def matches(name: str, files: Iterable[str]) -> bool:
    """Whether ``name`` (an entry of a results folder) is one of ``files`` (names or glob patterns)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in files)


def present(results_dir: str, files: Iterable[str]) -> list[str]:
    """The entries of ``files`` that exist in ``results_dir``, in their order: a folder with ``/``, a pattern
    with the number of files it matches (``leaf_*.jsonl (4)``)."""
    found = []
    for pattern in files:
        hits = glob.glob(os.path.join(glob.escape(results_dir), pattern))
        if not hits:
            continue
        if is_pattern(pattern):
            found.append(f"{pattern} ({len(hits)})")
        else:
            found.append(pattern + ("/" if os.path.isdir(hits[0]) else ""))
    return found
