"""Several seeds of one job run as one NVFlare job (a pack, ``docs/packs.md``): a job script's ``--seeds 0,1,2``
and ``jobs.api.run(..., seeds=[0, 1, 2])``.

Before any process starts, the seeds are checked (at least two distinct non-negative integers, without ``--seed``,
``--resume``, ``--dry-run`` or ``--export-only``), each seed's config is built (``jobs.build``; its results in
``OUTPUT/seed-N``) and the configs are checked as a pack (``jobs.pack_check``): a refusal is one ``ConfigError``
naming the fix. ``run_seeds`` runs the pack (``jobs.run.pack.run_pack``) and returns each seed's ``RunResult``;
``seeds_table`` is what both print at the end: each seed's result, then the mean +- std of the final accuracies
(``mean_std``, the figures the sweep prints for a candidate's repeated seeds: ``jobs.sweep.report``).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.choices import ConfigError
from jobs.build import build_config, checked_config
from jobs.config import JobConfig
from jobs.methods import Method
from jobs.pack_check import check_pack
from jobs.run.pack_folder import KIND_RUNS, KIND_SEEDS

if TYPE_CHECKING:
    from jobs.run.results import RunResult

SEEDS_HELP = (
    "run these seeds (comma-separated, at least two, e.g. 0,1,2) as ONE NVFlare job (a pack, docs/packs.md): each "
    "seed's results in OUTPUT/seed-N, then each seed's final accuracy and their mean +- std; instead of --seed"
)
"""The help of the job scripts' ``--seeds`` flag (``jobs.cli``); ``jobs.api.run``'s ``seeds`` keyword is the same."""

REFUSED_WITH = {"seed": "--seed", "resume": "--resume", "dry_run": "--dry-run", "export_only": "--export-only"}
"""Options a pack of seeds refuses beside it: each seed is its own run, and a pack is neither resumed, dry-run nor
exported (``docs/packs.md``)."""


def parse_seeds(value: str | Iterable[int]) -> list[int]:
    """The seeds of ``--seeds 0,1,2`` (or ``seeds=[0, 1, 2]``): at least two distinct non-negative integers, else
    ``ConfigError`` naming the fix."""
    shown = value if isinstance(value, str) else ",".join(map(str, value))
    try:
        if isinstance(value, str):
            seeds = [int(s) for s in value.split(",")]
        else:
            seeds = list(value)
            if any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
                raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"--seeds {shown}: give integers separated by commas, e.g. --seeds 0,1,2") from None
    if len(seeds) < 2:
        raise ConfigError(f"--seeds {shown}: a pack needs at least 2 seeds; for one seed use --seed {shown}")
    if len(set(seeds)) != len(seeds):
        repeated = sorted({s for s in seeds if seeds.count(s) > 1})
        raise ConfigError(f"--seeds {shown} repeats {', '.join(map(str, repeated))}: give each seed once")
    if min(seeds) < 0:
        raise ConfigError(f"--seeds {shown}: use non-negative integers")
    return seeds


def seed_folder(output: str, seed: int) -> str:
    """Where seed ``seed`` of a pack whose results folder is ``output`` writes its results."""
    return os.path.join(output, f"seed-{seed}")


def seed_configs(
    method: str | Method,
    options: dict,
    seeds: str | Iterable[int],
    *,
    presets: bool = False,
    model_presets: bool = True,
    arrays=None,
    announce: Callable[[str], None] | None = None,
) -> list[JobConfig]:
    """One resolved config per seed (``jobs.build.build_config`` of ``options`` with the seed and its folder), checked
    as a pack; ``options`` as the build takes them (``output``: the pack's folder, default a new one as a job's).
    ``arrays``: a user's data, saved once in the pack's folder. ``announce`` gets the presets' lines once.
    ``ConfigError`` naming the fix, before any process starts."""
    seeds = parse_seeds(seeds)
    given = [
        flag for name, flag in REFUSED_WITH.items() if options.get(name) is not None and options[name] is not False
    ]
    if given:
        raise ConfigError(
            f"--seeds with {', '.join(given)}: a pack runs each seed as a new run of its own; leave out "
            f"{', '.join(given)}"
        )
    pack = checked_config(method, options, presets=presets, model_presets=model_presets, arrays=arrays)
    output = pack.run.output
    if arrays is not None:  # every seed reads the one dataset.npz (a pack shares its dataset)
        options = dict(options, dataset=pack.data.dataset)
    cfgs, lines = [], []  # the presets' lines are said once every check has passed
    for i, seed in enumerate(seeds):
        one = dict(options, seed=seed, output=seed_folder(output, seed))
        say = lines.append if i == 0 else None
        cfgs.append(build_config(method, one, presets=presets, model_presets=model_presets, announce=say))
    check_pack(cfgs)
    for line in lines if announce is not None else ():
        announce(line)
    return cfgs


@dataclass(frozen=True)
class SeedsResult:
    """Attributes:
    exit_code: the highest of the seeds' (``seed_exit_code``): 0 every seed completed, 1 the job ended with an
        error or a seed ended early (the table says which), 2 refused.
    output: the pack's folder (each seed's results in ``seed-N`` inside it).
    runs: each seed's ``RunResult`` (its folder and ``metrics.json``), in the seeds' order.
    """

    exit_code: int
    output: str
    runs: dict[int, RunResult]

    @property
    def final_accuracies(self) -> dict[int, float | None]:
        return {seed: r.final_accuracy for seed, r in self.runs.items()}

    @property
    def mean(self) -> float | None:
        """The mean of the seeds' final accuracies (None unless every seed has one)."""
        values = self._values()
        return statistics.mean(values) if values else None

    @property
    def std(self) -> float | None:
        """Their standard deviation over the seeds (the sample's, ``statistics.stdev``, as the sweep's)."""
        values = self._values()
        return statistics.stdev(values) if values else None

    def _values(self) -> list[float] | None:
        values = list(self.final_accuracies.values())
        return values if len(values) >= 2 and None not in values else None


