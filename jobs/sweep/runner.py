"""Runs a sweep: its folder, its study, its trials packed onto the machine, pruned on simulated time, and the bar.

The loop runs in the main thread (each trial's death signal is tied to the thread that started it): it fills the
free slots with the study's waiting trials (``study.ask``), reports each running trial's curve as its
``metrics.json`` grows (``jobs.sweep.objective.final_steps``), stops the ones the pruner gives up on and tells the
study how each ended. Ctrl-C or SIGTERM stops every running trial, marks it failed and queues it again, so the
same command continues the study.
"""

from __future__ import annotations

import fcntl
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna
from optuna.trial import TrialState

from evaluation.run_recorder import record_pruned
from jobs.sweep import study as studies
from jobs.sweep.objective import final_steps, score
from jobs.sweep.spec import SpecError, SweepSpec, check_flags, format_value
from jobs.sweep.trial import TrialProcess, command, read_metrics


@dataclass
class SweepOptions:
    """Attributes:
    output: the sweep's folder (default ``WORKSPACE/sweeps/<spec name>``).
    storage: a SQLAlchemy URL for the study (default: SQLite in the sweep's folder).
    parallel: trials at once (default: planned from the cores and each trial's leaves).
    pruner: ``hyperband`` (default), ``median`` or ``none``; wrapped in a ``PatientPruner``.
    min_resource: simulated seconds a trial runs before it may be pruned.
    patience: pruning steps without improvement a trial is given before it is pruned.
    seed: seeds the sampler (TPE), so the same study proposes the same values.
    poll_seconds: how often running trials' ``metrics.json`` are read.
    """

    output: str | None = None
    storage: str | None = None
    parallel: int | None = None
    pruner: str = "hyperband"
    min_resource: float = 0.0
    patience: int = 0
    seed: int = 0
    poll_seconds: float = 0.5
    bar: bool = True
    python: str = sys.executable


def sweep_dir(spec: SweepSpec, output: str | None) -> str:
    return os.path.abspath(os.path.expanduser(output or os.path.join(spec.workspace(), "sweeps", spec.name)))


def plan_parallel(spec: SweepSpec, requested: int | None) -> tuple[int, int, str]:
    """Trials at once, cores each, and why. Each leaf of a trial plans at least one core of its own
    (``simulation.planner.plan_workers``), so a trial keeps ``num-leaf-nodes`` cores busy."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    leaves = int(spec.base.get("num-leaf-nodes", 2))
    if requested:
        share = max(1, cores // requested)
        why = f"--parallel {requested}: {share} core(s) each of {cores}"
        if requested * share > cores:
            why += f" (more trials than cores: they share them, {requested} x {share} > {cores})"
        return requested, share, why
    n = max(1, cores // max(leaves, 1))
    share = max(1, cores // n)
    why = f"{cores} core(s), {leaves} leaves a trial, each leaf planning at least one core: {n} at once, {share} core(s) each"
    return n, share, why


def claim_folder(folder: str, spec: SweepSpec):
    """The sweep's folder, locked for this sweep (two sweeps never share one) and holding its spec."""
    os.makedirs(folder, exist_ok=True)
    lock = open(os.path.join(folder, ".lock"), "w")  # noqa: SIM115 (held for the sweep's life)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as ex:
        raise SpecError(f"{folder} is in use by another sweep; wait for it, or give --output NEW_FOLDER") from ex
    saved = os.path.join(folder, "spec.yaml")
    if os.path.exists(saved):
        with open(saved) as f:
            if f.read() != spec.text:
                raise SpecError(f"{folder} holds another sweep (its spec.yaml differs); give --output NEW_FOLDER")
    else:
        with open(saved, "w") as f:
            f.write(spec.text)
    return lock


def suggest(trial: optuna.Trial, spec: SweepSpec) -> dict:
    """The trial's flag values: its grid cell (enqueued with it) and its searched values."""
    params = {k: trial.suggest_categorical(k, values) for k, values in spec.grid.items()}
    for p in spec.search:
        if p.type == "choice":
            params[p.name] = trial.suggest_categorical(p.name, list(p.values))
        elif p.type == "int":
            params[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high))
        else:
            params[p.name] = trial.suggest_float(p.name, p.low, p.high, log=p.type == "log-float")
    return params


