"""A pack's folder and ``--resume`` of it: the manifest of its runs (``pack.json``), and every run continued.

A pack of seeds (``OUTPUT/seed-N``) or of runs of different flags (``OUTPUT/NAME``) writes, as it starts, the
manifest of its runs into ``OUTPUT``: which kind of pack it is and each run's label and folder. A job script's
``--resume OUTPUT`` (or ``jobs.api.run(..., resume=OUTPUT)``) then continues every run from its own checkpoint, as
``--resume`` continues one run (its saved config, only harmless flags may change: ``jobs.resume``), and runs them
as one job again (``jobs.run.pack.run_pack``). A run that ended continues to its end at once; a run that wrote no
checkpoint (one that was still waiting for a place, or was killed before its first checkpoint) starts anew from its
saved config, in its folder, as the killed run would have gone (``jobs.resume``'s ``restart``; the pack's builders
ask for it). Runs whose folders do not share one parent (a run of ``--runs`` given
its own ``output`` elsewhere), or share one that holds more than the pack (a sweep's trials folder), make no
manifest: each resumes alone.

A resumed pack's events equal the uninterrupted pack's line for line; its accuracies equal them to summation order
only, as a pack's equal its standalone runs' (``docs/packs.md``): each run restarts at its own checkpoint's release,
so the runs' releases that trained together in one cross-run group before may train apart after.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass

from common.choices import ConfigError
from common.jsonio import write_json_atomic
from common.result_files import DATASET, METRICS, PACK_MANIFEST
from jobs.config import JobConfig

KIND_SEEDS, KIND_RUNS = "seeds", "runs"
"""A pack's kinds: a job's seeds (``jobs.seeds``) or runs of different flags (``jobs.pack_runs``)."""


@dataclass(frozen=True)
class PackManifest:
    """Attributes:
    kind: ``seeds`` or ``runs``.
    runs: each run's label (its seed, or its name) -> its results folder, relative to the pack's folder.
    at_once: runs going at a time, the others joining as runs end (0: all; ``check_at_once``).
    """

    kind: str
    runs: dict[str, str]
    at_once: int = 0


def check_at_once(at_once, runs: int) -> None:
    """``ConfigError`` naming the fix unless ``at_once`` is a count of runs going at a time in a pack of ``runs``:
    a whole number from 1 (0: all of them)."""
    if isinstance(at_once, bool) or not isinstance(at_once, int) or at_once < 0:
        raise ConfigError(f"--runs-at-once {at_once!r}: give a whole number of runs from 1 (at most {runs} go at once)")


def write_manifest(kind: str, labels: list[str], results_dirs: list[str], at_once: int = 0) -> None:
    """Write the manifest of a pack's runs into their common parent folder, the pack's folder, when it holds the
    runs alone (their folders, the manifest, a user's dataset): nothing when they have no common parent, or when it
    holds more (a sweep's trials folder, where each pack's runs sit beside other trials)."""
    folders = [os.path.abspath(d) for d in results_dirs]
    parent = os.path.dirname(folders[0])
    if any(os.path.dirname(f) != parent for f in folders):
        return
    if set(os.listdir(parent)) - {os.path.basename(f) for f in folders} - {PACK_MANIFEST, DATASET}:
        return
    manifest = {"kind": kind, "runs": {label: os.path.basename(f) for label, f in zip(labels, folders, strict=True)}}
    if at_once:
        manifest["at_once"] = at_once
    write_json_atomic(os.path.join(parent, PACK_MANIFEST), manifest)


def read_manifest(folder: str) -> PackManifest | None:
    """The manifest of the pack whose folder is ``folder``; None when ``folder`` is not a pack's (a run's own
    results folder, or none). ``ConfigError`` for a manifest that cannot be read."""
    path = os.path.join(os.path.expanduser(folder), PACK_MANIFEST)
    if os.path.exists(os.path.join(os.path.expanduser(folder), METRICS)) or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            saved = json.load(f)
        runs = {str(k): str(v) for k, v in saved["runs"].items()}
        manifest = PackManifest(str(saved["kind"]), runs, int(saved.get("at_once", 0)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as ex:
        raise ConfigError(
            f"--resume {folder}: its {PACK_MANIFEST} cannot be read ({ex}); resume each run alone"
        ) from None
    if manifest.kind not in (KIND_SEEDS, KIND_RUNS) or len(manifest.runs) < 2:
        raise ConfigError(f"--resume {folder}: its {PACK_MANIFEST} names no pack; resume each run alone")
    return manifest


def resumed_configs(folder: str, manifest: PackManifest, build: Callable[[str], JobConfig]) -> list[JobConfig]:
    """Each run of the pack resumed: ``build`` gives a run's resumed config from its results folder (a job
    script's build with ``resume`` and ``output`` that folder); a refusal names the run."""
    cfgs = []
    for label, name in manifest.runs.items():
        run_folder = os.path.join(os.path.abspath(os.path.expanduser(folder)), name)
        try:
            cfgs.append(build(run_folder))
        except ConfigError as ex:
            what = f"seed {label}" if manifest.kind == KIND_SEEDS else f"run {label}"
            raise ConfigError(f"--resume {folder}: {what}: {ex}") from None
    return cfgs