def run_pack_results(
    cfgs: list[JobConfig],
    verbose: bool = False,
    kind: str = KIND_RUNS,
    labels: list[str] | None = None,
    at_once: int = 0,
) -> tuple[int, list[RunResult]]:
    """Run resolved configs as one job and read back each run's results: the pack's exit code and each run's
    ``RunResult``, its exit code the one its run alone would give (``seed_exit_code``), in the configs' order.
    ``kind``, ``labels`` and ``at_once``: ``jobs.run.pack.run_pack``'s."""
    from jobs.run.pack import run_pack  # torch and NVFlare's job API: after every check
    from jobs.run.results import RunResult, read_metrics

    code = run_pack(cfgs, verbose=verbose, kind=kind, labels=labels, at_once=at_once)
    results = []
    for c in cfgs:
        metrics = read_metrics(c.output_dir)
        results.append(RunResult(seed_exit_code(code, metrics), c.output_dir, metrics))
    return code, results


def run_seeds(cfgs: list[JobConfig], verbose: bool = False) -> SeedsResult:
    """Run ``seed_configs``' configs as one job and read back each seed's results."""
    _, results = run_pack_results(cfgs, verbose=verbose, kind=KIND_SEEDS, labels=[str(c.run.seed) for c in cfgs])
    runs = {c.run.seed: r for c, r in zip(cfgs, results, strict=True)}
    return SeedsResult(max(r.exit_code for r in runs.values()), os.path.dirname(cfgs[0].output_dir), runs)


def seed_exit_code(pack_code: int, metrics: dict) -> int:
    """A seed's exit code, as its run alone would give it for how it ended: the pack's when the job failed or was
    refused, else 0 when the seed's outcome (``metrics.json``) is ``completed`` and 1 when it ended early."""
    if pack_code:
        return pack_code
    return 0 if (metrics.get("outcome") or {}).get("status") == "completed" else 1


def mean_std(values: list[float]) -> str:
    """``0.4512 +- 0.0123``: the mean and the sample standard deviation of two values or more, as every table of
    repeated seeds shows them (this one's and the sweep's, ``jobs.sweep.report``)."""
    return f"{statistics.mean(values):.4f} +- {statistics.stdev(values):.4f}"


def seeds_table(result: SeedsResult) -> str:
    """Each seed's final accuracy, versions evaluated, outcome and folder, then the mean +- std of the final
    accuracies."""
    rows = [result_row("seed", "final accuracy", "evaluated", "outcome", "results", width=6)]
    rows += [result_line(str(seed), r, width=6) for seed, r in result.runs.items()]
    values = [a for a in result.final_accuracies.values() if a is not None]
    if result.mean is not None:
        rows.append(f"final accuracy, mean +- std over {len(values)} seeds: {mean_std(values)}")
    else:
        missing = ", ".join(str(s) for s, a in result.final_accuracies.items() if a is None)
        rows.append(f"final accuracy: no mean +- std (seed(s) {missing} evaluated no version)")
    return "\n".join(rows)


def result_row(label: str, accuracy: str, evaluated: str, outcome: str, folder: str, width: int) -> str:
    """One row of a pack's table (``seeds_table``, ``jobs.pack_runs.runs_table``): the run's label in ``width``."""
    return f"{label:<{width}} {accuracy:<15} {evaluated:<9} {outcome:<12} {folder}"


def result_line(label: str, r: RunResult, width: int) -> str:
    """A run's row: its final accuracy, versions evaluated, outcome (or why none) and results folder."""
    accuracy = f"{r.final_accuracy:.4f}" if r.final_accuracy is not None else "-"
    outcome = (r.outcome or {}).get("status") or ("no metrics.json" if not r.metrics else "-")
    return result_row(label, accuracy, str(len(r.accuracies)), outcome, r.output, width)
