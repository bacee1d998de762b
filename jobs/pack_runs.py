"""Runs of different flags as one NVFlare job (a pack, ``docs/packs.md``): a job script's ``--runs FILE``.

``FILE`` is a JSON object, one entry per run: its name and its flags (``{"lr-0.01": {"lr": 0.01}, "lr-0.1":
{"lr": 0.1}}``, each flag as a sweep spec writes it: ``true`` an on switch, ``false`` its ``--no-`` form). Each run is
the command line with its own flags written after it (they win), its results in ``OUTPUT/NAME`` unless its flags
give its ``output``. A sweep packs its trials so (``jobs.sweep.pack``): a learning-rate search's trials then share
one job's start-up and the leaves' vectorised steps. Before any process starts the file is read and checked, each
run's config built (``jobs.build``) and the configs checked as a pack (``jobs.pack_check``): a refusal is one
``ConfigError`` naming the fix. ``run_runs`` runs the pack and returns each run's ``RunResult``, and ``runs_table``
is what the job script prints at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.choices import ConfigError
from common.config_flags import flag_args
from jobs.build import build_config, checked_config
from jobs.config import JobConfig
from jobs.pack_check import check_pack
from jobs.run.pack_folder import KIND_RUNS
from jobs.seeds import REFUSED_WITH, result_line, result_row, run_pack_results

if TYPE_CHECKING:
    from jobs.run.results import RunResult

RUNS_HELP = (
    "run the runs of this JSON file ({NAME: {flag: value}}, at least two) as ONE NVFlare job (a pack, docs/packs.md): "
    "each the command line with its own flags after it, its results in OUTPUT/NAME; then each run's final accuracy"
)
"""The help of the job scripts' ``--runs`` flag (``jobs.cli``)."""

RUNS_AT_ONCE_HELP = (
    "with --runs: K of its runs go at a time, in the file's order; when one ends (or a sweep prunes it) the next "
    "joins the running job, so the job's start-up is paid once (default: all at once)"
)
"""The help of the job scripts' ``--runs-at-once`` flag (``jobs.cli``)."""

NAME = re.compile(r"^[A-Za-z0-9][\w.=+-]*$")
"""A run's name: its results folder's name inside the pack's folder."""

NOT_PER_RUN = ("runs", "seeds", *(name for name in REFUSED_WITH if name != "seed"))
"""Flags a run of ``--runs`` may not carry: a run is one new run (no pack inside it, no resume, no dry run); its
``seed`` it may."""


def read_runs(path: str) -> Any:
    """What a ``--runs`` file holds (``run_configs`` checks it). ``ConfigError`` naming the fix."""
    try:
        with open(os.path.expanduser(path)) as f:
            return json.load(f)
    except OSError as ex:
        raise ConfigError(f"--runs {path}: cannot read it ({ex.strerror}); give a JSON file's path") from None
    except ValueError as ex:
        raise ConfigError(f"--runs {path}: not JSON ({ex}); write {{NAME: {{flag: value}}, ...}}") from None


def checked_runs(runs, where: str, mark: str) -> dict[str, dict]:
    """``runs`` if they are a pack's runs (at least two, each a folder's name and a mapping of its settings, none
    of ``NOT_PER_RUN``), else ``ConfigError`` naming the fix; ``where`` and ``mark`` (``--`` for a flag, "" for an
    option) say where they came from."""
    if not isinstance(runs, dict) or not all(isinstance(flags, dict) for flags in runs.values()):
        raise ConfigError(f"{where}: write a JSON object of runs, {{NAME: {{flag: value}}, ...}}")
    if len(runs) < 2:
        raise ConfigError(f"{where}: a pack needs at least 2 runs; for one, give its settings as a single run's")
    for name, flags in runs.items():
        if not isinstance(name, str) or not NAME.match(name):
            raise ConfigError(f"{where}: run name {name!r}: use letters, digits and . _ = + - (a folder's name)")
        refused = [f for f in flags if f.replace("_", "-") in {n.replace("_", "-") for n in NOT_PER_RUN}]
        if refused:
            raise ConfigError(
                f"{where}: run {name} gives {mark}{refused[0]}: a run of a pack is one new run; leave it out"
            )
    return runs


def option_configs(
    method,
    options: dict,
    runs: dict[str, dict],
    *,
    presets: bool = False,
    model_presets: bool = True,
    arrays=None,
    announce: Callable[[str], None] | None = None,
) -> list[JobConfig]:
    """``jobs.api.run(..., runs={NAME: {option: value}})``: one resolved config per run, ``options`` with the run's
    after them (they win), results in ``output/NAME`` unless the run gives ``output``; ``arrays``: a user's data,
    saved once in the pack's folder. Checked as a pack; ``ConfigError`` naming the fix, before any process starts."""
    runs = checked_runs(runs, "runs=", "")
    _refuse_beside("runs=", options)
    pack = checked_config(method, options, presets=presets, model_presets=model_presets, arrays=arrays)
    if arrays is not None:  # every run reads the one dataset.npz (a pack shares its dataset)
        options = dict(options, dataset=pack.data.dataset)
    return _built(
        "runs=", runs, lambda own: (method, options | dict(own)), pack.run.output, presets, model_presets, announce
    )


