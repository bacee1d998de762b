"""What a simulated device costs beyond its training, synchronous and asynchronous: devices per second, the
compute floor, and CPU per device by process, from one run of this script.

Near-zero training (``--local-iters 1 --local-batch-size 8 --subset-size 32``), 2 leaves x 1,000 devices, every
device selected (K = 2,000), no checkpoints, three jobs:

* FedAvg (a round of 2,000);
* FedBuff, B = 2, min hole 1, ``--delays paper`` (``--fedbuff-versions``, default 1,500 versions);
* FedBuff, the same with ``--delays none`` (every update due at time 0).

From each job's process tree (``benchmarks/harness.py``), between the second and the last evaluated version:
devices per second, seconds per version, how busy the CPU was, and CPU milliseconds per device for the leaves and
the server. The compute floor is the job's own task processor and engine training the same devices in this
process (no NVFlare), at the group sizes the run's leaves really trained them in (their report lines); a run's
``x floor`` is its devices per second over what the floor allows on all cores, and ``- floor`` is the leaves'
CPU per device beyond training. ``--only fedavg,fedbuff-paper,fedbuff-none`` runs a subset.

``--baseline-rev REV``: runs the same jobs first on an earlier commit of this repository (a temporary git
worktree, its own code on ``PYTHONPATH``), then on this one, and prints the ratios.

``--cpu-scale``: FedBuff at ``reproduce_fedrevive.py --scale cpu``'s training (25 Adam steps of batch 32 per
device), updates per second against its training floor.

``--pool 100,10000,100000,1000000``: FedAvg at a fixed selection (``--selection``, default 200) with each pool
size per leaf; prints seconds per version and peak memory per pool, each as a ratio to the smallest pool, and the
memory each idle device adds.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.harness import REPO, run_job  # noqa: E402
from common.result_files import LEAF_LOGS  # noqa: E402

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


@contextlib.contextmanager
def worktree(rev: str, work: str):
    """A temporary checkout of ``rev`` (its own code first on ``PYTHONPATH``), removed afterwards."""
    path = os.path.join(work, f"rev-{rev}")
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", path, rev], check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", path], capture_output=True)
        shutil.rmtree(path, ignore_errors=True)


def devices_per_second(result) -> float:
    steady = result.steady_state()
    return steady["devices"] / steady["wall_seconds"]


FEDBUFF = ["--method", "fedbuff", "--num-updates-for-model", "2", "--min-hole-to-fill", "1", "--global-lr", "0.05"]


def protocol_runs(args) -> dict[str, tuple[str, list[str]]]:
    """The runs of one measurement: name -> (job script, flags)."""
    selection = args.selection or args.leaves * args.devices_per_leaf
    fedavg = job_flags(args, args.devices_per_leaf, selection)
    buff = [*fedavg, *FEDBUFF, "--max-model-version", str(args.fedbuff_versions)]  # the later flag wins
    buff += ["--eval-frequency", str(max(1, args.fedbuff_versions // 10))]
    return {
        "FedAvg": ("jobs/pt_job_fedavg.py", fedavg),
        "FedBuff, paper delays": ("jobs/pt_job_fedrevive.py", [*buff, "--delays", "paper"]),
        "FedBuff, no delays": ("jobs/pt_job_fedrevive.py", [*buff, "--delays", "none"]),
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
    """Devices per second, CPU per device by role, and how busy the CPU was, over the steady state (the second
    evaluated version to the last), and the sizes of the groups its devices were trained in."""
    steady = result.steady_state()
    devices, wall, cpu = steady["devices"], steady["wall_seconds"], steady["cpu"]
    return {
        "devices_per_second": devices / wall,
        "seconds_per_version": wall / (steady["to_version"] - steady["from_version"]),
        "cpu_ms": {role: 1000 * seconds / devices for role, seconds in cpu.items()},
        "cpu_busy": sum(cpu.values()) / (wall * (os.cpu_count() or 1)),
        "groups": group_sizes(out),
    }


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


ROW = "{:<22} {:<14} {:>10} {:>9} {:>8} {:>10} {:>9} {:>12} {:>8} {:>14}"


def throughput(args, work: str) -> None:
    runs = protocol_runs(args)
    if args.only:  # fedavg, fedbuff (both), fedbuff-paper, fedbuff-none
        wanted = args.only.lower().split(",")
        slug = {"FedAvg": "fedavg", "FedBuff, paper delays": "fedbuff-paper", "FedBuff, no delays": "fedbuff-none"}
        runs = {k: v for k, v in runs.items() if slug[k] in wanted or slug[k].split("-")[0] in wanted}
    measured: dict[str, dict[str, dict]] = {}
    with contextlib.ExitStack() as stack:
        trees = {"this commit": REPO}
        if args.baseline_rev:
            trees = {args.baseline_rev: stack.enter_context(worktree(args.baseline_rev, work))} | trees
        for label, tree in trees.items():
            for name, (script, flags) in runs.items():
                print(f"running {name} on {label} ...", flush=True)
                slug = "".join(c if c.isalnum() else "-" for c in f"{label}-{name}")
                flags = [*flags, "--workspace", os.path.join(work, f"ws-{slug}")]
                result = run_job(script, flags, os.path.join(work, slug), repo=tree)
                measured.setdefault(label, {})[name] = describe(result, os.path.join(work, slug))
    ours = measured["this commit"]
    floors = Floors(args)
    cores = os.cpu_count() or 1
    best = ours.get("FedAvg", next(iter(ours.values())))["groups"].most_common(1)[0][0]
    print(
        f"\n{args.leaves} leaves x {args.devices_per_leaf} devices on {cores} cores, near-zero training "
        f"({' '.join(NEAR_ZERO_TRAINING)}); K = {args.selection or 'every device'}, FedBuff B = 2"
    )
    print(
        "compute floor: the job's processor alone, CPU ms per device by group size: "
        + ", ".join(f"{g}: {floors.at(g):.2f}" for g in sorted({1, best}))
    )
    print("each run's floor prices its devices at the group sizes they were trained in (leaf report lines)")
    print(
        ROW.format(
            "run",
            "commit",
            "devices/s",
            "x FedAvg",
            "x floor",
            "s/version",
            "CPU busy",
            "leaf ms/dev",
            "- floor",
            "server ms/dev",
        )
    )
    for label, results in measured.items():
        base = results.get("FedAvg", {}).get("devices_per_second")
        for name, r in results.items():
            rate, floor = r["devices_per_second"], floors.of_run(r["groups"])
            print(
                ROW.format(
                    name,
                    label,
                    f"{rate:.1f}",
                    f"{rate / base:.2f}x" if base else "-",
                    f"{rate * floor / 1000 / cores:.2f}x",
                    f"{r['seconds_per_version']:.3f}",
                    f"{r['cpu_busy']:.0%}",
                    f"{r['cpu_ms']['leaves']:.2f}",
                    f"{r['cpu_ms']['leaves'] - floor:.2f}",
                    f"{r['cpu_ms']['server']:.2f}",
                )
            )
    for label, results in measured.items():
        for name, r in results.items():
            print(f"{name} ({label}): mean group size {mean_group(r['groups']):.1f} devices per training call")
    if args.baseline_rev:
        for name in ours:
            ratio = ours[name]["devices_per_second"] / measured[args.baseline_rev][name]["devices_per_second"]
            print(f"{name}: {ratio:.1f}x {args.baseline_rev}")
    paper, none = ours.get("FedBuff, paper delays"), ours.get("FedBuff, no delays")
    if paper and none:
        print(f"FedBuff no delays / paper delays: {none['devices_per_second'] / paper['devices_per_second']:.2f}x")


def cpu_scale(args, work: str) -> None:
    """FedBuff at the reproduction harness's cpu scale (``reproduce_fedrevive.py --scale cpu``: 25 Adam steps of
    batch 32 per device): updates per second against the training floor of its devices' groups."""
    from benchmarks.reproduce_fedrevive import SCALES

    flags = [
        *SCALES["cpu"]["flags"],
        "--method",
        "fedbuff",
        "--max-model-version",
        str(args.cpu_scale_versions),
        "--seed",
        str(args.seed),
        "--checkpoint-every",
        "-1",
        "--workspace",
        os.path.join(work, "ws-cpu"),
    ]
    flags += ["--eval-frequency", str(max(1, args.cpu_scale_versions // 10))]  # the later flag wins
    print("running FedBuff at the cpu scale ...", flush=True)
    out = os.path.join(work, "cpu-scale")
    r = describe(run_job("jobs/pt_job_fedrevive.py", flags, out), out)
    options = {"synthetic_difficulty": 1.0, "dirichlet_alpha": 0.5}
    floors = {g: training_floor_ms(max(8 * g, 40), args.seed, 20000, g, 100, 25, 32, **options) for g in r["groups"]}
    total = sum(r["groups"].values())
    floor = sum(n * floors[g] for g, n in r["groups"].items()) / total
    cores = os.cpu_count() or 1
    rate, floor_rate = r["devices_per_second"], 1000 * cores / floor
    print(f"cpu scale, FedBuff (K = 20, B = 2, 25 Adam steps of batch 32 per device), {cores} cores:")
    print(
        f"  updates per second: {rate:.2f}; training floor {floor_rate:.2f} ({floor:.1f} CPU ms per device in the "
        f"groups it was trained in: {dict(sorted(r['groups'].items()))}); floor / rate: {floor_rate / rate:.2f}x"
    )


def pools(args, work: str) -> None:
    sizes = [int(v) for v in args.pool.split(",")]
    rows = []
    for size in sizes:
        print(f"running pool {size} per leaf ...", flush=True)
        ws = os.path.join(work, f"pool{size}")
        result = run_job(
            "jobs/pt_job_fedavg.py",
            [*job_flags(args, size, args.selection or 200), "--workspace", os.path.join(ws, "ws")],
            os.path.join(ws, "out"),
        )
        steady = result.steady_state()
        rows.append(
            (size, steady["wall_seconds"] / (steady["to_version"] - steady["from_version"]), result.peak_rss_bytes)
        )
    base_size, base_s, base_rss = rows[0]
    print(f"{'pool/leaf':>10} {'s/version':>10} {'ratio':>7} {'peak RSS GB':>12} {'ratio':>7}")
    for size, seconds, rss in rows:
        print(f"{size:>10} {seconds:>10.2f} {seconds / base_s:>6.2f}x {rss / 2**30:>12.2f} {rss / base_rss:>6.2f}x")
    size, _, rss = rows[-1]
    if size > base_size:
        per_idle = (rss - base_rss) / (args.leaves * (size - base_size))
        print(f"memory per idle device: {per_idle:.0f} bytes (peak RSS difference over the added devices)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--leaves", type=int, default=2)
    p.add_argument("--devices-per-leaf", type=int, default=1000)
    p.add_argument("--selection", type=int, default=None, help="default: every device (throughput) or 200 (--pool)")
    p.add_argument("--versions", type=int, default=5, help="FedAvg versions")
    p.add_argument("--fedbuff-versions", type=int, default=1500)
    p.add_argument("--cpu-scale", action="store_true", help="FedBuff at reproduce_fedrevive's cpu scale vs its floor")
    p.add_argument("--cpu-scale-versions", type=int, default=150)
    p.add_argument(
        "--only", default="", help="comma-separated runs: fedavg, fedbuff-paper, fedbuff-none (fedbuff: both)"
    )
    p.add_argument("--synthetic-size", type=int, default=4000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pool", default="", help="comma-separated devices per leaf, e.g. 100,10000,100000,1000000")
    p.add_argument("--baseline-rev", default="", help="an earlier commit to run the same job on first (ratio)")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="bench_protocol_")
    if args.cpu_scale:
        cpu_scale(args, work)
    elif args.pool:
        pools(args, work)
    else:
        throughput(args, work)


if __name__ == "__main__":
    main()
