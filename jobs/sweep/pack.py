"""A candidate's repeated seeds as ONE job (a pack, ``docs/packs.md``): the job script's ``--seeds 0,1,2``, each
seed's results in ``OUTPUT/seed-N``, which become the candidate's runs' folders.

Why here: the sweep keeps one ``Run`` per seed (its records, pruning on the mean, its attributes, board and trackers
stay per run); only the process is shared. ``PackMember`` is one seed's view of that process, so the runner's loop
treats it as a trial of its own. ``pack_refusal`` checks, once per sweep, that the seeds can share a job the way
``jobs.seeds`` checks a job script's ``--seeds`` (the configs built, ``jobs.pack_check``); a refusal makes the
sweep run them as separate jobs, as before packs (``--pack 1``).
"""

from __future__ import annotations

import itertools

from common.choices import ConfigError
from jobs.sweep.spec import SweepSpec, flag_args
from jobs.sweep.trial import read_metrics


def packs_seeds(spec: SweepSpec, pack: int | None) -> bool:
    """Whether a candidate's runs may share jobs: its repeats differ only in ``seed``, there are at least 2, and
    ``--pack`` is not 1."""
    return list(spec.repeat) == ["seed"] and len(spec.repeats()) >= 2 and pack != 1


def pack_sizes(runs: int, pack: int | None) -> list[int]:
    """How a candidate's ``runs`` seeds split into jobs: all in one (``pack`` None), else ``pack`` a job, the last
    one the rest (a job of one seed runs as its own trial)."""
    size = runs if pack is None else max(1, pack)
    return [min(size, runs - i) for i in range(0, runs, size)]


def seeds_refusal(flags: dict, seeds: list[int], output: str) -> str | None:
    """Why the job script's ``--seeds`` would refuse these seeds of one run's ``flags`` (without ``seed``), in one
    line; None when they can share one job. Built as ``jobs.cli.job_main`` builds them: no file is written."""
    from jobs.cli import build_parser, seeds_from_args

    parser = build_parser("", method_choice=True, seeds=True)
    argv = [*flag_args(flags), "--seeds", ",".join(map(str, seeds)), "--output", output]

    def refuse(message: str):
        raise ConfigError(message)

    parser.error = refuse  # one line, raised here rather than printed with a usage block
    try:
        args = parser.parse_args(argv)
        seeds_from_args(parser, argv, args, args.method, presets=True)
    except ConfigError as ex:
        return str(ex)
    return None


def pack_refusal(spec: SweepSpec, extra: dict, output: str) -> str | None:
    """Why a candidate's seeds cannot share one job, for any cell of the spec (each searched flag at its probes, as
    ``jobs.sweep.spec.check_flags`` checks them); ``extra``: the flags every trial gets besides (a deployment's).
    None when every candidate's can."""
    seeds = [rep["seed"] for rep in spec.repeats()]
    probes = [[(p.name, v) for v in p.probes()] for p in spec.search]
    for cell in spec.cells():
        for combo in itertools.product(*probes):
            params = cell | dict(combo)
            if refusal := seeds_refusal(spec.trial_flags(params) | extra, seeds, output):
                shown = ", ".join(f"{k}={v}" for k, v in params.items())
                return f"{refusal} (with {shown})" if shown else refusal
    return None


class PackProcess:
    """A pack's one process, shared by its seeds' ``PackMember``: its exit code kept once known, stopped once."""

    def __init__(self, proc):
        self.proc, self.code = proc, None

    def poll(self) -> int | None:
        if self.code is None:
            self.code = self.proc.poll()
        return self.code

    def stop(self) -> int | None:
        if self.code is None:
            self.code = self.proc.stop()
        return self.code


class PackMember:
    """One seed's run in a pack's process: its own folder's records and exit code (as its job alone would give it,
    ``jobs.seeds.seed_exit_code``); the process, its start and wall time shared with the pack's other seeds.
    Stopping it stops the pack (once)."""

    def __init__(self, pack: PackProcess, folder: str):
        self.pack, self.folder = pack, folder

    def poll(self) -> int | None:
        return self._own(self.pack.poll())

    def stop(self) -> int | None:
        return self._own(self.pack.stop())

    def _own(self, code: int | None) -> int | None:
        if code not in (0, 1):  # running (None), stopped or refused: the pack's
            return code
        return 0 if (read_metrics(self.folder).get("outcome") or {}).get("status") == "completed" else 1

    def records(self) -> list[dict]:
        return read_metrics(self.folder).get("versions", [])

    @property
    def started(self) -> float:
        return self.pack.proc.started

    @property
    def wall_seconds(self) -> float:
        return self.pack.proc.wall_seconds
