"""What ``bench_protocol.py`` measures and how: the jobs of one measurement (``protocol_runs``), each run on each
side (``measure``: a baseline commit, this checkout, each ``--bulk`` mode), and what is read from a run
(``describe``: devices per second, CPU per device by role, group sizes, sync round trips, versions kept). The
benches that run the same jobs (``bench_transport_floor.py --beside-job``, ``protocol_modes``) import it from here;
the tables (``protocol_report``) take its figures."""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import json
import os
import re
import statistics
import sys
import time

from benchmarks.lib.harness import REPO, run_job, worktree
from common.result_files import LEAF_LOGS
from simulation.sync_times import SYNC_SUMMARY

NUMBERS = ("devices_per_second", "seconds_per_version", "cpu_busy", "server_cores")

NEAR_ZERO_TRAINING = ["--local-iters", "1", "--local-batch-size", "8", "--subset-size", "32"]


def job_flags(args, devices_per_leaf: int, selection: int) -> list[str]:
    """A near-zero-training job; no checkpoints (the protocol's cost is measured here, a checkpoint's by
    ``bench_checkpoint.py``)."""
    return [
        *("--num-leaf-nodes", str(args.leaves), "--devices-per-leaf", str(devices_per_leaf)),
        *("--device-selection-size", str(selection), "--max-model-version", str(args.versions)),
        *("--synthetic-size", str(args.synthetic_size), "--seed", str(args.seed), *NEAR_ZERO_TRAINING),
        *("--checkpoint-every", "-1"),
    ]


def training_floor_ms(
    devices: int,
    seed: int,
    synthetic_size: int,
    group: int,
    subset_size: int = 32,
    local_iters: int = 1,
    local_batch_size: int = 8,
    **data_options,
) -> float:
    """CPU milliseconds per device of the job's own training step alone (task processor, groups of ``group``)."""
    from processors.data.config import DataConfig
    from processors.models import build_model
    from processors.task_processor import TrainingTaskProcessor
    from processors.training import TrainingConfig

    data = DataConfig(synthetic_size=synthetic_size, subset_size=subset_size, **data_options)
    training = TrainingConfig(local_iters=local_iters, local_batch_size=local_batch_size, local_lr=1e-3)
    proc = TrainingTaskProcessor(data=data.to_dict(), training=training.to_dict(), seed=seed, torch_threads=1)
    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    proc.train_group([f"warmup#{i}" for i in range(group)], weights, version=1)
    ids = [f"site-{i % 2 + 1}#{i}" for i in range(devices)]
    started = time.process_time()
    for i in range(0, devices, group):
        proc.train_group(ids[i : i + group], weights, version=1)
    return 1000 * (time.process_time() - started) / devices


def devices_per_second(result) -> float:
    steady = result.steady_state()
    return steady["devices"] / steady["wall_seconds"]


FEDBUFF = ["--method", "fedbuff", "--num-updates-for-model", "2", "--min-hole-to-fill", "1", "--global-lr", "0.05"]


NULL_JOB = "benchmarks/lib/null_training.py"  # the same jobs, each device's training a fixed diff (NullTrainer)
# where a checkout from before the benchmarks were sorted by purpose keeps a script (a --baseline-rev runs it there)
EARLIER_PATHS = {NULL_JOB: "benchmarks/null_training.py"}
CONVNET = "cifar10_convnet"


MODEL_SCALES = {  # a model's own setting where the convnet's (2 x 1,000 devices, K = 2,000) would not fit in memory
    # scoring a version on the server's CPU takes seconds: 50 test images (a fifth of the synthetic set), and only
    # versions 1, the middle one and the last scored (the steady state is the second half)
    "resnet18": {
        "devices_per_leaf": 50,
        "selection": 20,
        "fedbuff_versions": 100,
        "synthetic_size": 250,
        "evaluations": 2,
    },
}


def scaled(args) -> argparse.Namespace:
    """``args`` with the model's own scale filled in where a flag left it open (``MODEL_SCALES``)."""
    model = getattr(args, "model", CONVNET)
    scale = {"devices_per_leaf": 1000, "selection": None, "fedbuff_versions": 1500, "synthetic_size": 4000}
    scale |= {"evaluations": 10}  # FedBuff's versions scored, besides version 1
    scale |= MODEL_SCALES.get(model, {})
    filled = {k: v if getattr(args, k, None) is None else getattr(args, k) for k, v in scale.items()}
    return argparse.Namespace(**(vars(args) | filled | {"model": model}))


