"""``python -m jobs.sweep SPEC [flags]`` runs (or continues) a sweep; ``python -m jobs.sweep show DIR`` prints a
sweep's table, best command and cells again and redraws its plots. Every refusal is one line and exit 2, before
any trial starts."""

from __future__ import annotations

import argparse
import os
import sys
import typing

import optuna

from jobs.sweep import study as studies
from jobs.sweep.report import format_report, objective_words, write_plots
from jobs.sweep.runner import Sweep, SweepOptions
from jobs.sweep.spec import SpecError, budget_note, load_spec, parse_spec
from jobs.sweep.tracking import tracking_lines


class SweepParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> SweepParser:
    p = SweepParser(prog="python -m jobs.sweep", description=(__doc__ or "").replace("``", ""))
    p.add_argument("spec", help="the sweep's YAML spec (docs/sweeps.md), or 'show' followed by a sweep's folder")
    p.add_argument("folder", nargs="?", help="with show: the sweep's folder")
    p.add_argument("--output", default=None, help="the sweep's folder (default WORKSPACE/sweeps/<spec name>)")
    p.add_argument("--storage", default=None, help="SQLAlchemy URL of the study (default: sqlite:///<folder>/study.db)")
    p.add_argument("--parallel", type=int, default=None, help="trials at once (default: planned from the cores)")
    p.add_argument(
        "--pruner",
        default="hyperband",
        choices=studies.PRUNERS,
        help="the pruning rule (with --patience N >= 1, wrapped in Optuna's PatientPruner)",
    )
    p.add_argument(
        "--min-resource", type=float, default=0.0, help="simulated seconds before a trial may be pruned (default 0)"
    )
    p.add_argument(
        "--patience",
        type=int,
        default=0,
        help="wrap the pruner in Optuna's PatientPruner: N steps without improvement first (0: the rule alone)",
    )
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    p.add_argument("--no-bar", dest="bar", action="store_false", help="no progress bar")
    p.add_argument(
        "--tensorboard",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="also write each trial's curves and hyperparameters under one TensorBoard log dir (default DIR: "
        "<folder>/tensorboard), for the HParams tab",
    )
    p.add_argument(
        "--deployment",
        default=None,
        metavar="DIR",
        help="run each trial as a job on this running deployment (python -m jobs.deploy up DIR; or an admin's "
        "startup kit) instead of a fresh SimEnv each",
    )
    p.add_argument(
        "--pack",
        type=int,
        default=SweepOptions.pack,
        metavar="N",
        help="runs sharing one job: a candidate's repeated seeds (repeat: {seed: [..]}), N at most a job (default: "
        "all of them); without repeat, N trials at a time a job, each pruned alone (default: each its own job); "
        "1: each run its own job, as without packs",
    )
    p.add_argument(
        "--pack-queue",
        type=int,
        default=SweepOptions.pack_queue,
        metavar="Q",
        help="with --pack N for trials: Q more of the study's next trials go in each job, waiting; when a trial "
        "ends or is pruned the next joins the running job, so its start-up is paid once (default: N; 0: none). "
        "They are asked when the job starts, so they are sampled without its trials' results",
    )
    return p


def show(folder: str, storage: str | None) -> int:
    folder = os.path.abspath(os.path.expanduser(folder))
    spec_path = os.path.join(folder, "spec.yaml")
    if not os.path.exists(spec_path):
        raise SpecError(f"{folder} holds no sweep (no spec.yaml); give the folder a sweep wrote")
    with open(spec_path) as f:
        spec = parse_spec(f.read(), os.path.basename(folder.rstrip(os.sep)))
    stored = studies.open_storage(studies.storage_url(folder, storage))
    names = [s.study_name for s in optuna.study.get_all_study_summaries(stored, include_best_trial=False)]
    name = next((n for n in names if n.endswith(f"-{spec.digest}")), None)
    if name is None:
        raise SpecError(f"no study of this spec in {studies.storage_url(folder, storage)}; give its --storage URL")
    study = optuna.load_study(study_name=name, storage=stored)
    print(format_report(study, folder, objective_words(spec)))
    for path in write_plots(study, folder, spec):
        print(f"[sweep] plot: {path}")
    for line in tracking_lines(study, spec):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the bar and the table say what happened
    try:
        if args.spec == "show":
            if not args.folder:
                raise SpecError("show needs the sweep's folder: python -m jobs.sweep show DIR")
            return show(args.folder, args.storage)
        if args.folder:
            raise SpecError(f"{args.folder}: a sweep takes one spec; give its folder with --output")
        opts = SweepOptions(
            output=args.output,
            storage=args.storage,
            parallel=args.parallel,
            pruner=args.pruner,
            min_resource=args.min_resource,
            patience=args.patience,
            seed=args.seed,
            bar=args.bar,
            tensorboard=args.tensorboard,
            deployment=args.deployment,
            pack=args.pack,
            pack_queue=args.pack_queue,
        )
        if opts.parallel is not None and opts.parallel < 1:
            raise SpecError(f"--parallel {opts.parallel}: 1 or more trials at once")
        sweep = Sweep(load_spec(args.spec), opts)
        sweep.prepare()
    except SpecError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    if note := budget_note(sweep.spec):
        print(f"[sweep] {note}")
    code = sweep.run()
    print(format_report(sweep.study, sweep.folder, objective_words(sweep.spec)))
    plots = write_plots(sweep.study, sweep.folder, sweep.spec)
    for path in plots:
        print(f"[sweep] plot: {path}")
    sweep.tracking.finish(sweep.study, plots, interrupted=code != 0)
    for line in tracking_lines(sweep.study, sweep.spec):
        print(line)
    return code
