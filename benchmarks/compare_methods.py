"""FedAvg vs FedBuff vs FedRevive under the same simulated-time budget, on the same data, seed and device speeds.

Each method runs as its own ``jobs/pt_job_fedrevive.py --method M`` subprocess (its command is printed) with
heterogeneous device speeds, slept at ``--time-scale`` (default 0.25 wall seconds per simulated second) so that
asynchronous methods start new tasks at the simulated time the server reacted. Simulated time is what a method gets: a fast method produces
more global versions within the budget. Each method's ``--max-model-version`` is estimated from the speed
config so that its run covers ``--sim-budget`` simulated seconds (see ``estimate_max_version``); a run that
falls short is re-run with an estimate from its own observed simulated seconds per version (``--retries``).
The estimate assumes every selected device is always in flight on the virtual clock; in practice a leaf's
clock runs ahead while the server refills its devices, so asynchronous runs cover more simulated time per
version than that and the estimate is an upper bound: a job is stopped as soon as an evaluated version lies at
or past the budget (``--no-early-stop`` runs every job to its estimate). Each accuracy curve is then cut at
the budget.

Buffer sizes (our call, documented here and in the output): the paper's presets are concurrency 100 with
FedAvg 100 / FedBuff 2 / FedRevive 1 updates per global model. FedAvg stays synchronous (buffer = concurrency);
FedBuff and FedRevive keep their absolute buffers 2 and 1 (scaling 2 by 20/100 would round to 1 and make
FedBuff's buffer identical to FedRevive's). Server learning rates are the presets' (1.4 / 0.05 / 0.10).
FedRevive's ``s_max`` (staleness at which beta = 0.5, 75 for concurrency 100) is scaled by concurrency / 100,
because staleness grows with the number of devices in flight; its warm-up versions are lowered so
distillation runs within a small budget. Any ``--fr-*`` flag (and any other job flag) given to this script
is passed to every job and wins.

Writes to ``--output``: ``results.csv``, ``results.md``, ``accuracy_vs_simtime.png``, ``commands.txt`` and one
folder per method (its ``metrics.json``, ``job.log``, ...). The markdown table is printed at the end.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import shlex
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("fedavg", "fedbuff", "fedrevive")
PAPER_CONCURRENCY = 100
PAPER_S_MAX = 75.0


# -- pure parts (unit-tested) ---------------------------------------------------------------------------------
def buffer_size(method: str, concurrency: int, fedbuff_k: int = 2, fedrevive_k: int = 1) -> int:
    """Updates per global model: FedAvg is synchronous (the whole selection); FedBuff/FedRevive keep theirs."""
    if method == "fedavg":
        return concurrency
    return min(fedbuff_k if method == "fedbuff" else fedrevive_k, concurrency)


def mean_task_seconds(means, probs=(), comm_mean: float = 0.0) -> float:
    """Expected simulated seconds of one device task (training + upload)."""
    if not means:
        return float(comm_mean)
    p = list(probs) if probs else [1.0 / len(means)] * len(means)
    return float(sum(pi * mi for pi, mi in zip(p, means, strict=True)) + comm_mean)


def expected_round_seconds(devices: int, means, stds, probs=(), comm_mean=0.0, comm_std=0.0, trials=400, seed=0):
    """Expected simulated seconds of a synchronous round on one leaf: the slowest of its ``devices`` tasks
    (Monte Carlo over the speed classes, with the job's own duration model)."""
    import numpy as np

    if not means and not comm_mean and not comm_std:
        return 0.0
    rng = np.random.default_rng(seed)
    k = len(means)
    p = np.asarray(probs) if probs else None
    total = np.zeros((trials, devices))
    if k:
        cls = rng.choice(k, size=(trials, devices), p=p)
        total += np.maximum(0.0, rng.normal(np.asarray(means)[cls], np.asarray(stds)[cls]))
    if comm_mean or comm_std:
        total += np.maximum(0.0, rng.normal(comm_mean, comm_std, size=(trials, devices)))
    return float(total.max(axis=1).mean())


def estimate_max_version(
    method: str,
    sim_budget: float,
    concurrency: int,
    buffer: int,
    num_leaves: int,
    means=(),
    stds=(),
    probs=(),
    comm_mean: float = 0.0,
    comm_std: float = 0.0,
    margin: float = 1.3,
    cap: int = 10_000,
    seed: int = 0,
) -> int:
    """``--max-model-version`` that should carry a run past ``sim_budget`` simulated seconds.

    Asynchronous (FedBuff/FedRevive): ``concurrency`` devices are always in flight, so updates arrive at
    ``concurrency / E[task seconds]`` per simulated second and a version takes ``buffer`` of them.
    Synchronous (FedAvg): a round lasts as long as a leaf's slowest device (``ceil(concurrency / leaves)`` each).
    ``margin`` > 1 over-provisions (leaves keep separate clocks; devices are drawn once per speed class);
    version 1 is the initial model. At least 2, at most ``cap``.
    """
    if sim_budget <= 0:
        raise ValueError(f"sim budget must be > 0, got {sim_budget}")
    if method == "fedavg":
        per_leaf = math.ceil(concurrency / max(num_leaves, 1))
        per_version = expected_round_seconds(per_leaf, means, stds, probs, comm_mean, comm_std, seed=seed)
    else:
        per_version = buffer * mean_task_seconds(means, probs, comm_mean) / concurrency
    if per_version <= 0:
        raise ValueError("no heterogeneity configured: every task takes 0 simulated seconds, give --speed-means")
    versions = math.ceil(margin * sim_budget / per_version)
    return int(min(max(2, 1 + versions), cap))


def reestimate_max_version(records: list[dict], sim_budget: float, margin: float = 1.3, cap: int = 10_000) -> int:
    """From a run that fell short: its observed simulated seconds per version, extrapolated past the budget."""
    timed = [r for r in records if r.get("sim_seconds")]
    if not timed:
        raise ValueError("the run recorded no simulated time")
    last = timed[-1]
    per_version = last["sim_seconds"] / max(last["version"] - 1, 1)
    return int(min(max(2, 1 + math.ceil(margin * sim_budget / per_version)), cap))


def cut_at_budget(records: list[dict], sim_budget: float) -> list[dict]:
    """The records that existed within the budget (``sim_seconds`` <= budget), in version order."""
    rows = sorted(records, key=lambda r: r["version"])
    return [r for r in rows if r.get("sim_seconds", 0.0) <= sim_budget]


def covers_budget(records: list[dict], sim_budget: float) -> bool:
    """Whether the run reached the budget (some version exists at or past it)."""
    return any(r.get("sim_seconds", 0.0) >= sim_budget for r in records)


def summarize(method: str, records: list[dict], sim_budget: float, wall_seconds: float, max_version: int) -> dict:
    cut = cut_at_budget(records, sim_budget)
    return {
        "method": method,
        "final_acc_at_budget": cut[-1]["accuracy"] if cut else None,
        "best_acc_at_budget": max((r["accuracy"] for r in cut), default=None),
        "versions_in_budget": (cut[-1]["version"] - 1) if cut else 0,  # trained versions (1 is the initial model)
        "sim_seconds_reached": max((r.get("sim_seconds", 0.0) for r in records), default=0.0),
        "covered": covers_budget(records, sim_budget),
        "max_model_version": max_version,
        "wall_seconds": round(wall_seconds, 1),
        "wall_seconds_at_budget": cut[-1]["wall_seconds"] if cut else None,
    }


COLUMNS = (
    "method",
    "final_acc_at_budget",
    "best_acc_at_budget",
    "versions_in_budget",
    "sim_seconds_reached",
    "covered",
    "max_model_version",
    "wall_seconds",
    "wall_seconds_at_budget",
)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.4f}" if value < 1.0 else f"{value:.1f}"
    return str(value)


