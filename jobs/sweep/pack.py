"""Runs of a sweep sharing ONE job (a pack, ``docs/packs.md``): a candidate's repeated seeds (the job script's
``--seeds 0,1,2``, each seed's results in ``OUTPUT/seed-N``, which become the candidate's runs' folders), or, with
``--pack N`` and no ``repeat``, up to N trials (the job script's ``--runs FILE``, each trial's results in its own
folder).

Why here: the sweep keeps one ``Run`` per seed or trial (its records, pruning, its attributes, board and trackers
stay per run); only the process is shared. ``PackMember`` is one run's view of that process, so the runner's loop
treats it as a trial of its own; a pruned trial of a pack ends alone (a stop request in its folder) while its
pack-mates go on. ``pack_refusal`` and ``trials_refusal`` check, once per sweep, that the runs can share a job the
way the job script checks ``--seeds`` and ``--runs`` (the configs built, ``jobs.pack_check``); a refusal makes the
sweep run them as separate jobs, as before packs (``--pack 1``).
"""

from __future__ import annotations

import itertools
import os
import signal
import time

from common.choices import ConfigError
from common.config_flags import flag_args
from common.jsonio import write_json_atomic
from common.result_files import STOP_REQUEST
from jobs.sweep.spec import SweepSpec
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
    from jobs.cli import build_parser, raising_parse, seeds_from_args

    parser = build_parser("", method_choice=True, seeds=True)
    argv = [*flag_args(flags), "--seeds", ",".join(map(str, seeds)), "--output", output]
    try:  # one line, raised here rather than printed with a usage block
        args = raising_parse(parser)(argv)
        seeds_from_args(parser, argv, args, args.method, presets=True)
    except ConfigError as ex:
        return str(ex)
    return None


def probe_params(spec: SweepSpec) -> list[dict]:
    """Every cell of the spec with each searched flag at its probes (as ``jobs.sweep.spec.check_flags`` checks
    them): the trials' values a pack check builds."""
    probes = [[(p.name, v) for v in p.probes()] for p in spec.search]
    return [cell | dict(combo) for cell in spec.cells() for combo in itertools.product(*probes)]


def pack_refusal(spec: SweepSpec, extra: dict, output: str) -> str | None:
    """Why a candidate's seeds cannot share one job, for any of ``probe_params``; ``extra``: the flags every trial
    gets besides (a deployment's). None when every candidate's can."""
    seeds = [rep["seed"] for rep in spec.repeats()]
    for params in probe_params(spec):
        if refusal := seeds_refusal(spec.trial_flags(params) | extra, seeds, output):
            shown = ", ".join(f"{k}={v}" for k, v in params.items())
            return f"{refusal} (with {shown})" if shown else refusal
    return None


def packs_trials(spec: SweepSpec, pack: int | None) -> bool:
    """Whether trials may share jobs: the spec repeats nothing (a candidate is one run) and ``--pack`` is 2 or more."""
    return not spec.repeat and pack is not None and pack >= 2


def trials_refusal(spec: SweepSpec, extra: dict, output: str) -> str | None:
    """Why trials cannot share one job, for ``probe_params`` all in one pack (the job script's ``--runs`` check,
    ``jobs.pack_runs``, built as ``jobs.cli.job_main`` builds them: no file is written); ``extra``: the flags every
    trial gets besides. None when they can."""
    from jobs.cli import build_parser, method_and_options, raising_parse
    from jobs.pack_runs import run_configs

    runs = {str(i): spec.trial_flags(params) | extra for i, params in enumerate(probe_params(spec))}
    if len(runs) < 2:
        return None  # one set of flags: nothing differs between the trials' configs but their seeds' draws
    parse = raising_parse(build_parser("", method_choice=True, seeds=True))
    try:
        run_configs(parse, method_and_options, ["--output", output], runs, "the sweep's trials", presets=True)
    except ConfigError as ex:
        return str(ex)
    return None


def write_runs_file(pack: str, runs: dict[str, dict]) -> str:
    """A pack's ``--runs`` file (``jobs.pack_runs``), ``PACK.json`` beside the pack's folder; its path."""
    path = f"{pack}.json"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomic(path, runs)
    return path


class PackProcess:
    """A pack's one process, shared by its runs' ``PackMember``: its exit code kept once known, stopped once, and the
    results folders of the runs still in it (``live``)."""

    def __init__(self, proc):
        self.proc, self.code = proc, None
        self.live: set[str] = set()

    def poll(self) -> int | None:
        if self.code is None:
            self.code = self.proc.poll()
        return self.code

    def stop(self) -> int | None:
        if self.code is None:
            self.code = self.proc.stop()
        return self.code


class PackMember:
    """One run in a pack's process: its own folder's records and exit code (as its job alone would give it,
    ``jobs.seeds.seed_exit_code``); the process, its start and wall time shared with the pack's other runs. Stopping
    the last run still in the pack stops the process; stopping another asks the pack's server to end that run alone
    (``STOP_REQUEST`` in its folder: ``scheduling.pack_assessor``), and the others go on. A run whose outcome and
    last version are recorded has ended while the pack goes on (``final``): the sweep tells the study then, so a
    pack's early trials count for the pruner and the sampler before the pack's last run ends."""

    def __init__(self, pack: PackProcess, folder: str):
        self.pack, self.folder = pack, folder
        pack.live.add(folder)

    def poll(self) -> int | None:
        code = self.pack.poll()
        if code is None and self.final():
            self.leave()
            return self._own(0)
        return self._own(code)

    def final(self) -> bool:
        """Whether its run's records are final while the pack runs on: its outcome is recorded and so is its last
        version's score (the evaluator always scores a run's last version, after every version it owes before)."""
        metrics = read_metrics(self.folder)
        last = (metrics.get("outcome") or {}).get("version") or 0
        return last >= 1 and any(r.get("version") == last for r in metrics.get("versions", ()))

    def leave(self) -> None:
        """It is about to be stopped together with others (``stop_together``)."""
        self.pack.live.discard(self.folder)

    def stop(self, reason: str = "", wait_seconds: float = 30.0) -> int | None:
        """Stop its run: the whole process when no other run is left in it, else its run alone, waiting (up to
        ``wait_seconds``) for the server to record the run's outcome; then the exit code its job alone would have
        given, stopped by a signal (143)."""
        self.leave()
        if not self.pack.live or self.pack.poll() is not None:
            return self._own(self.pack.stop())
        write_json_atomic(os.path.join(self.folder, STOP_REQUEST), {"reason": reason or "stopped by the sweep"})
        deadline = time.time() + wait_seconds
        while time.time() < deadline and self.pack.poll() is None and not self._decided():
            time.sleep(0.2)
        return self._own(self.pack.poll()) if self.pack.code is not None else 128 + signal.SIGTERM

    def _decided(self) -> bool:
        return bool(read_metrics(self.folder).get("outcome"))

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


def stop_together(procs: list, reason: str = "") -> list[int | None]:
    """Stop several runs' processes at once (a pruned candidate's runs, or every running run on Ctrl-C): a pack
    whose every run is among them is stopped whole, once, instead of run by run. Their exit codes, in order."""
    for proc in procs:
        if isinstance(proc, PackMember):
            proc.leave()
    return [proc.stop(reason) if isinstance(proc, PackMember) else proc.stop() for proc in procs]
