"""FedAvg vs FedBuff vs FedRevive as the FedRevive paper compares them: the same simulated-time budget, several
seeds, on exact simulated time.

Every (method, seed) is one ``jobs/pt_job_fedrevive.py --method M --seed S --max-sim-time BUDGET`` run in its own
process and results folder: each method gets the same simulated time (updates arriving later are not applied) and
makes as many versions as it can within it. Two scales:

* ``paper``: the run behind NVIDIA's table (R2's README, seed 10: FedAvg 0.402, FedBuff 0.611, FedRevive 0.761
  after 200 time units), in R2's "continuous" mode: FedRevive synthesises on every eligible stale update
  (``--fr-synth-every-versions 1``) with the devices' true class proportions. CIFAR-10 on the references' data
  (their std, their 37,500 training images, their rounded Dirichlet counts dealt from class pools), the paper's
  ResNet-18 (statistic trackers, no normalisation), 1,000 devices x 350 samples, Dirichlet 0.5, K = 100, Adam 3e-4
  for 25 x 32 with the references' crop-and-flip augmentation, the paper's delays, 200 time units. It needs
  CIFAR-10 under ``--data-root`` and a GPU. ``--variant paper-aligned`` is R2's other mode: synthesis every 10
  versions with estimated class proportions (64 probe images, R2's count).
* ``cpu``: the calibrated hard generated data (``--synthetic-difficulty 1``), cifar10_convnet, 2 x 100 devices x
  100 samples, K = 20, 25 local Adam steps at 1e-3 (the paper's 3e-4 learned nothing within the budget), the
  paper's delays, 40 time units (about 10 minutes per seed on 2 cores, most of it FedRevive's server work);
  FedRevive at its defaults except ``s_max`` = 75 x K / 100 (staleness grows with the devices in flight): true
  class proportions with synthesis every 10 versions, a mode of neither reference (R2 pairs 10 with estimated
  proportions), kept so the cpu table stays comparable with earlier rounds and 10x cheaper on 2 cores.
  Without the references' crop-and-flip augmentation: the generated classes are not mirror-symmetric, and a
  mirrored sample is no sample of its class (centralised, 400 steps: test accuracy 0.55 without, 0.29 with).

Evaluation, as both references do it: every version for a synchronous method (FedAvg), every 10 versions for
an asynchronous one (and always the last), so the time-to-accuracy columns mean the same for every method.

A run that ends before the budget all the same (it stopped, or a ``--max-model-version`` given after ``--`` ended
it) is no comparison at the budget: the table's "reached the budget" column counts the runs that did, and a line
under it names each that did not, with why (``jobs.sweep.objective.ended_early``, the sweep's own check).

``--methods`` takes the built-in names and any user method by import path (``fedasync:FedAsync``, importable
through ``PYTHONPATH``, as ``--method`` takes it; its folder and row are named by its class). Any other job flag
after ``--`` is passed to every run and wins. Writes to ``--output``: ``results.md`` (mean +-
std over seeds of the final and best accuracy, and the simulated time to reach 0.5 / 0.6 / 0.7, with how many
seeds reached it), ``accuracy_vs_simtime.png`` (mean with a +-1 std band), ``staleness.png`` (tau of every applied
update per method, and FedRevive's beta), ``commands.txt``, and one folder per run. A run whose folder already
holds a finished ``metrics.json`` is not run again, and one interrupted after a checkpoint continues from it
(``--resume``): an interrupted sweep continues where it stopped.

``--sweep`` runs the same grid as a sweep (``python -m jobs.sweep``, docs/sweeps.md): the spec ``sweep_spec``
writes (``OUTPUT/reproduce.yaml``: the scale's flags as its base, methods x seeds as its grid, each method's own
flags under ``when``) in ``OUTPUT/sweep``, its trials packed onto the cores and resumable with the same command;
then the same table and plots from its trials. ``--write-spec PATH`` only writes that spec; ``--from-sweep DIR``
prints the table of a sweep run from it.

``--dry-run`` runs nothing: it prints each run's command and the FedRevive settings the job resolves from it, and
with ``--trace`` computes each run's event trace (the job's own ``--dry-run``) and counts the versions and stale
updates within the budget, the inputs of a GPU-hour estimate (``GPU_FIX_NOTES.md``).

    python benchmarks/repro/reproduce_fedrevive.py --scale cpu --seeds 0,1,2 [--sweep]

Over 400 lines: one script for one table, its grid run one job at a time or as a sweep, and the table and plots
both give; split, the grid's flags and their spec would live apart.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)  # benchmarks.repro.r2_table, jobs, when the project is not installed

from benchmarks.lib.scales import SCALES, resolved_config  # noqa: E402
from benchmarks.repro.r2_table import beside_r2, trace_counts  # noqa: E402
from common.result_files import EVENTS, METRICS  # noqa: E402
from jobs.sweep.objective import ended_early  # noqa: E402
from jobs.sweep.spec import LIFTED_VERSION_CAP, Objective  # noqa: E402

METHODS = ("fedavg", "fedbuff", "fedrevive")
THRESHOLDS = (0.5, 0.6, 0.7)
MANY_VERSIONS = LIFTED_VERSION_CAP  # the time budget ends a run, not a version count (as in a sweep)


# -- pure parts (unit-tested) ---------------------------------------------------------------------------------
def time_to(records: list[dict], threshold: float) -> float | None:
    """Simulated seconds of the first evaluated version at or above ``threshold`` accuracy (None: never)."""
    return next((r["sim_seconds"] for r in records if r["accuracy"] >= threshold), None)


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f}"


def summary_row(method: str, runs: list[list[dict]], early: int = 0) -> dict:
    """One table row from a method's runs (each the ``versions`` of its ``metrics.json``); ``early``: how many of
    them ended before the budget (``jobs.sweep.objective.ended_early``)."""
    row = {
        "method": method,
        "seeds": len(runs),
        "final accuracy": mean_std([r[-1]["accuracy"] for r in runs if r]),
        "best accuracy": mean_std([max(v["accuracy"] for v in r) for r in runs if r]),
        "versions": mean_std([float(r[-1]["version"]) for r in runs if r]).replace(".000", ""),
    }
    for t in THRESHOLDS:
        reached = [s for s in (time_to(r, t) for r in runs) if s is not None]
        row[f"time to {t}"] = f"{mean_std(reached)} ({len(reached)}/{len(runs)})"
    row["reached the budget"] = f"{len(runs) - early}/{len(runs)}" + (" !" if early else "")
    return row


def markdown(rows: list[dict]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def on_grid(records: list[dict], grid: list[float]) -> list[float | None]:
    """The accuracy of the last version evaluated at or before each grid time (None before the first)."""
    out, i, last = [], 0, None
    for t in grid:
        while i < len(records) and records[i]["sim_seconds"] <= t:
            last = records[i]["accuracy"]
            i += 1
        out.append(last)
    return out


# -- running --------------------------------------------------------------------------------------------------
def job_command(
    method: str, seed: int, scale: str, budget: float, out: str, extra: list[str], variant: str = ""
) -> list[str]:
    """One run's command: the scale's flags, the method's own ones at this scale and in ``variant`` (later flags
    win), a synchronous method's evaluation of every version, the budget, then ``extra``."""
    sys.path.insert(0, REPO)  # jobs.methods, when the project is not installed
    from jobs.methods import method_of

    every_version = ["--eval-frequency", "1"] if method_of(method).synchronous else []
    return [
        sys.executable,
        os.path.join(REPO, "jobs", "pt_job_fedrevive.py"),
        "--method",
        method,
        "--seed",
        str(seed),
        *SCALES[scale]["flags"],
        *SCALES[scale].get("method_flags", {}).get(method, []),
        *(SCALES[scale]["variants"][variant].get(method, []) if variant else []),
        *every_version,
        "--max-sim-time",
        str(budget),
        "--max-model-version",
        str(MANY_VERSIONS),
        "--output",
        out,
        "--workspace",
        os.path.join(out, "..", "ws"),
        *extra,
    ]


