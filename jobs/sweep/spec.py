"""A sweep's spec: the YAML file read, checked against the job's own flags, and turned into trials' command lines.

::

    base:                      # every trial's flags (a flag's name with dashes or underscores; true: an on switch)
      num-leaf-nodes: 2
      max-model-version: 10
    grid:                      # every combination is a cell; each cell is run (or searched) in turn
      method: [fedavg, fedbuff]
    repeat:                    # optional: each candidate runs once per combination; its objective is their mean
      seed: [1, 2, 3]
    when:                      # optional: flags added when a flag takes a value (they may override base)
      method: {fedavg: {eval-frequency: 1}}
    search:                    # optional; one entry per flag
      local-lr: {type: log-float, low: 1.0e-4, high: 1.0}
      global-lr: {type: float, low: 0.1, high: 2.0}
      local-iters: {type: int, low: 1, high: 8}
      optimizer: {type: choice, values: [sgd, adam]}
    objective:                 # final_accuracy | accuracy_at (needs budget) | time_to_target (needs target)
      metric: accuracy_at
      budget: 20.0             # simulated seconds
      step: 1.0                # simulated seconds per pruning step (default 1)
    trials: 12                 # with a search (default 10); a grid alone runs each cell once

A budget holds (``budget_flags``): when the objective is read at a simulated-time budget (``accuracy_at``) or a
trial's flags give ``max-sim-time``, the sweep lifts the version cap (``--max-model-version``, default 10) of
every trial whose flags do not set it, so that the time budget, not a version count, ends it; with ``accuracy_at``
and no ``max-sim-time`` it also ends each trial at the budget. A cap the spec gives is kept (a trial it ends early
is marked in the report). A spec whose ``max-sim-time`` ends trials before the budget, or whose delays give no
simulated time to spend (``--delays none``: every update arrives at time 0), is refused in one line.

Every trial's flags are parsed by the job's own parser and checked by the build step's first stages
(``jobs.cli.config_from_args``, ``jobs.build.checked_config``) before any trial starts, so an unknown flag or a bad
value is refused here, in one line (``SpecError``), not in a trial; each trial's job builds its own resolved config.

Kept whole: the spec's format, its parsing and its checks against the job's flags change together.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from dataclasses import dataclass, field

import yaml

from common.choices import ConfigError
from common.config_flags import flag_args

SCRIPT = "jobs/pt_job_fedrevive.py"  # the job every trial runs: --method chooses, the method's presets apply
SEARCH_TYPES = ("float", "log-float", "int", "choice")
METRICS = ("final_accuracy", "accuracy_at", "time_to_target")
# the sweep decides these, not the spec (tracking_parent: its own MLflow run, jobs.sweep.tracking)
SWEEP_OWNED = ("output", "resume", "dry_run", "export_only", "env", "tracking_parent")
LIFTED_VERSION_CAP = 1_000_000  # a trial on a time budget: the budget ends it, not a version count
KEYS = ("base", "grid", "repeat", "when", "search", "objective", "trials")


class SpecError(ConfigError):
    """A spec the sweep refuses, with the fix in its one line."""


def flag_name(name: str) -> str:
    """``local_lr`` / ``--local-lr`` / ``local-lr`` -> ``local-lr``."""
    return str(name).strip().lstrip("-").replace("_", "-")


@dataclass(frozen=True)
class Param:
    """One searched flag: ``float``, ``log-float`` or ``int`` between ``low`` and ``high``, or a ``choice``."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    values: tuple = ()

    def probes(self) -> list:
        """Values that stand for the whole range when the spec is checked: its ends, or every choice."""
        if self.type == "choice":
            return list(self.values)
        return [int(self.low), int(self.high)] if self.type == "int" else [self.low, self.high]


@dataclass(frozen=True)
class Objective:
    metric: str = "final_accuracy"
    budget: float | None = None
    target: float | None = None
    step: float = 1.0

    @property
    def direction(self) -> str:
        return "minimize" if self.metric == "time_to_target" else "maximize"


