"""Runs a sweep: its folder, its study, its trials packed onto the machine, pruned on simulated time, and the bar.

The loop runs in the main thread (each trial's death signal is tied to the thread that started it): it fills the
free slots with the study's waiting trials (``study.ask``), reports each running trial's curve as its
``metrics.json`` grows (``jobs.sweep.objective.final_steps``), stops the ones the pruner gives up on and tells the
study how each ended. Ctrl-C or SIGTERM stops every running trial, marks it failed and queues it again, so the
same command continues the study.

Over 400 lines: one loop and the state it owns (slots, trials, the study); its helpers only serve that loop.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna
from optuna.trial import TrialState

from common.cores import available_cores
from evaluation.run_recorder import record_pruned
from jobs.seeds import seed_folder
from jobs.sweep import study as studies
from jobs.sweep.objective import ended_early, mean_score, mean_steps, score
from jobs.sweep.pack import (
    PackMember,
    PackProcess,
    pack_refusal,
    pack_sizes,
    packs_seeds,
    packs_trials,
    stop_together,
    trials_refusal,
    write_runs_file,
)
from jobs.sweep.report import make_bar, say
from jobs.sweep.spec import SpecError, SweepSpec, check_flags, format_value
from jobs.sweep.tracking import SweepTracking
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
    tensorboard: a log dir ("": the sweep's ``tensorboard/``) for each trial's curves and hyperparameters
        (TensorBoard's HParams tab); None: none.
    deployment: a ``jobs.deploy`` folder (or an admin's startup kit): each trial runs as a job there
        (``jobs.sweep.deployment``) instead of in a SimEnv of its own.
    pack: runs sharing one job (``jobs.sweep.pack``). With ``repeat: {seed: [..]}``, a candidate's seeds: None,
        all of them; N >= 2, at most N a job; 1, each its own job. Without ``repeat``, trials: N >= 2, up to N
        trials a job (the study's next ones, each pruned alone while the others go on); None or 1, each its own.
    pack_queue: with ``pack`` N for trials, how many more of the study's next trials each job holds, waiting: when
        one of its trials ends or is pruned the next joins the running job (the job script's ``--runs-at-once``);
        None: N; 0: none. They are asked from the study when the job starts, so sampled without its results.
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
    tensorboard: str | None = None
    deployment: str | None = None
    pack: int | None = None
    pack_queue: int | None = None


def sweep_dir(spec: SweepSpec, output: str | None) -> str:
    return os.path.abspath(os.path.expanduser(output or os.path.join(spec.workspace(), "sweeps", spec.name)))


def plan_parallel(spec: SweepSpec, requested: int | None) -> tuple[int, int, str]:
    """Trials at once, cores each, and why. Each leaf of a trial plans at least one core of its own
    (``simulation.planner.plan_workers``), so a trial keeps ``num-leaf-nodes`` cores busy."""
    cores = available_cores()
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
class Run:
    """One run of a candidate: the candidate's flags with one of its repeats (the only one without repeats); a
    process of its own, or one seed of a pack's (``pack``: the pack's folder, its ``--output``)."""

    repeat: dict
    folder: str
    flags: dict
    name: str = ""  # its TensorBoard run: its trial's number and repeat (0003, 0003-seed1)
    pack: str | None = None
    proc: TrialProcess | PackMember | None = None
    slot: int | None = None
    code: int | None = None
    records: list = field(default_factory=list)
    stopped: bool = False  # by the sweep, its candidate pruned

    @property
    def running(self) -> bool:
        return self.proc is not None and self.code is None

    @property
    def log(self) -> str:
        """Its process's console output, beside its folder (a pack's beside the pack's)."""
        return f"{self.pack or self.folder}.log"


@dataclass
class Candidate:
    """One trial of the study: its runs (one per repeat), reported and pruned on their mean."""

    trial: optuna.Trial
    runs: list[Run]
    reported: int = -1
    pruned_at: float | None = None

    @property
    def done(self) -> bool:
        started = [r for r in self.runs if r.proc is not None]
        if any(r.code is None for r in started):
            return False
        return self.pruned_at is not None or len(started) == len(self.runs)

    def waiting(self) -> list[Run] | None:
        """Its next runs not started yet, one process's: one run, or a pack's runs (none once it is pruned)."""
        first = None if self.pruned_at is not None else next((r for r in self.runs if r.proc is None), None)
        if first is None or first.pack is None:
            return [first] if first else None
        return [r for r in self.runs if r.pack == first.pack]