def method_labels(methods: list[str]) -> dict[str, str]:
    """``--methods`` values -> the name of their folders and rows: a built-in's name, a user method's class name
    in lower case; ``ValueError`` naming the fix for a method that cannot be found or two with one name."""
    sys.path.insert(0, REPO)  # jobs.methods, when the project is not installed
    from common.choices import ConfigError
    from jobs.methods import method_of

    labels = {}
    for m in methods:
        try:
            labels[m] = method_of(m).short_name
        except ConfigError as ex:
            raise ValueError(str(ex)) from ex
    if len(set(labels.values())) < len(labels):
        raise ValueError(f"--methods {','.join(methods)}: two methods share a name; give each class its own")
    return labels


def finished(metrics_path: str) -> bool:
    """A run that ended with an outcome (its budget or its last version), so the sweep need not run it again."""
    try:
        with open(metrics_path) as f:
            return json.load(f).get("outcome", {}).get("status") == "completed"
    except (OSError, ValueError):
        return False


def resume_flags(out: str) -> list[str]:
    """``--resume OUT`` for a run that was interrupted after its first checkpoint, else nothing."""
    sys.path.insert(0, REPO)
    from scheduling.checkpoint import state_path

    checkpointed = os.path.exists(os.path.join(out, METRICS)) and os.path.exists(state_path(out))
    return ["--resume", out] if checkpointed else []


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot(
    curves: dict[str, list[list[dict]]], budget: float, staleness: dict[str, list[int]], betas: list[float], output: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    grid = list(np.linspace(0, budget, 200))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, runs in curves.items():
        series = [on_grid(r, grid) for r in runs]
        points = [(t, [s[i] for s in series if s[i] is not None]) for i, t in enumerate(grid)]
        points = [(t, v) for t, v in points if len(v) == len(series)]
        if not points:
            continue
        t = [p[0] for p in points]
        mean = np.array([np.mean(v) for _, v in points])
        std = np.array([np.std(v) for _, v in points])
        ax.plot(t, mean, label=f"{method} ({len(runs)} seeds)")
        ax.fill_between(t, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("simulated time")
    ax.set_ylabel("test accuracy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(output, "accuracy_vs_simtime.png"), dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method, taus in staleness.items():
        if taus:
            axes[0].hist(taus, bins=40, alpha=0.5, label=method)
    axes[0].set_xlabel("staleness tau of each applied update")
    axes[0].legend()
    if betas:
        axes[1].hist(betas, bins=40, color="tab:green")
    axes[1].set_xlabel("FedRevive beta(tau) of each distilled update")
    fig.tight_layout()
    fig.savefig(os.path.join(output, "staleness.png"), dpi=120)
    plt.close(fig)


def words_to_flags(words: list[str]) -> dict:
    """Job command-line words as a sweep spec's flags: ``--name value``, or ``--name`` alone (a switch: True)."""
    flags, i = {}, 0
    while i < len(words):
        name = words[i].lstrip("-")
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            flags[name], i = words[i + 1], i + 2
        else:
            flags[name], i = True, i + 1
    return flags


def sweep_spec(
    scale: str, methods: list[str], seeds: list[int], budget: float, extra: list[str], variant: str = "", ws: str = ""
) -> str:
    """The grid ``job_command`` runs, as a sweep spec (YAML): the same flags for every (method, seed), ``extra``
    winning as it does on the command line."""
    import yaml

    from jobs.methods import method_of

    given = words_to_flags(extra)
    base = words_to_flags(SCALES[scale]["flags"]) | {"max-sim-time": budget}  # the sweep lifts the version cap
    base |= ({"workspace": ws} if ws else {}) | given
    when = {}
    for m in methods:
        words = SCALES[scale].get("method_flags", {}).get(m, [])
        words += SCALES[scale]["variants"][variant].get(m, []) if variant else []
        own = words_to_flags(words) | ({"eval-frequency": 1} if method_of(m).synchronous else {})
        own = {k: v for k, v in own.items() if k not in given}
        if own:
            when[m] = own
    spec = {"base": base, "grid": {"method": methods, "seed": seeds}}
    spec |= {"when": {"method": when}} if when else {}
    spec["objective"] = {"metric": "accuracy_at", "budget": budget}
    return yaml.safe_dump(spec, sort_keys=False)


def sweep_runs(folder: str) -> list[tuple[str, int, str, str]]:
    """A sweep's completed trials as (method, seed, results folder, command), from its study."""
    import optuna
    from optuna.trial import TrialState

    storage = f"sqlite:///{os.path.join(folder, 'study.db')}"
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(states=(TrialState.COMPLETE,))
    return [
        (
            t.params["method"],
            int(t.params["seed"]),
            os.path.join(folder, t.user_attrs["folder"]),
            t.user_attrs["command"],
        )
        for t in trials
    ]


def dry_run_one(method: str, seed: int, cmd: list[str], budget: float, out: str, trace: bool) -> None:
    """``--dry-run``: print the command and the settings it resolves to; with ``trace``, the job's own dry run
    (its event trace, on generated data: the schedule does not depend on the images) and its counts."""
    cfg = resolved_config(cmd)
    print(f"[reproduce] {method} seed {seed}: {shlex.join(cmd)}")
    settings = cfg.method_settings.to_dict() if cfg.method_settings is not None else {}
    print(json.dumps({"data": cfg.data.to_dict(), "federation": cfg.federation.to_dict(), method: settings}))
    if trace:
        os.makedirs(out, exist_ok=True)
        subprocess.run([*cmd, "--dry-run", "--dataset", "synthetic"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        print(f"[reproduce] {method} seed {seed} trace: {json.dumps(trace_counts(os.path.join(out, EVENTS), budget))}")


def main(argv: list[str] | None = None) -> int:
    from fedrevive.config import LOG_FILE as FEDREVIVE_LOG

    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help="built-in names or import paths package.module:Name, comma-separated",
    )
    p.add_argument("--budget", type=float, default=None, help="simulated time units (default: the scale's)")
    p.add_argument("--output", default="", help="results folder (default: a new temporary one)")
    p.add_argument("--variant", default="", help="a named variant of the scale (paper: paper-aligned)")
    p.add_argument("--sweep", action="store_true", help="run the grid as a sweep (python -m jobs.sweep)")
    p.add_argument("--write-spec", default="", metavar="PATH", help="write the grid as a sweep spec; run nothing")
    p.add_argument("--from-sweep", default="", metavar="DIR", help="the table of a sweep run from --write-spec's spec")
    p.add_argument("--dry-run", action="store_true", help="print each run's command and settings; run nothing")
    p.add_argument("--trace", action="store_true", help="with --dry-run: count each run's versions and updates")
    args = p.parse_args(argv)
    if args.variant and args.variant not in SCALES[args.scale].get("variants", {}):
        p.error(
            f"--variant {args.variant}: the {args.scale} scale has {sorted(SCALES[args.scale].get('variants', {}))}"
        )
    seeds = [int(s) for s in args.seeds.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    try:
        labels = method_labels(methods)
    except ValueError as ex:
        p.error(str(ex))
    budget = args.budget or SCALES[args.scale]["budget"]
    output = os.path.abspath(args.output or f"reproduce_fedrevive-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(output, exist_ok=True)

    curves: dict[str, list[list[dict]]] = {labels[m]: [] for m in methods}
    staleness: dict[str, list[int]] = {labels[m]: [] for m in methods}
    betas: list[float] = []
    early: dict[str, list[str]] = {labels[m]: [] for m in methods}  # runs that ended before the budget, and why

    def collect(method: str, out: str) -> None:
        with open(os.path.join(out, METRICS)) as f:
            metrics = json.load(f)
        if why := ended_early(Objective("accuracy_at", budget=budget), metrics):
            early[method].append(f"{method} seed {metrics['config']['run']['seed']}: {why}")
            print(f"[reproduce] ! {early[method][-1]}", flush=True)
        curves[method].append([r for r in metrics.get("versions", []) if r["sim_seconds"] <= budget])
        staleness[method].extend(e["tau"] for e in read_jsonl(os.path.join(out, EVENTS)))
        betas.extend(e["beta"] for e in read_jsonl(os.path.join(out, FEDREVIVE_LOG)) if e["beta"] > 0)

    if args.write_spec or args.sweep:
        spec = args.write_spec or os.path.join(output, "reproduce.yaml")
        with open(spec, "w") as f:
            f.write(sweep_spec(args.scale, methods, seeds, budget, extra, args.variant, os.path.join(output, "ws")))
        print(f"[reproduce] the grid as a sweep spec: {spec}")
        if args.write_spec:
            return 0
        args.from_sweep = os.path.join(output, "sweep")
        cmd = [sys.executable, "-m", "jobs.sweep", spec, "--output", args.from_sweep, "--pruner", "none", "--no-bar"]
        print(f"[reproduce] {shlex.join(cmd)}", flush=True)
        if subprocess.run(cmd, cwd=REPO).returncode != 0:
            return 1
    with open(os.path.join(output, "commands.txt"), "w") as commands:
        found = {(m, seed): (out, c) for m, seed, out, c in sweep_runs(args.from_sweep)} if args.from_sweep else {}
        for option in methods if args.from_sweep else []:
            for seed in seeds:
                if (option, seed) in found:
                    collect(labels[option], found[(option, seed)][0])
                    commands.write(found[(option, seed)][1] + "\n")
                else:
                    print(f"[reproduce] {option} seed {seed}: no completed trial in {args.from_sweep}")
        for seed in seeds if not args.from_sweep else []:
            for option in methods:
                method = labels[option]
                out = os.path.join(output, f"{method}-seed{seed}", "out")
                cmd = job_command(option, seed, args.scale, budget, out, extra, args.variant)
                commands.write(shlex.join(cmd) + "\n")
                if args.dry_run:
                    dry_run_one(method, seed, cmd, budget, out, args.trace)
                    continue
                metrics_path = os.path.join(out, METRICS)
                started, code = time.time(), 0
                if finished(metrics_path):
                    print(f"[reproduce] {method} seed {seed}: already finished in {out}", flush=True)
                else:
                    print(f"[reproduce] {method} seed {seed} ...", flush=True)
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    cmd += resume_flags(out)  # an interrupted run continues from its last checkpoint
                    with open(os.path.join(os.path.dirname(out), "job.log"), "a") as log:
                        code = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
                if not os.path.exists(metrics_path):
                    print(f"[reproduce] {method} seed {seed} wrote no metrics.json (exit {code}); see its job.log")
                    return 1
                collect(method, out)
                last = curves[method][-1][-1] if curves[method][-1] else {}
                print(
                    f"[reproduce] {method} seed {seed}: exit {code}, version {last.get('version')}, accuracy "
                    f"{last.get('accuracy')}, {time.time() - started:.0f} s",
                    flush=True,
                )
    if args.dry_run:
        return 0
    rows = [summary_row(labels[m], curves[labels[m]], len(early[labels[m]])) for m in methods]
    table = markdown(rows)
    short = [line for m in methods for line in early[labels[m]]]
    if short:  # their final accuracy is no comparison at the budget
        table += "\n! ended before the budget:\n" + "".join(f"- {line}\n" for line in short)
    if args.scale == "paper" and beside_r2(rows):  # the comparison the paper scale exists for
        table += f"\nBeside R2's table (one run, its seed 10; ours: mean +- std over seeds {args.seeds})\n\n"
        table += markdown(beside_r2(rows))
    variant = f", variant {args.variant}" if args.variant else ""
    with open(os.path.join(output, "results.md"), "w") as f:
        f.write(f"{args.scale} scale{variant}, budget {budget:g} time units, seeds {args.seeds}\n\n{table}")
    plot(curves, budget, staleness, betas, output)
    print(table)
    print(f"[reproduce] results in {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
