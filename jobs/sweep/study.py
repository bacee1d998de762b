"""The sweep's Optuna study: its storage (SQLite in the sweep's folder, or any SQLAlchemy URL), its sampler and
pruner, its planned trials, and what a re-run after Ctrl-C or SIGKILL finds and re-queues.

Planned trials are enqueued once, each with its grid cell (``slot``: its index in ``SweepSpec.slots``), so the
plan survives any interruption: a re-run enqueues only the slots missing from the study. A trial left RUNNING by a
sweep of this machine that is no longer alive is marked FAIL and its parameters re-queued (same slot, same
values, ``requeued_from`` its number); a trial running under another live sweep (another machine sharing the
storage) is left alone. A sweep killed between taking a trial (``study.ask``) and stamping it with its owner
leaves a RUNNING trial with no owner: it is an orphan too once ``UNCLAIMED_GRACE_S`` have passed since it started
(a live sweep stamps its trial within milliseconds of taking it). A re-run started within that grace finds it
``unclaimed``: before it ends, it waits out the grace and runs the trial's slot itself.
"""

from __future__ import annotations

import datetime
import math
import os
import socket
import warnings

import optuna
import psutil
from optuna.pruners import BasePruner, HyperbandPruner, MedianPruner, NopPruner, PatientPruner
from optuna.trial import TrialState

from common.seeds import stable_seed
from jobs.sweep.spec import SpecError, SweepSpec

PRUNERS = ("hyperband", "median", "none")
STORAGE_FILE = "study.db"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def storage_url(sweep_dir: str, given: str | None) -> str:
    return given or f"sqlite:///{os.path.join(os.path.abspath(sweep_dir), STORAGE_FILE)}"


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """The study store; ``SpecError`` (exit 2, before any trial) when it cannot be opened."""
    try:
        # SQLite waits for a lock rather than failing at once while the bar and a trial's end write together
        kwargs = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {}
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as ex:  # SQLAlchemy's errors (no driver, bad URL, unreachable server) share no base we own
        first = str(ex).strip().splitlines()[0] if str(ex).strip() else type(ex).__name__
        raise SpecError(
            f"--storage {url}: cannot open it ({first}); give a SQLAlchemy URL such as sqlite:///PATH/study.db"
        ) from ex


def make_pruner(kind: str, min_resource_steps: int, patience: int, max_steps: int | None) -> BasePruner:
    """Hyperband or the median rule, wrapped in a ``PatientPruner`` when ``patience`` >= 1 (the rule applies only
    once the trial's last ``patience + 1`` values are all below its own earlier best); ``none`` never prunes.
    ``patience`` 0 leaves the rule alone: Optuna's wrapper with 0 would still spare every flat curve (its last value
    is not below its best), and a flat curve is what a hopeless learning rate gives."""
    if kind == "none":
        return NopPruner()
    if kind == "hyperband":
        inner = HyperbandPruner(
            min_resource=max(1, min_resource_steps),
            max_resource=max_steps if max_steps and max_steps > min_resource_steps else "auto",
            reduction_factor=3,
        )
    elif kind == "median":
        inner = MedianPruner(n_startup_trials=2, n_warmup_steps=min_resource_steps)
    else:
        raise SpecError(f"--pruner {kind}: use one of {', '.join(PRUNERS)}")
    if patience < 1:
        return inner
    with warnings.catch_warnings():  # experimental since Optuna 2.8, and the wrapper the issue asks for
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return PatientPruner(inner, patience=patience)


def pruning_steps(spec: SweepSpec, min_resource: float) -> tuple[int, int | None]:
    """``--min-resource`` (simulated seconds) and the budget (when the objective has one) in pruning steps."""
    step = spec.objective.step
    budget = spec.objective.budget
    return math.ceil(min_resource / step - 1e-9), (math.ceil(budget / step) if budget else None)


def make_sampler(spec: SweepSpec, seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed) if spec.search else optuna.samplers.RandomSampler(seed=seed)