Launcher = Callable[[dict, str, "list[int] | None"], TrialProcess]


@dataclass
class Running:
    trial: optuna.Trial
    proc: TrialProcess
    slot: int
    reported: int = -1
    pruned_at: float | None = None
    records: list = field(default_factory=list)


class Sweep:
    """One sweep's run: ``prepare`` (every check, exit 2 on a refusal), then ``run``."""

    def __init__(self, spec: SweepSpec, opts: SweepOptions, launch: Launcher | None = None):
        self.spec, self.opts = spec, opts
        # how a trial's process starts: a ``TrialProcess``; the tests give a fake one
        self.launch = launch or (lambda flags, folder, cores: TrialProcess(flags, folder, cores, opts.python))
        self.folder = sweep_dir(spec, opts.output)
        self.running: dict[int, Running] = {}
        self.signum: int | None = None

    def prepare(self) -> None:
        check_flags(self.spec)
        if self.opts.pruner not in studies.PRUNERS:
            raise SpecError(f"--pruner {self.opts.pruner}: use one of {', '.join(studies.PRUNERS)}")
        if self.opts.min_resource < 0 or self.opts.patience < 0:
            raise SpecError("--min-resource and --patience: 0 or more")
        self.n, self.share, self.why = plan_parallel(self.spec, self.opts.parallel)
        self.lock = claim_folder(self.folder, self.spec)
        self.storage = studies.open_storage(studies.storage_url(self.folder, self.opts.storage))
        min_steps, max_steps = studies.pruning_steps(self.spec, self.opts.min_resource)
        pruner = studies.make_pruner(self.opts.pruner, min_steps, self.opts.patience, max_steps)
        self.study = studies.open_study(self.spec, self.storage, pruner, self.opts.seed)

    def _cores(self, slot: int) -> list[int] | None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if not cores:
            return None
        first = (slot * self.share) % len(cores)
        return [cores[(first + i) % len(cores)] for i in range(self.share)]

    def _start(self, slot: int) -> None:
        trial = self.study.ask()
        params = suggest(trial, self.spec)
        flags = self.spec.trial_flags(params)
        folder = os.path.join(self.folder, "trials", f"{trial.number:04d}")
        for key, value in studies.owner_attrs().items():
            trial.set_user_attr(key, value)
        trial.set_user_attr("folder", os.path.relpath(folder, self.folder))
        trial.set_user_attr("command", " ".join(command(flags)))
        proc = self.launch(flags, folder, self._cores(slot))
        self.running[slot] = Running(trial, proc, slot)

    def _report(self, run: Running) -> None:
        if read_metrics(run.proc.folder).get("outcome"):
            return  # the job has decided its end (only its shut-down is left): its score is final, pruning saves nothing
        run.records = run.proc.records()
        for step, value in final_steps(self.spec.objective, run.records, run.reported):
            run.trial.report(value, step)
            run.reported = step
            if run.trial.should_prune():
                run.pruned_at = step * self.spec.objective.step
                return

    def _finish(self, run: Running, code: int) -> None:
        records = run.proc.records()
        last = records[-1] if records else {}
        for key, value in {
            "versions": last.get("version"),
            "sim_seconds": last.get("sim_seconds"),
            "wall_seconds": round(run.proc.wall_seconds, 1),
            "exit_code": code,
            # process start and exit (epoch seconds): with the records' epochs, a trial's fixed cost
            "started": round(run.proc.started, 3),
            "ended": round(run.proc.started + run.proc.wall_seconds, 3),
        }.items():
            run.trial.set_user_attr(key, value)
        shown = ", ".join(f"{k}={format_value(v)}" for k, v in run.trial.params.items())
        if run.pruned_at is not None:
            reason = f"pruned by the sweep at {run.pruned_at:g} simulated seconds (its curve fell behind)"
            record_pruned(run.proc.folder, reason)
            self.study.tell(run.trial, state=TrialState.PRUNED)
            say(f"[sweep] trial {run.trial.number} pruned at {run.pruned_at:g} simulated s ({shown})")
            return
        value = score(self.spec.objective, records)
        if code == 0 and value is not None:
            self.study.tell(run.trial, value)
            say(f"[sweep] trial {run.trial.number} complete: {format_value(value)} ({shown})")
        else:
            self.study.tell(run.trial, state=TrialState.FAIL)
            log = os.path.relpath(run.proc.folder, self.folder) + ".log"
            say(f"[sweep] trial {run.trial.number} failed (exit {code}; its log: {log}) ({shown})")

    def _waiting(self) -> int:
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def _on_signal(self, signum, _frame) -> None:
        self.signum = signum

    def _stop_all(self) -> None:
        """Ctrl-C / SIGTERM: stop every running trial, mark it failed and queue it again."""
        for run in list(self.running.values()):
            run.proc.stop()
            self.study.tell(run.trial, state=TrialState.FAIL, skip_if_finished=True)
            attrs = {"slot": run.trial.user_attrs.get("slot"), "requeued_from": run.trial.number}
            self.study.enqueue_trial(run.trial.params, user_attrs=attrs)
        self.running.clear()

    def _bar_text(self) -> str:
        c = studies.counts(self.study)
        best = studies.best_trial(self.study)
        shown = format_value(best.value) if best else "-"
        return (
            f"done {c['complete']}, pruned {c['pruned']}, failed {c['fail']}, running {len(self.running)}, best {shown}"
        )

    def run(self) -> int:
        requeued = studies.requeue_orphans(self.study)
        planned = studies.plan_trials(self.study, self.spec)
        print(f"[sweep] {self.spec.study_name}: {self.spec.trials} trial(s); folder {self.folder}")
        print(f"[sweep] {self.n} trial(s) at once: {self.why}")
        if requeued:
            print(
                f"[sweep] continuing: trial(s) {', '.join(map(str, requeued))} were running, marked failed, queued again"
            )
        elif not planned:
            print("[sweep] continuing the study found in its storage")
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        bar = make_bar(self.spec.trials, self.opts.bar)
        try:
            while self.signum is None:
                for slot in range(self.n):
                    if slot not in self.running and self._waiting():
                        self._start(slot)
                for slot, run in list(self.running.items()):
                    code = run.proc.poll()
                    if code is None:
                        self._report(run)
                        if run.pruned_at is not None:
                            code = run.proc.stop()
                    if code is not None:
                        self._finish(run, code)
                        del self.running[slot]
                c = studies.counts(self.study)
                bar.n = c["complete"] + c["pruned"]
                bar.set_postfix_str(self._bar_text(), refresh=True)
                if not self.running and not self._waiting():
                    break
                time.sleep(self.opts.poll_seconds)
        finally:
            if self.running:
                self._stop_all()
            bar.close()
            for s, handler in previous.items():
                signal.signal(s, handler)
        if self.signum is not None:
            print(
                f"[sweep] stopped ({signal.Signals(self.signum).name}); run the same command to continue",
                file=sys.stderr,
            )
            return 128 + self.signum
        return 0


def say(line: str) -> None:
    """A line above the bar (tqdm keeps the bar below it), or a plain line without one."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)


def make_bar(total: int, enabled: bool):
    """The bar over the trials, on a terminal only: in a log, its redraws would be noise (each trial's end is a
    line of its own anyway)."""
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: trials are forked from this process (see jobs.sweep.trial)
    return tqdm(
        total=total,
        desc="[sweep] trials",
        unit="trial",
        disable=not enabled or not sys.stderr.isatty(),
        file=sys.stderr,
        dynamic_ncols=True,
    )


def best_command(study: optuna.Study) -> str | None:
    best = studies.best_trial(study)
    return best.user_attrs.get("command") if best else None


def objective_words(spec: SweepSpec) -> str:
    o = spec.objective
    if o.metric == "accuracy_at":
        return f"accuracy at {o.budget:g} simulated s"
    if o.metric == "time_to_target":
        return f"simulated s to accuracy {o.target:g}"
    return "final accuracy"


def is_finite(value) -> bool:
    return value is not None and not (isinstance(value, float) and (math.isnan(value) or math.isinf(value)))