@dataclass(frozen=True)
class SweepSpec:
    name: str
    base: dict
    grid: dict
    search: tuple[Param, ...]
    objective: Objective
    trials: int
    repeat: dict = field(default_factory=dict)
    when: dict = field(default_factory=dict)
    text: str = field(repr=False, default="")

    @property
    def digest(self) -> str:
        """Names the sweep in a shared storage: two different specs never share a study."""
        canon = json.dumps(
            {
                "base": self.base,
                "grid": self.grid,
                **({"repeat": self.repeat, "when": self.when} if self.repeat or self.when else {}),
                "search": [p.__dict__ for p in self.search],
                "obj": self.objective.__dict__,
            },
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(canon.encode()).hexdigest()[:10]

    @property
    def study_name(self) -> str:
        return f"{self.name}-{self.digest}"

    def cells(self) -> list[dict]:
        """Every combination of the grid's values (one empty cell without a grid), in the spec's order."""
        keys = list(self.grid)
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(self.grid[k] for k in keys))]

    def slots(self) -> list[dict]:
        """The study's planned trials: each one's grid cell. A search spreads ``trials`` over the cells in turn."""
        cells = self.cells()
        if not self.search:
            return cells
        return [cells[i % len(cells)] for i in range(self.trials)]

    def repeats(self) -> list[dict]:
        """Every combination of ``repeat``'s values: the runs of one candidate (one empty run without a repeat)."""
        keys = list(self.repeat)
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(self.repeat[k] for k in keys))]

    def trial_flags(self, params: dict, repeat: dict | None = None) -> dict:
        """A run's flags: the base, the ``when`` flags its values call for, then its cell and searched values
        (Optuna's params: flag names) and its repeat's values."""
        chosen = dict(self.base) | dict(params) | dict(repeat or {})
        extra: dict = {}
        for name, cases in self.when.items():
            if name in chosen:
                extra |= cases.get(str(chosen[name]), {})
        flags = dict(self.base) | extra | dict(params) | dict(repeat or {})
        return flags | self.budget_flags(flags)

    def sets(self, name: str) -> bool:
        """Whether the spec gives the flag anywhere: base, grid, search, repeat or a ``when``."""
        added = {k for cases in self.when.values() for flags in cases.values() for k in flags}
        searched = {p.name for p in self.search}
        return any(name in place for place in (self.base, self.grid, self.repeat, added, searched))

    def budget_flags(self, flags: dict) -> dict:
        """What a run's flags need so that its version cap cannot end it before its budget (the module docstring):
        the cap lifted, and with ``accuracy_at`` and no ``max-sim-time`` the budget as its time limit; nothing when
        it has no budget or its flags set the cap themselves."""
        budget = self.objective.budget if self.objective.metric == "accuracy_at" else None
        if "max-model-version" in flags or (budget is None and flags.get("max-sim-time") is None):
            return {}
        return {"max-model-version": LIFTED_VERSION_CAP} | (
            {"max-sim-time": budget} if flags.get("max-sim-time") is None else {}
        )

    def workspace(self) -> str:
        return os.path.expanduser(str(self.base.get("workspace", "~/.cache/edgesim-flare/workspace")))


def _number(where: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where}: {value!r} is not a number; write a number")
    return float(value)


def parse_param(name: str, entry) -> Param:
    where = f"search.{name}"
    if not isinstance(entry, dict):
        raise SpecError(
            f"{where}: give {{type: float|log-float|int|choice, low: .., high: ..}} or {{type: choice, values: [..]}}"
        )
    kind = entry.get("type", "choice" if "values" in entry else "float")
    if kind not in SEARCH_TYPES:
        raise SpecError(f"{where}: type {kind!r} is not one of {', '.join(SEARCH_TYPES)}")
    if kind == "choice":
        values = entry.get("values")
        if not isinstance(values, list) or not values:
            raise SpecError(f"{where}: a choice needs a non-empty list, e.g. values: [sgd, adam]")
        return Param(flag_name(name), kind, values=tuple(values))
    if "low" not in entry or "high" not in entry:
        raise SpecError(f"{where}: a {kind} needs low and high")
    low, high = _number(f"{where}.low", entry["low"]), _number(f"{where}.high", entry["high"])
    if not low < high:
        raise SpecError(f"{where}: low {low:g} must be below high {high:g}")
    if kind == "log-float" and low <= 0:
        raise SpecError(f"{where}: a log-float range must be above 0 (low {low:g}); use type float for 0")
    if kind == "int" and (low != int(low) or high != int(high)):
        raise SpecError(f"{where}: an int range needs whole numbers (low {low:g}, high {high:g})")
    return Param(flag_name(name), kind, low, high)