def open_study(spec: SweepSpec, storage, pruner: BasePruner, seed: int) -> optuna.Study:
    """The spec's study, new or continued. A continued one's sampler is seeded from the seed and the trials already
    in it: seeded as the first sweep was, it would draw that sweep's first values again (a resumed search would
    run trials it has already run, with the same values)."""
    study = optuna.create_study(
        study_name=spec.study_name,
        storage=storage,
        sampler=make_sampler(spec, seed),
        pruner=pruner,
        direction=spec.objective.direction,
        load_if_exists=True,
    )
    earlier = len(study.get_trials(deepcopy=False))
    if earlier:
        study.sampler = make_sampler(spec, stable_seed("sweep-sampler", seed, earlier) % 2**32)
    return study


def plan_trials(study: optuna.Study, spec: SweepSpec) -> int:
    """Enqueue each planned slot not yet in the study; how many were enqueued."""
    have = {t.user_attrs.get("slot") for t in study.get_trials(deepcopy=False)}
    missing = [(i, cell) for i, cell in enumerate(spec.slots()) if i not in have]
    for i, cell in missing:
        study.enqueue_trial(cell, user_attrs={"slot": i}, skip_if_exists=False)
    if spec.search and spec.text:
        study.set_user_attr("spec", spec.text)
    return len(missing)


def owner_attrs() -> dict:
    """Who runs a trial: this machine and this sweep's process (its start time tells a reused pid apart)."""
    me = psutil.Process()
    return {"host": socket.gethostname(), "sweep_pid": me.pid, "sweep_started": me.create_time()}


UNCLAIMED_GRACE_S = 60.0  # seconds a RUNNING trial may lack its owner's stamp before it counts as an orphan


def owner_alive(attrs: dict, started: datetime.datetime | None = None, now: datetime.datetime | None = None) -> bool:
    """Whether the sweep that took a trial (its ``owner_attrs``, its ``started`` time) may still be running it."""
    if "host" not in attrs:  # taken, never stamped: its sweep died at once, unless it is being stamped right now
        now = now or datetime.datetime.now()
        return started is not None and (now - started).total_seconds() < UNCLAIMED_GRACE_S
    if attrs.get("host") != socket.gethostname():
        return True  # another machine's sweep: we cannot tell, so its trial is left to it
    try:
        p = psutil.Process(int(attrs.get("sweep_pid", -1)))
        return abs(p.create_time() - float(attrs.get("sweep_started", 0))) < 1.0
    except (psutil.NoSuchProcess, ValueError):
        return False


def requeue_orphans(study: optuna.Study, now: datetime.datetime | None = None) -> list[int]:
    """Trials left RUNNING by a dead sweep of this machine (or by one killed before it stamped them): marked FAIL,
    their parameters enqueued again. Returns their numbers."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    orphans = [t for t in running if not owner_alive(t.user_attrs, t.datetime_start, now)]
    for t in orphans:
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        # a trial killed before it suggested its values has only those it was enqueued with
        values = {**t.system_attrs.get("fixed_params", {}), **t.params}
        study.enqueue_trial(values, user_attrs={"slot": t.user_attrs.get("slot"), "requeued_from": t.number})
    return [t.number for t in orphans]


def unclaimed(study: optuna.Study) -> list[int]:
    """RUNNING trials never stamped with an owner: a sweep killed between taking them and stamping them, or one
    stamping them right now. Either way not ended: ``requeue_orphans`` takes them once their grace has passed."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    return [t.number for t in running if "host" not in t.user_attrs]


def counts(study: optuna.Study) -> dict[str, int]:
    out = {s.name.lower(): 0 for s in TrialState}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name.lower()] += 1
    return out


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    done = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.value is not None and not math.isnan(t.value)
    ]
    if not done:
        return None
    pick = min if study.direction == optuna.study.StudyDirection.MINIMIZE else max
    return pick(done, key=lambda t: t.value)


def trial_runs(trial: optuna.trial.FrozenTrial) -> list[dict]:
    """A trial's processes as the study keeps them (``folder``, ``command``, once ended ``started``, ``ended`` ...):
    one per repeat (``runs``), or the trial's own attributes without repeats."""
    return list(trial.user_attrs.get("runs") or ([trial.user_attrs] if "folder" in trial.user_attrs else []))