def protocol_runs(args) -> dict[str, tuple[str, list[str]]]:
    """The runs of one measurement: name -> (job script, flags); with ``--null-training`` the same jobs through
    ``benchmarks/lib/null_training.py`` (its first argument names the job script it stands for)."""
    args = scaled(args)
    selection = args.selection or args.leaves * args.devices_per_leaf
    fedavg = job_flags(args, args.devices_per_leaf, selection)
    if args.model != CONVNET:  # the convnet's runs keep their command lines (a baseline commit runs them too)
        fedavg += ["--model", args.model]
    if args.null_training:  # a leaf's first report carries all its diffs at once (about 240 MB): on a loaded
        fedavg += ["--update-timeout", "120"]  # machine the derived 10 s can pass; a timeout changes nothing else
    buff = [*fedavg, *FEDBUFF, "--max-model-version", str(args.fedbuff_versions)]  # the later flag wins
    buff += ["--eval-frequency", str(max(1, args.fedbuff_versions // args.evaluations))]
    avg_job, buff_job = ("jobs/pt_job_fedavg.py", []), ("jobs/pt_job_fedrevive.py", [])
    if args.null_training:
        avg_job, buff_job = (NULL_JOB, ["fedavg"]), (NULL_JOB, ["fedrevive"])
    return {
        "FedAvg": (avg_job[0], [*avg_job[1], *fedavg]),
        "FedBuff, paper delays": (buff_job[0], [*buff_job[1], *buff, "--delays", "paper"]),
        "FedBuff, no delays": (buff_job[0], [*buff_job[1], *buff, "--delays", "none"]),
    }


def group_sizes(out: str) -> collections.Counter:
    """How many devices the run's leaves trained in groups of each size (their report lines)."""
    sizes: collections.Counter = collections.Counter()
    for path in glob.glob(os.path.join(out, LEAF_LOGS)):
        with open(path) as f:
            sizes.update(json.loads(line)["group"] for line in f if line.strip())
    return sizes


def mean_group(groups: collections.Counter) -> float:
    """Devices per training call: a group of g devices is g report lines of size g."""
    calls = sum(n / size for size, n in groups.items())
    return sum(groups.values()) / calls if calls else 0.0


def describe(result, out: str) -> dict:
    """Devices per second, CPU per device by role, how busy the CPU was and the server's cores, over the steady
    state (the second evaluated version to the last); the sizes of the groups its devices were trained in; the
    leaves' sync round trips (``syncs``)."""
    steady = result.steady_state()
    devices, wall, cpu = steady["devices"], steady["wall_seconds"], steady["cpu"]
    return {
        "devices_per_second": devices / wall,
        "seconds_per_version": wall / (steady["to_version"] - steady["from_version"]),
        "cpu_ms": {role: 1000 * seconds / devices for role, seconds in cpu.items()},
        "cpu_busy": sum(cpu.values()) / (wall * (os.cpu_count() or 1)),
        "server_cores": cpu["server"] / wall,
        "groups": group_sizes(out),
        "syncs": sync_round_trips(out),
    }


SYNCS = re.compile(re.escape(SYNC_SUMMARY).replace(r"\{", "{").replace(r"\}", "}").format(
    count=r"(?P<count>\d+)", p50=r"(?P<p50>[\d.]+)", p99=r"(?P<p99>[\d.]+)"
))  # fmt: skip


def sync_round_trips(out: str) -> dict | None:
    """The leaves' syncs with the server, from their logs' last word (``simulation.sync_times``): how many, the
    median of their p50 round trips and the largest p99, in ms; None when no leaf said."""
    found = []
    for path in glob.glob(os.path.join(out, "nvflare", "**", "site-*", "log.txt"), recursive=True):
        with open(path, errors="replace") as f:
            lines = [m for line in f if (m := SYNCS.search(line))]
        if lines:
            found.append(lines[-1])
    if not found:
        return None
    return {
        "count": sum(int(m["count"]) for m in found),
        "p50": statistics.median(float(m["p50"]) for m in found),
        "p99": max(float(m["p99"]) for m in found),
    }


def all_busy_rate(leaves_ms: float, server_ms: float) -> float:
    """The devices (or updates) per second that this CPU per device, the leaves' and the server's, allows with every
    core busy: a run's ceiling on this machine, however well its phases overlap."""
    return (os.cpu_count() or 1) * 1000 / (leaves_ms + server_ms)


def at_full_cpu(r: dict) -> str:
    """``all_busy_rate`` of a run (``describe``), as its table shows it."""
    return f"{all_busy_rate(r['cpu_ms']['leaves'], r['cpu_ms']['server']):.0f}"


class Floors:
    """The training floor at each group size, measured once per size (the same processor, no NVFlare)."""

    def __init__(self, args):
        self.args, self.ms = args, {}

    def at(self, group: int) -> float:
        if group not in self.ms:
            devices = max(min(400, 8 * group), group)
            self.ms[group] = training_floor_ms(devices, self.args.seed, self.args.synthetic_size, group)
        return self.ms[group]

    def of_run(self, groups: collections.Counter) -> float:
        """CPU ms per device of training the run's devices in the groups they were trained in."""
        common = dict(groups.most_common(8))  # the rare sizes are priced at the nearest common one
        total = sum(groups.values())
        priced = sum(n * self.at(min(common, key=lambda g: abs(g - size))) for size, n in groups.items())
        return priced / total


# The GPU floor without a GPU: bench_engine's goal for the vectorised engine on an H100 (GPU_FIX_NOTES.md), not a
# measurement. With a GPU, measure it (bench_engine.py --device cuda) and pass --gpu-samples-per-second.
GPU_SAMPLES_PER_SECOND = 1e6
PAPER_SAMPLES_PER_DEVICE = 25 * 32  # the paper's device: 25 steps of batch 32
RETENTION = re.compile(r"versions kept: peak (\d+) \((\d+\.\d+) MB(?:.*?(\d+\.\d+) MB spilled)?")
OURS = "this commit"  # the label of this checkout's runs (with --bulk: "this commit, --bulk MODE")


def last_in_server_log(out: str, pattern: re.Pattern) -> re.Match | None:
    """The last line of the server's log under a run's ``out`` that ``pattern`` matches (searched), if any."""
    found = None
    for path in glob.glob(os.path.join(out, "nvflare", "**", "server", "log.txt"), recursive=True):
        with open(path, errors="replace") as f:
            for line in f:
                found = pattern.search(line) or found
    return found


def retention(out: str) -> tuple[int, float, float] | None:
    """The server's peak of versions kept, and of their MB in memory and on disk, from its log (``GlobalModel``)."""
    m = last_in_server_log(out, RETENTION)
    return (int(m.group(1)), float(m.group(2)), float(m.group(3) or 0.0)) if m else None


def select_runs(args) -> dict[str, tuple[str, list[str]]]:
    runs = protocol_runs(args)
    if args.only:  # fedavg, fedbuff (both), fedbuff-paper, fedbuff-none
        wanted = args.only.lower().split(",")
        slug = {"FedAvg": "fedavg", "FedBuff, paper delays": "fedbuff-paper", "FedBuff, no delays": "fedbuff-none"}
        runs = {k: v for k, v in runs.items() if slug[k] in wanted or slug[k].split("-")[0] in wanted}
    return runs


def sides(args, stack: contextlib.ExitStack, work: str) -> dict[str, tuple[str, list[str]]]:
    """label -> (the checkout it runs, the flags it adds): the baseline commit (if any), then this one once per
    ``--bulk`` mode (or once, with the job's default)."""
    found = {}
    if args.baseline_rev:
        found[args.baseline_rev] = (stack.enter_context(worktree(args.baseline_rev, work)), [])
    modes = [m for m in getattr(args, "bulk", "").split(",") if m]
    for mode in modes or [""]:
        found[f"{OURS}, --bulk {mode}" if mode else OURS] = (REPO, ["--bulk", mode] if mode else [])
    return found


def in_checkout(tree: str, script: str) -> str:
    """``script``'s path in the checkout ``tree``: its own, or where an earlier checkout keeps it (``EARLIER_PATHS``)."""
    earlier = EARLIER_PATHS.get(script)
    if earlier and not os.path.exists(os.path.join(tree, script)) and os.path.exists(os.path.join(tree, earlier)):
        return earlier
    return script


def median_run(runs: list[dict]) -> dict:
    """One run's figures from several runs of it: the median of each number (each CPU figure on its own), the
    first run's groups, versions kept and output folder."""
    first = dict(runs[0])
    if len(runs) == 1:
        return first
    for key in NUMBERS:
        first[key] = statistics.median(r[key] for r in runs)
    first["cpu_ms"] = {role: statistics.median(r["cpu_ms"][role] for r in runs) for role in runs[0]["cpu_ms"]}
    syncs = [r["syncs"] for r in runs if r.get("syncs")]
    if syncs:
        first["syncs"] = {k: statistics.median(s[k] for s in syncs) for k in syncs[0]}
    first["runs"] = len(runs)
    return first


def measure(args, work: str) -> dict[str, dict[str, dict]]:
    """Each run on every side (``sides``), ``--repeat`` times, the sides alternating: label -> run name -> the
    medians of ``describe`` (``protocol_report.median_run``), with the server's versions kept (``retention``) and
    the run's output folder (``out``)."""
    runs = select_runs(args)
    found: dict[str, dict[str, list[dict]]] = {}
    with contextlib.ExitStack() as stack:
        trees = sides(args, stack, work)
        for repeat in range(getattr(args, "repeat", 1)):
            for label, (tree, extra) in trees.items():
                for name, (script, flags) in runs.items():
                    script = in_checkout(tree, script)
                    if not os.path.exists(os.path.join(tree, script)):
                        sys.exit(f"{label} has no {script}: choose a later --baseline-rev")
                    print(f"running {name} on {label} ...", flush=True)
                    slug = "".join(c if c.isalnum() else "-" for c in f"{label}-{name}-{repeat}")
                    flags = [*flags, *extra, "--workspace", os.path.join(work, f"ws-{slug}")]
                    out = os.path.join(work, slug)
                    result = run_job(script, flags, out, repo=tree)
                    run = describe(result, out) | {"retention": retention(out), "out": out}
                    found.setdefault(label, {}).setdefault(name, []).append(run)
    return {label: {name: median_run(rs) for name, rs in by.items()} for label, by in found.items()}