def parse_objective(entry) -> Objective:
    entry = entry or {}
    if isinstance(entry, str):
        entry = {"metric": entry}
    metric = entry.get("metric", "final_accuracy")
    if metric not in METRICS:
        raise SpecError(f"objective.metric {metric!r}: use one of {', '.join(METRICS)}")
    budget = entry.get("budget")
    target = entry.get("target")
    step = _number("objective.step", entry.get("step", 1.0))
    if step <= 0:
        raise SpecError(f"objective.step {step:g}: simulated seconds per pruning step, above 0")
    if metric == "accuracy_at" and (budget is None or _number("objective.budget", budget) <= 0):
        raise SpecError("objective accuracy_at needs budget: the simulated seconds at which accuracy is read (> 0)")
    if metric == "time_to_target" and (target is None or not 0 < _number("objective.target", target) <= 1):
        raise SpecError("objective time_to_target needs target: the accuracy to reach, in (0, 1]")
    return Objective(metric, None if budget is None else float(budget), None if target is None else float(target), step)


def _values(where: str, v) -> list:
    values = v if isinstance(v, list) else [v]
    if not values:
        raise SpecError(f"{where} is empty: give at least one value, or leave it out")
    return values


def parse_when(raw) -> dict:
    """``when: {FLAG: {VALUE: {FLAG2: V2, ..}}}``: flags added to a run whose FLAG is VALUE."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(c, dict) for c in raw.values()):
        raise SpecError(
            "when: give {flag: {value: {flag: value, ..}}}, e.g. when: {method: {fedavg: {eval-frequency: 1}}}"
        )
    out = {}
    for name, cases in raw.items():
        out[flag_name(name)] = {}
        for value, flags in cases.items():
            if not isinstance(flags, dict) or not flags:
                raise SpecError(f"when.{name}.{value}: give the flags to add, e.g. {{eval-frequency: 1}}")
            out[flag_name(name)][str(value)] = {flag_name(k): v for k, v in flags.items()}
    return out


def parse_spec(text: str, name: str) -> SweepSpec:
    """A spec from its YAML text (``name``: the sweep's name, the spec file's stem); ``SpecError`` names the fix."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as ex:
        raise SpecError(f"the spec is not valid YAML ({str(ex).splitlines()[0]}); fix its syntax") from ex
    if not isinstance(raw, dict):
        raise SpecError("the spec must be a YAML mapping with base, grid, search, objective and trials")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise SpecError(f"unknown spec key(s) {', '.join(unknown)}; the keys are {', '.join(KEYS)}")
    base = {flag_name(k): v for k, v in (raw.get("base") or {}).items()}
    grid = {flag_name(k): _values(f"grid.{k}", v) for k, v in (raw.get("grid") or {}).items()}
    repeat = {flag_name(k): _values(f"repeat.{k}", v) for k, v in (raw.get("repeat") or {}).items()}
    if "repeat" in raw and not repeat:
        raise SpecError("repeat is empty: give the flag each candidate repeats over, e.g. repeat: {seed: [0, 1, 2]}")
    when = parse_when(raw.get("when"))
    search_raw = raw.get("search")
    if "search" in raw and not search_raw:
        raise SpecError("search is empty: give at least one flag's range, or leave search out for a grid")
    search = tuple(parse_param(k, v) for k, v in (search_raw or {}).items())
    places = [set(base), set(grid), {p.name for p in search}, set(repeat)]
    overlap = sorted({n for i, a in enumerate(places) for b in places[i + 1 :] for n in a & b})
    if overlap:
        raise SpecError(f"{', '.join(overlap)} given twice (base, grid, search, repeat): give each flag in one place")
    added = {k for cases in when.values() for flags in cases.values() for k in flags}
    varied = set().union(*places[1:])
    if added & varied:
        raise SpecError(
            f"when adds {', '.join(sorted(added & varied))}, which the grid, search or repeat sets: give it in one place"
        )
    if set(when) - set().union(*places):
        missing = ", ".join(sorted(set(when) - set().union(*places)))
        raise SpecError(f"when.{missing}: no base, grid, search or repeat flag of that name; name one of theirs")
    owned = sorted(set(map(flag_name, SWEEP_OWNED)) & (set().union(*places) | added))
    if owned:
        raise SpecError(
            f"{', '.join(owned)}: the sweep sets these itself (each trial's folder, SimEnv, its parent run); leave "
            "them out"
        )
    trials = raw.get("trials", 10 if search else None)
    if search and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 1):
        raise SpecError(f"trials {trials!r}: a search needs a whole number of trials >= 1")
    spec = SweepSpec(name, base, grid, search, parse_objective(raw.get("objective")), trials or 0, repeat, when, text)
    if not search:
        spec = SweepSpec(name, base, grid, search, spec.objective, len(spec.cells()), repeat, when, text)
    return spec