def format_markdown(rows: list[dict], columns=COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def format_csv(rows: list[dict], columns=COLUMNS) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def plot_curves(curves: dict[str, list[dict]], sim_budget: float, path: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for method, records in curves.items():
        cut = cut_at_budget(records, sim_budget)
        if cut:  # a version's model is the global model until the next one: steps, held to the budget
            xs = [r.get("sim_seconds", 0.0) for r in cut] + [sim_budget]
            ys = [r["accuracy"] for r in cut] + [cut[-1]["accuracy"]]
            (line,) = ax.plot(xs, ys, drawstyle="steps-post", label=method)
            ax.plot(xs[:-1], ys[:-1], ".", color=line.get_color())
    ax.axvline(sim_budget, color="gray", linestyle="--", linewidth=1, label="budget")
    ax.set_xlabel("simulated seconds")
    ax.set_ylabel("test accuracy")
    ax.set_xlim(0, sim_budget * 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- running the jobs -----------------------------------------------------------------------------------------
def _csv(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v.strip()) if text else ()


def job_command(args, method: str, max_version: int, out: str, passthrough: list[str]) -> list[str]:
    cmd = [
        sys.executable, os.path.join(REPO, "jobs", "pt_job_fedrevive.py"), "--method", method,
        "--dataset", args.dataset, "--model", args.model, "--seed", str(args.seed),
        "--num-leaf-nodes", str(args.num_leaf_nodes), "--devices-per-leaf", str(args.devices_per_leaf),
        "--device-selection-size", str(args.concurrency),
        "--num-updates-for-model", str(buffer_size(method, args.concurrency, args.fedbuff_k, args.fedrevive_k)),
        "--min-hole-to-fill", str(args.concurrency if method == "fedavg" else 1),
        "--max-model-version", str(max_version), "--eval-frequency", str(args.eval_frequency),
        "--synthetic-size", str(args.synthetic_size), "--subset-size", str(args.subset_size),
        "--dirichlet-alpha", str(args.dirichlet_alpha),
        "--local-iters", str(args.local_iters), "--local-batch-size", str(args.local_batch_size),
        "--local-lr", str(args.local_lr),
        "--speed-means", _csv(args.speed_means), "--speed-stds", _csv(args.speed_stds),
        "--upload-delays", f"{args.comm_delay_mean:g}", "--upload-jitter", f"{args.comm_delay_std:g}",
        "--workspace", os.path.join(args.output, "workspace"), "--output", out,
        "--job-name", f"compare_{method}", "--time-scale", f"{args.time_scale:g}",
    ]  # fmt: skip
    if args.speed_probs:
        cmd += ["--speed-probs", _csv(args.speed_probs)]
    if method == "fedrevive":
        s_max = args.fr_s_max if args.fr_s_max else PAPER_S_MAX * args.concurrency / PAPER_CONCURRENCY
        cmd += [
            "--fr-s-max", f"{s_max:g}",
            "--fr-distill-from-version", str(args.fr_distill_from_version),
            "--fr-kd-train-from-version", str(args.fr_kd_train_from_version),
            "--fr-teacher-buffer-size", str(args.fr_teacher_buffer_size),
            "--fr-synth-per-teacher", str(args.fr_synth_per_teacher), "--fr-kd-iters", str(args.fr_kd_iters),
            "--fr-gen-width", str(args.fr_gen_width), "--fr-pool-size", str(args.fr_pool_size),
            "--fr-probe-samples", str(args.fr_probe_samples),
        ]  # fmt: skip
    return cmd + passthrough


def sim_seconds_so_far(out: str) -> float:
    """Simulated time of the newest evaluated version of a running job (its ``metrics.json``)."""
    try:
        records = load_records(out)
    except (OSError, ValueError):
        return 0.0
    return max((r.get("sim_seconds", 0.0) for r in records), default=0.0)


def run_job(cmd: list[str], log_path: str, out: str = "", stop_at_sim: float | None = None) -> tuple[float, bool]:
    """Run one job, its output into ``log_path`` and its progress lines to stdout. With ``stop_at_sim``, the
    job is stopped (its whole process tree, SIGTERM then SIGKILL) as soon as an evaluated version exists at or
    past that simulated time: the version estimate is an upper bound, this keeps wall time to what is needed.
    Returns (wall seconds, stopped early)."""
    started = time.time()
    stopped = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            if line.startswith("[edgesim]") and ("version" in line or "done" in line or "accuracy" in line):
                print("   ", line.rstrip(), flush=True)
                if stop_at_sim is not None and not stopped and line.startswith("[edgesim] version"):
                    reached = sim_seconds_so_far(out)
                    if reached >= stop_at_sim:
                        print(f"[compare] {reached:.1f} simulated s >= budget: stopping the job", flush=True)
                        stopped = True
                        _stop(proc)
                        break
        proc.stdout.close()
        proc.wait()
    if proc.returncode and not stopped:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"job failed (exit {proc.returncode}), log {log_path}:\n{tail}")
    return time.time() - started, stopped


def _stop(proc: subprocess.Popen) -> None:
    """Terminate the job and every process it started (NVFlare's simulator and its workers open their own
    sessions, so a process-group signal would miss them): SIGTERM, then SIGKILL for what is left."""
    import psutil

    from jobs.process_guard import stop_processes

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    stop_processes(tree, grace_seconds=15)


def load_records(out: str) -> list[dict]:
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f).get("versions", [])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="Unknown flags are passed to every job (e.g. --fr-kd-iters 5, --compute-device cpu).",
    )
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of fedavg,fedbuff,fedrevive")
    p.add_argument("--sim-budget", type=float, default=900.0, help="simulated seconds every method gets")
    p.add_argument("--dataset", default="synthetic", help="synthetic, cifar10 or PATH.npz")
    p.add_argument("--synthetic-size", type=int, default=6000)
    p.add_argument("--model", default="cifar10_convnet", choices=["cifar10_convnet", "resnet18"])
    p.add_argument("--concurrency", type=int, default=20, help="devices training at once (paper: 100)")
    p.add_argument("--num-leaf-nodes", type=int, default=2)
    p.add_argument("--devices-per-leaf", type=int, default=25, help="device pool = leaves x this")
    p.add_argument("--fedbuff-k", type=int, default=2, help="FedBuff updates per global model (paper: 2)")
    p.add_argument("--fedrevive-k", type=int, default=1, help="FedRevive updates per global model (paper: 1)")
    p.add_argument("--subset-size", type=int, default=100, help="training samples per device")
    p.add_argument("--dirichlet-alpha", type=float, default=0.5)
    p.add_argument("--local-iters", type=int, default=10)
    p.add_argument("--local-batch-size", type=int, default=32)
    p.add_argument("--local-lr", type=float, default=1e-3)
    p.add_argument("--speed-means", type=_floats, default=(10.0, 20.0, 40.0), help="seconds per speed class")
    p.add_argument("--speed-stds", type=_floats, default=(1.0, 2.0, 4.0))
    p.add_argument("--speed-probs", type=_floats, default=(0.5, 0.3, 0.2))
    p.add_argument("--comm-delay-mean", type=float, default=1.0)
    p.add_argument("--comm-delay-std", type=float, default=0.2)
    p.add_argument(
        "--time-scale",
        type=float,
        default=0.25,
        help="wall seconds per simulated second; 0 runs the pure virtual clock, which lets asynchronous leaves' "
        "clocks run ahead of the server (see README, 'Simulated time'); too small a scale makes the run "
        "throughput-bound on a small machine (at 0.25 on 2 cores FedBuff made 462 of the ~450 versions expected)",
    )
    p.add_argument("--eval-frequency", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--margin", type=float, default=1.25, help="over-provisioning of the version estimate")
    p.add_argument("--max-version-cap", type=int, default=1500, help="never ask a job for more versions")
    p.add_argument("--retries", type=int, default=1, help="re-runs of a method that fell short of the budget")
    p.add_argument(
        "--no-early-stop",
        action="store_true",
        help="run every job to its --max-model-version instead of stopping it once it passed the budget",
    )
    fr = p.add_argument_group("FedRevive (small settings so distillation runs within a small budget on a CPU)")
    fr.add_argument("--fr-s-max", type=float, default=0.0, help="0: 75 x concurrency / 100")
    fr.add_argument("--fr-distill-from-version", type=int, default=5, help="paper: 50")
    fr.add_argument("--fr-kd-train-from-version", type=int, default=10, help="paper: 100")
    fr.add_argument("--fr-teacher-buffer-size", type=int, default=4, help="paper: 8")
    fr.add_argument("--fr-synth-per-teacher", type=int, default=8, help="paper: 32")
    fr.add_argument("--fr-kd-iters", type=int, default=3, help="paper: 10")
    fr.add_argument("--fr-gen-width", type=int, default=16, help="paper: 64")
    fr.add_argument("--fr-pool-size", type=int, default=512, help="paper: 16000")
    fr.add_argument("--fr-probe-samples", type=int, default=64, help="paper: 512")
    p.add_argument(
        "--output",
        default=os.path.expanduser("~/.cache/edgesim-flare/workspace/results/compare_methods"),
        help="output folder",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, passthrough = parser.parse_known_args(argv)
    args.output = os.path.abspath(os.path.expanduser(args.output))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            parser.error(f"unknown method {m!r}")
    os.makedirs(args.output, exist_ok=True)
    print(
        f"[compare] budget {args.sim_budget:g} simulated s | {args.dataset} / {args.model} | concurrency "
        f"{args.concurrency} on {args.num_leaf_nodes} leaves x {args.devices_per_leaf} devices | speeds "
        f"{_csv(args.speed_means)} (std {_csv(args.speed_stds)}, p {_csv(args.speed_probs) or 'equal'}) + upload "
        f"{args.comm_delay_mean:g} s | buffers fedavg {args.concurrency} / fedbuff {args.fedbuff_k} / fedrevive "
        f"{args.fedrevive_k}",
        flush=True,
    )
    rows, curves, commands = [], {}, []
    for method in methods:
        k = buffer_size(method, args.concurrency, args.fedbuff_k, args.fedrevive_k)
        max_version = estimate_max_version(
            method, args.sim_budget, args.concurrency, k, args.num_leaf_nodes, args.speed_means, args.speed_stds,
            args.speed_probs, args.comm_delay_mean, args.comm_delay_std, args.margin, args.max_version_cap, args.seed,
        )  # fmt: skip
        out = os.path.join(args.output, method)
        wall = 0.0
        for attempt in range(args.retries + 1):
            cmd = job_command(args, method, max_version, out, passthrough)
            commands.append(shlex.join(cmd))
            print(f"[compare] {method}: --max-model-version {max_version} (attempt {attempt + 1})", flush=True)
            print(f"[compare] $ {shlex.join(cmd)}", flush=True)
            stop_at = None if args.no_early_stop else args.sim_budget
            wall, stopped = run_job(cmd, os.path.join(args.output, f"{method}.log"), out, stop_at)
            records = load_records(out)
            if covers_budget(records, args.sim_budget) or attempt == args.retries:
                break
            if max_version >= args.max_version_cap:
                print(f"[compare] {method} fell short of the budget at the version cap", flush=True)
                break
            reached = max((r.get("sim_seconds", 0.0) for r in records), default=0.0)
            new = reestimate_max_version(records, args.sim_budget, args.margin, args.max_version_cap)
            max_version = max(new, max_version + 1)
            print(f"[compare] {method} reached {reached:.1f} simulated s < budget: re-running", flush=True)
        curves[method] = records
        rows.append(summarize(method, records, args.sim_budget, wall, max_version))
        print(f"[compare] {method}: {json.dumps(rows[-1])}", flush=True)

    with open(os.path.join(args.output, "commands.txt"), "w") as f:
        f.write("\n".join(commands) + "\n")
    with open(os.path.join(args.output, "results.csv"), "w") as f:
        f.write(format_csv(rows))
    table = format_markdown(rows)
    with open(os.path.join(args.output, "results.md"), "w") as f:
        f.write(f"Simulated-time budget: {args.sim_budget:g} s\n\n{table}\n")
    with open(os.path.join(args.output, "curves.json"), "w") as f:
        json.dump({"sim_budget": args.sim_budget, "curves": curves}, f, indent=1)
    title = f"{args.model} on {args.dataset}, concurrency {args.concurrency}, budget {args.sim_budget:g} sim s"
    plot_curves(curves, args.sim_budget, os.path.join(args.output, "accuracy_vs_simtime.png"), title)
    print("\n[compare] commands run:")
    print("\n".join(commands))
    print(f"\n[compare] results at the simulated-time budget of {args.sim_budget:g} s:\n")
    print(table)
    print(f"\n[compare] {args.output}: results.csv, results.md, accuracy_vs_simtime.png, curves.json, commands.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