def pruned_reason(at: float) -> str:
    """Why a pruned candidate's runs ended, in their ``metrics.json``."""
    return f"pruned by the sweep at {at:g} simulated seconds (its curve fell behind)"


def run_label(repeat: dict) -> str:
    """A repeat's part of its folder's name: ``seed1``, ``seed1-local-iters2``."""
    return "-".join(f"{k}{v}" for k, v in repeat.items()).replace(os.sep, "_")


class Sweep:
    """One sweep's run: ``prepare`` (every check, exit 2 on a refusal), then ``run``."""

    def __init__(self, spec: SweepSpec, opts: SweepOptions, launch: Launcher | None = None):
        self.spec, self.opts = spec, opts
        # how a trial's process starts: a ``TrialProcess``; the tests give a fake one
        self.launch = launch or (
            lambda flags, folder, cores: TrialProcess(flags, folder, cores, opts.python, bool(opts.deployment))
        )
        self.folder = sweep_dir(spec, opts.output)
        self.candidates: list[Candidate] = []
        # each pack's process by its slot: its slot stays taken until the process ends, though its runs may have
        # ended before (``PackMember.final``: their trials told to the study as they end)
        self.packs: dict[int, PackProcess] = {}
        self.signum: int | None = None
        self.board = None
        self.env_flags: dict = {}  # with --deployment: the flags that send each trial there
        self.packed = False  # a candidate's seeds share jobs (jobs.sweep.pack)
        self.trial_pack = 1  # trials at a time a job (jobs.sweep.pack: different candidates in one job)
        self.pack_queue = 0  # more trials a job holds, waiting for a place (--pack-queue)
        self.pack_note = ""  # the line that says so, or why they do not

    def prepare(self) -> None:
        check_flags(self.spec)
        if self.opts.pruner not in studies.PRUNERS:
            raise SpecError(f"--pruner {self.opts.pruner}: use one of {', '.join(studies.PRUNERS)}")
        if self.opts.min_resource < 0 or self.opts.patience < 0:
            raise SpecError("--min-resource and --patience: 0 or more")
        if self.opts.pack is not None and self.opts.pack < 1:
            raise SpecError(f"--pack {self.opts.pack}: 1 or more runs a job (1: each run its own job)")
        if self.opts.pack_queue is not None and self.opts.pack_queue < 0:
            raise SpecError(f"--pack-queue {self.opts.pack_queue}: 0 or more trials waiting in a job (0: none)")
        if self.opts.deployment:
            from jobs.sweep.deployment import deployment_flags

            self.env_flags = deployment_flags(self.opts.deployment, self.spec)
        self.n, self.share, self.why = plan_parallel(self.spec, self.opts.parallel)
        self.lock = claim_folder(self.folder, self.spec)
        self.storage = studies.open_storage(studies.storage_url(self.folder, self.opts.storage))
        min_steps, max_steps = studies.pruning_steps(self.spec, self.opts.min_resource)
        pruner = studies.make_pruner(self.opts.pruner, min_steps, self.opts.patience, max_steps)
        self.study = studies.open_study(self.spec, self.storage, pruner, self.opts.seed)
        self.tracking = SweepTracking.opened(self.spec, self.folder, self.study)  # the trials' parent run
        if self.opts.tensorboard is not None:
            from jobs.sweep.board import Board

            self.board = Board(self.opts.tensorboard or os.path.join(self.folder, "tensorboard"), self.spec)
        self._plan_packs()

    def _plan_packs(self) -> None:
        """Whether a candidate's seeds, or several trials, share jobs: checked once, as the job script's ``--seeds``
        and ``--runs`` check them; a refusal is one line, and the runs go in separate jobs."""
        extra = self.env_flags | self.tracking.trial_flags()
        if packs_trials(self.spec, self.opts.pack):
            refusal = trials_refusal(self.spec, extra, os.path.join(self.folder, "trials", "pack"))
            if refusal:
                self.pack_note = f"trials run as separate jobs: they cannot share one ({refusal})"
                return
            self.trial_pack = self.opts.pack
            self.pack_queue = self.trial_pack if self.opts.pack_queue is None else self.opts.pack_queue
            queued = (
                f", {self.pack_queue} more waiting in it to take the place of one that ends or is pruned (--pack-queue)"
                if self.pack_queue
                else ""
            )
            self.pack_note = (
                f"up to {self.trial_pack} trials at a time a job, each pruned alone while the others go on{queued} "
                "(--pack 1: each trial its own job)"
            )
            return
        if not packs_seeds(self.spec, self.opts.pack):
            return
        refusal = pack_refusal(self.spec, extra, os.path.join(self.folder, "trials", "pack"))
        if refusal:
            self.pack_note = f"a candidate's seeds run as separate jobs: they cannot share one ({refusal})"
            return
        self.packed = True
        sizes = pack_sizes(len(self.spec.repeats()), self.opts.pack)
        jobs = (
            f"one job of {sizes[0]} runs"
            if len(sizes) == 1
            else f"{len(sizes)} jobs of {', '.join(map(str, sizes))} runs"
        )
        self.pack_note = f"a candidate's {sum(sizes)} seeds run as {jobs}: each job one process, one slot (--pack 1: each seed its own)"

    @property
    def running(self) -> list[Run]:
        return [r for c in self.candidates for r in c.runs if r.running]

    def _cores(self, slot: int) -> list[int] | None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if not cores:
            return None
        first = (slot * self.share) % len(cores)
        return [cores[(first + i) % len(cores)] for i in range(self.share)]

    def _ask(self) -> Candidate:
        """The study's next waiting trial, with its runs planned (their folders and commands in its attributes)."""
        trial = self.study.ask()
        params = suggest(trial, self.spec)
        base = os.path.join(self.folder, "trials", f"{trial.number:04d}")
        runs = []
        for rep in self.spec.repeats():
            name = f"{trial.number:04d}-{run_label(rep)}" if rep else f"{trial.number:04d}"
            runs.append(
                Run(
                    rep,
                    os.path.join(os.path.dirname(base), name),
                    self.spec.trial_flags(params, rep) | self.env_flags,
                    name,
                )
            )
        if self.packed:
            self._pack(runs, base)
        for key, value in studies.owner_attrs().items():
            trial.set_user_attr(key, value)
        if self.spec.repeat:
            trial.set_user_attr("runs", [self._run_attrs(r) for r in runs])
        else:
            trial.set_user_attr("folder", os.path.relpath(base, self.folder))
            trial.set_user_attr("command", " ".join(command(runs[0].flags)))
        candidate = Candidate(trial, runs)
        self.candidates.append(candidate)
        return candidate

    def _pack(self, runs: list[Run], base: str) -> None:
        """Group a candidate's seed runs into packs (``--pack``): each pack's folder is its ``--output`` and each
        seed's results in it (``seed-N``) its run's folder; a group of one stays a run of its own."""
        sizes = pack_sizes(len(runs), self.opts.pack)
        start = 0
        for k, size in enumerate(sizes):
            if size >= 2:
                folder = base if len(sizes) == 1 else f"{base}-pack{k}"
                for run in runs[start : start + size]:
                    run.pack, run.folder = folder, seed_folder(folder, run.repeat["seed"])
            start += size

    def _start(self, slot: int) -> bool:
        """Fill ``slot`` with one process: a started candidate's next run (or pack) first (its mean is known
        sooner), else a new candidate's."""
        runs = next((g for c in self.candidates if (g := c.waiting())), None)
        if runs is None:
            if not self._waiting():
                return False
            if self.trial_pack > 1 and self._waiting() >= 2:
                return self._start_trials(slot)
            runs = self._ask().waiting()
        cores, parent = self._cores(slot), self.tracking.trial_flags()
        for run in runs:
            run.slot = slot
        if runs[0].pack is None:
            runs[0].proc = self.launch(runs[0].flags | parent, runs[0].folder, cores)
            return True
        flags = {k: v for k, v in runs[0].flags.items() if k != "seed"}  # the pack's: its seeds instead
        proc = self.packs[slot] = PackProcess(
            self.launch(flags | {"seeds": [r.repeat["seed"] for r in runs]} | parent, runs[0].pack, cores)
        )
        for run in runs:
            run.proc = PackMember(proc, run.folder)
        return True

    def _start_trials(self, slot: int) -> bool:
        """Fill ``slot`` with one job of the study's next trials: ``--pack`` of them at a time and ``--pack-queue``
        more waiting, each joining the running job when one ends or is pruned (a ``--runs`` file of their flags and
        ``--runs-at-once``), each trial's results in its own folder as if it ran alone."""
        cands = [self._ask() for _ in range(min(self.trial_pack + self.pack_queue, self._waiting()))]
        runs = [c.runs[0] for c in cands]
        folder = os.path.join(self.folder, "trials", f"pack-{cands[0].trial.number:04d}")
        path = write_runs_file(folder, {os.path.basename(r.folder): r.flags | {"output": r.folder} for r in runs})
        at_once = {"runs-at-once": self.trial_pack} if len(runs) > self.trial_pack else {}
        flags = {"runs": path} | at_once | self.tracking.trial_flags()
        proc = self.packs[slot] = PackProcess(self.launch(flags, folder, self._cores(slot)))
        for cand, run in zip(cands, runs, strict=True):
            run.pack, run.slot, run.proc = folder, slot, PackMember(proc, run.folder)
            cand.trial.set_user_attr("pack", os.path.relpath(folder, self.folder))
        return True

    def _report(self, cand: Candidate) -> None:
        views = []
        for run in cand.runs:
            if run.proc is not None:
                run.records = run.proc.records()
            decided = run.proc is not None and bool(read_metrics(run.proc.folder).get("outcome"))
            if decided and not self.spec.repeat:
                return  # the job has decided its end (only its shut-down is left): its score is final
            views.append((run.records, run.code is not None or decided))
        for step, value in mean_steps(self.spec.objective, views, cand.reported):
            cand.trial.report(value, step)
            cand.reported = step
            if cand.trial.should_prune():
                cand.pruned_at = step * self.spec.objective.step
                return

    def _run_attrs(self, run: Run) -> dict:
        """What the study keeps of one run: its folder and command; once it ended, its figures and ``ended_early``."""
        attrs = {"folder": os.path.relpath(run.folder, self.folder), "command": " ".join(command(run.flags))}
        attrs |= {"repeat": run.repeat} if run.repeat else {}
        attrs |= {"pack": os.path.relpath(run.pack, self.folder)} if run.pack else {}  # the job it shared
        if run.code is None or run.proc is None:
            return attrs
        last = run.records[-1] if run.records else {}
        return attrs | {
            "versions": last.get("version"),
            "sim_seconds": last.get("sim_seconds"),
            "epsilon": (last.get("privacy") or {}).get("epsilon"),  # differential privacy's, spent by the end
            "wall_seconds": round(run.proc.wall_seconds, 1),
            "exit_code": run.code,
            "started": round(run.proc.started, 3),  # epoch seconds: with the records' epochs, a trial's fixed cost
            "ended": round(run.proc.started + run.proc.wall_seconds, 3),
            "ended_early": None if run.stopped else ended_early(self.spec.objective, read_metrics(run.folder)),
        }

    def _finish(self, cand: Candidate) -> None:
        started = [r for r in cand.runs if r.proc is not None]
        for run in started:
            run.records = run.proc.records()
        trial, shown = cand.trial, ", ".join(f"{k}={format_value(v)}" for k, v in cand.trial.params.items())
        if self.spec.repeat:
            trial.set_user_attr("runs", [self._run_attrs(r) for r in cand.runs])
        for key, value in self._run_attrs(started[0]).items() if not self.spec.repeat else ():
            trial.set_user_attr(key, value)
        if self.spec.repeat:  # the table's figures: the mean over the runs, the slowest run's wall time
            ended = [self._run_attrs(r) for r in started]
            for key in ("versions", "sim_seconds", "epsilon"):
                known = [a[key] for a in ended if a.get(key) is not None]
                trial.set_user_attr(key, round(sum(known) / len(known), 3) if known else None)
            trial.set_user_attr("wall_seconds", max(a["wall_seconds"] for a in ended))
        if cand.pruned_at is not None:
            reason = pruned_reason(cand.pruned_at)
            for run in started:
                status = (read_metrics(run.folder).get("outcome") or {}).get("status")
                if run.stopped and status != "pruned":  # a run that had already ended keeps its own outcome
                    record_pruned(run.folder, reason)
            self._board(cand, None, "pruned")  # before the study hears of it: a trial it counts as ended has its board
            self.study.tell(trial, state=TrialState.PRUNED)
            say(f"[sweep] trial {trial.number} pruned at {cand.pruned_at:g} simulated s ({shown})")
            return
        values = [score(self.spec.objective, r.records) for r in started]
        value = mean_score(self.spec.objective, [r.records for r in started])
        failed = [r for r in started if r.code != 0]
        if not failed and value is not None:
            if self.spec.repeat:
                trial.set_user_attr("values", values)
            self._board(cand, value, "complete")
            self.study.tell(trial, value)
            say(f"[sweep] trial {trial.number} complete: {format_value(value)} ({shown})")
        else:
            self._board(cand, None, "fail")
            self.study.tell(trial, state=TrialState.FAIL)
            run = failed[0] if failed else started[0]
            log = os.path.relpath(run.log, self.folder)
            say(f"[sweep] trial {trial.number} failed (exit {run.code}; its log: {log}) ({shown})")

    def _board(self, cand: Candidate, value: float | None, state: str) -> None:
        """The ended trial in the trackers and, with ``--tensorboard``, in TensorBoard (one run per process)."""
        self.tracking.mark(cand.trial.number, self.study.study_name, state, value, [r.folder for r in cand.runs])
        if self.board is not None:
            for run in cand.runs:
                if run.proc is not None:
                    self.board.write_run(cand.trial.number, cand.trial.params, run, state, value)

    def _waiting(self) -> int:
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def _live_packs(self) -> set[int]:
        """The slots of packs whose process still runs (forgetting those that ended)."""
        self.packs = {slot: proc for slot, proc in self.packs.items() if proc.poll() is None}
        return set(self.packs)

    def _requeue_orphans(self) -> list[int]:
        """Trials a gone sweep left RUNNING (``study.requeue_orphans``): marked failed, queued again, and said so."""
        if requeued := studies.requeue_orphans(self.study):
            ids = ", ".join(map(str, requeued))
            print(f"[sweep] continuing: trial(s) {ids} were running, marked failed, queued again")
        return requeued

    def _on_signal(self, signum, _frame) -> None:
        self.signum = signum

    def _stop_all(self) -> None:
        """Ctrl-C / SIGTERM: stop every running trial, mark it failed and queue it again."""
        stop_together([run.proc for cand in self.candidates for run in cand.runs if run.running])
        for cand in self.candidates:
            self.study.tell(cand.trial, state=TrialState.FAIL, skip_if_finished=True)
            attrs = {"slot": cand.trial.user_attrs.get("slot"), "requeued_from": cand.trial.number}
            self.study.enqueue_trial(cand.trial.params, user_attrs=attrs)
        self.candidates.clear()

    def _bar_text(self) -> str:
        c = studies.counts(self.study)
        best = studies.best_trial(self.study)
        shown = format_value(best.value) if best else "-"
        return f"done {c['complete']}, pruned {c['pruned']}, failed {c['fail']}, running {len(self.candidates)}, best {shown}"

    def run(self) -> int:
        print(f"[sweep] {self.spec.study_name}: {self.spec.trials} trial(s); folder {self.folder}")
        print(f"[sweep] {self.n} trial(s) at once: {self.why}")
        if self.pack_note:
            print(f"[sweep] {self.pack_note}")
        requeued, planned = self._requeue_orphans(), studies.plan_trials(self.study, self.spec)  # in either order
        if not requeued and not planned:
            print("[sweep] continuing the study found in its storage")
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        bar = make_bar(self.spec.trials, self.opts.bar)
        try:
            while self.signum is None:
                busy = {r.slot for r in self.running} | self._live_packs()
                for slot in range(self.n):
                    if slot not in busy and self._start(slot):
                        busy.add(slot)
                for cand in list(self.candidates):
                    for run in cand.runs:
                        if run.running:
                            run.code = run.proc.poll()
                    if cand.pruned_at is None:
                        self._report(cand)
                    if cand.pruned_at is not None:  # every run of a pruned candidate stops
                        running = [run for run in cand.runs if run.running]
                        codes = stop_together([run.proc for run in running], pruned_reason(cand.pruned_at))
                        for run, code in zip(running, codes, strict=True):
                            run.code, run.stopped = code, True
                    if cand.done:
                        self._finish(cand)
                        self.candidates.remove(cand)
                c = studies.counts(self.study)
                bar.n = c["complete"] + c["pruned"]
                bar.set_postfix_str(self._bar_text(), refresh=True)
                # done, unless a gone sweep's trials were queued again or one taken is not yet stamped (its grace)
                idle = not self.candidates and not self._waiting() and not self._live_packs()
                if idle and not self._requeue_orphans() and not studies.unclaimed(self.study):
                    break
                time.sleep(self.opts.poll_seconds)
        finally:
            if self.candidates:
                self._stop_all()
            for proc in self.packs.values():  # a pack whose runs had all ended, still shutting down
                proc.stop()
            bar.close()
            for s, handler in previous.items():
                signal.signal(s, handler)
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            print(f"[sweep] stopped ({name}); run the same command to continue", file=sys.stderr)
            return 128 + self.signum
        return 0