def load_spec(path: str) -> SweepSpec:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as ex:
        raise SpecError(f"cannot read the spec {path} ({ex.strerror}); give a YAML file's path") from ex
    return parse_spec(text, os.path.splitext(os.path.basename(path))[0])


class _Refusal(Exception):
    pass


def check_flags(spec: SweepSpec) -> None:
    """Parse and build every cell's flags, with each searched flag at its probes (a range's ends, every choice),
    as the job's command line would (``jobs.cli``): the first refusal is a ``SpecError`` naming the flag."""
    from jobs.cli import build_parser, config_from_args

    parser = build_parser("", method_choice=True)

    def refuse(message: str):
        raise _Refusal(message)

    parser.error = refuse  # one line, raised here rather than printed with a usage block
    known = {s.lstrip("-") for s in parser._option_string_actions}  # argparse's own table of the flags it takes
    added = [k for cases in spec.when.values() for flags in cases.values() for k in flags]
    for name in [*spec.base, *spec.grid, *(p.name for p in spec.search), *spec.repeat, *added]:
        plain = name[3:] if name.startswith("no-") else name
        if name not in known and plain not in known:
            raise SpecError(f"unknown flag --{name}; the flags are the job's (python {SCRIPT} --help)")
    probes = [[(p.name, v) for v in p.probes()] for p in spec.search]
    repeats = spec.repeats()
    for i, cell in enumerate(spec.cells()):
        # every cell with the first repeat, the first cell with every repeat
        for combo, rep in itertools.product(itertools.product(*probes), repeats if i == 0 else repeats[:1]):
            flags = spec.trial_flags(cell | dict(combo), rep)
            try:
                args = parser.parse_args(flag_args(flags))
                check_budget(spec, config_from_args(args, args.method, presets=True))
            except (_Refusal, ConfigError) as ex:
                shown = ", ".join(f"{k}={v}" for k, v in (cell | dict(combo) | rep).items()) or "the base flags"
                raise SpecError(f"{ex} (with {shown})") from ex


def budget_note(spec: SweepSpec) -> str:
    """What the sweep does so that its trials reach their budget, for its first lines ("": they have none)."""
    at = spec.objective.metric == "accuracy_at"
    if not at and not spec.sets("max-sim-time"):
        return ""
    budget = f"{spec.objective.budget:g} simulated s" if at else "each trial's max-sim-time"
    limit = f" --max-sim-time {spec.objective.budget:g}" if at and not spec.sets("max-sim-time") else ""
    lift = f"--max-model-version {LIFTED_VERSION_CAP}{limit}"
    if spec.sets("max-model-version"):
        return (
            f"budget {budget}: a trial whose flags set no max-model-version runs with {lift}; the spec's own "
            "max-model-version is kept, and a trial it ends before the budget is marked !"
        )
    return f"budget {budget}: every trial runs with {lift}, so the budget, not a version count, ends it"


def check_budget(spec: SweepSpec, cfg) -> None:
    """A trial's budget must be reachable: its ``max-sim-time`` not before the objective's budget, and, its version
    cap lifted, simulated time that moves (``cfg``: the trial's ``JobConfig``). ``ConfigError`` naming the fix."""
    o, limit = spec.objective, cfg.federation.max_sim_time
    if o.metric == "accuracy_at" and limit is not None and limit < o.budget:
        raise ConfigError(
            f"max-sim-time {limit:g} ends every trial before the objective's budget of {o.budget:g} simulated s: "
            "raise it to the budget or more, or leave it out (each trial then ends at the budget)"
        )
    if cfg.federation.max_model_version >= LIFTED_VERSION_CAP and not cfg.delays.enabled:  # only time ends it
        raise ConfigError(
            f"--method {cfg.method} has no delays (--delays none), so every update arrives at simulated time 0 "
            "and no budget of simulated time is ever reached: give delays (e.g. delays: paper in base) or "
            "max-model-version"
        )


def format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if value == value and not math.isinf(value) else str(value)
    return str(value)