def run_configs(
    parse: Callable[[list[str]], argparse.Namespace],
    resolve: Callable[[argparse.Namespace], tuple[str, dict]],
    argv: list[str],
    runs: dict[str, dict],
    where: str,
    *,
    presets: bool = False,
    announce: Callable[[str], None] | None = None,
) -> list[JobConfig]:
    """One resolved config per run of ``runs`` (a ``--runs`` file's, ``read_runs``; ``where`` names them in a
    refusal): ``parse`` reads a command line (the job script's parser), ``resolve`` gives a parsed one's method and
    its options for the build; each run's command line is ``argv`` with its flags after it. Checked as a pack.
    ``ConfigError`` naming the fix, before any process starts."""
    runs = checked_runs(runs, where, "--")
    method, base = resolve(parse(argv))
    _refuse_beside("--runs", base)
    output = checked_config(method, base, presets=presets).run.output
    return _built(
        where, runs, lambda flags: resolve(parse([*argv, *flag_args(flags)])), output, presets, True, announce
    )


def _refuse_beside(what: str, options: dict) -> None:
    """``ConfigError`` when ``options`` hold one of ``REFUSED_WITH`` (but ``seed``): each run of a pack is new."""
    given = [flag for name, flag in REFUSED_WITH.items() if options.get(name) not in (None, False) and name != "seed"]
    if given:
        raise ConfigError(f"{what} with {', '.join(given)}: a pack runs each run as a new run; leave out {given[0]}")


def _built(
    where: str,
    runs: dict[str, dict],
    make: Callable[[dict], tuple[str, dict]],
    output: str,
    presets: bool,
    model_presets: bool,
    announce: Callable[[str], None] | None,
) -> list[JobConfig]:
    """Each run's resolved config: ``make`` gives its method and options from its own settings; its results in
    ``output/NAME`` unless it gives ``output``, no two runs in one folder; a refusal names the run, and the pack
    check's names the runs as ``runs`` does. The presets' lines go to ``announce`` once every check has passed."""
    cfgs, lines, folders = [], [], {}
    for i, (name, own) in enumerate(runs.items()):
        try:
            method, options = make(own)
            options["output"] = own.get("output") or os.path.join(output, name)
            folder = os.path.abspath(os.path.expanduser(options["output"]))
            if folder in folders:
                raise ConfigError(f"its results folder {folder} is run {folders[folder]}'s; give each its own output")
            folders[folder] = name
            say = lines.append if i == 0 else None
            cfgs.append(build_config(method, options, presets=presets, model_presets=model_presets, announce=say))
        except ConfigError as ex:
            raise ConfigError(f"{where}: run {name}: {ex}") from None
    try:
        check_pack(cfgs)
    except ConfigError as ex:  # the check numbers the runs: name them as the caller did
        names = list(runs)
        raise ConfigError(re.sub(r"\brun (\d+)\b", lambda m: f"run {names[int(m.group(1))]}", str(ex))) from None
    for line in lines if announce is not None else ():
        announce(line)
    return cfgs


@dataclass(frozen=True)
class RunsResult:
    """Attributes:
    exit_code: the highest of the runs' (each the one its run alone would give: 0 completed, 1 the job ended with
        an error or the run ended early, 2 refused).
    runs: each run's ``RunResult`` (its folder and ``metrics.json``) by its name, in the runs' order.
    """

    exit_code: int
    runs: dict[str, RunResult]


def run_runs(
    cfgs: list[JobConfig], names: list[str] | None = None, verbose: bool = False, at_once: int = 0
) -> RunsResult:
    """Run ``run_configs``' (or ``option_configs``') configs as one job; ``names``: the runs' (default their
    folders' names); ``at_once``: runs going at a time, in order, each later one joining the job when one ends
    (0: all from the start)."""
    names = names or [os.path.basename(c.output_dir) for c in cfgs]
    _, results = run_pack_results(cfgs, verbose=verbose, kind=KIND_RUNS, labels=names, at_once=at_once)
    return RunsResult(max(r.exit_code for r in results), dict(zip(names, results, strict=True)))


def runs_table(result: RunsResult) -> str:
    """Each run's name, final accuracy, versions evaluated, outcome and results folder."""
    rows = [result_row("run", "final accuracy", "evaluated", "outcome", "results", width=16)]
    return "\n".join(rows + [result_line(name, r, width=16) for name, r in result.runs.items()])
