"""What a simulated device costs beyond its training: devices per second and CPU per device, by process.

Runs synchronous FedAvg with near-zero training (``--local-iters 1 --local-batch-size 8 --subset-size 32``) at a
selection large enough that the waits between leaf and server do not dominate (default 2 leaves x 1,000 devices,
2,000 a round). From the job's process tree (``benchmarks/harness.py``) it takes, between the second and the last
evaluated version: devices per second, and CPU milliseconds per device for the server, the leaves and the driver.
It also trains the same number of devices in this process with the job's own task processor and engine (no
NVFlare): the training floor per device. Leaf CPU minus that floor is the protocol's cost on the leaf.

``--baseline-rev REV``: runs the same job first on an earlier commit of this repository (a temporary git
worktree, its own code on ``PYTHONPATH``), then on this one, and prints the ratio of devices per second.

``--pool 100,10000,100000,1000000``: the same job at a fixed selection (``--selection``, default 200) with each
pool size per leaf; prints seconds per version and peak memory per pool, each as a ratio to the smallest pool,
and the memory each idle device adds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.harness import REPO, run_job  # noqa: E402

NEAR_ZERO_TRAINING = ["--local-iters", "1", "--local-batch-size", "8", "--subset-size", "32"]


def job_flags(args, devices_per_leaf: int, selection: int) -> list[str]:
    return [
        "--num-leaf-nodes",
        str(args.leaves),
        "--devices-per-leaf",
        str(devices_per_leaf),
        "--device-selection-size",
        str(selection),
        "--max-model-version",
        str(args.versions),
        "--synthetic-size",
        str(args.synthetic_size),
        "--seed",
        str(args.seed),
        *NEAR_ZERO_TRAINING,
    ]


def training_floor_ms(devices: int, seed: int, synthetic_size: int, group: int) -> float:
    """CPU milliseconds per device of the job's own training step alone (task processor, groups of ``group``)."""
    from processors.data.config import DataConfig
    from processors.models import build_model
    from processors.task_processor import TrainingTaskProcessor
    from processors.training import TrainingConfig

    data = DataConfig(synthetic_size=synthetic_size, subset_size=32)
    training = TrainingConfig(local_iters=1, local_batch_size=8)
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


def throughput(args, work: str) -> None:
    selection = args.selection or args.leaves * args.devices_per_leaf
    flags = job_flags(args, args.devices_per_leaf, selection)
    baseline = None
    if args.baseline_rev:
        print(f"running {args.baseline_rev} ...", flush=True)
        with worktree(args.baseline_rev, work) as tree:
            baseline = run_job(
                "jobs/pt_job_fedavg.py",
                [*flags, "--workspace", os.path.join(work, "ws-base")],
                os.path.join(work, "out-base"),
                repo=tree,
            )
    print("running this commit ...", flush=True)
    result = run_job(
        "jobs/pt_job_fedavg.py", [*flags, "--workspace", os.path.join(work, "ws")], os.path.join(work, "out")
    )
    steady = result.steady_state()
    per_device = {role: 1000 * cpu / steady["devices"] for role, cpu in steady["cpu"].items()}
    group = result.metrics["planner"].get("group_size", 1)
    floor = training_floor_ms(min(selection, 400), args.seed, args.synthetic_size, group)
    print(
        f"{args.leaves} leaves x {args.devices_per_leaf} devices, {selection} a round, versions "
        f"{steady['from_version']}..{steady['to_version']} ({steady['devices']} devices):"
    )
    print(f"  devices per second      : {steady['devices'] / steady['wall_seconds']:.1f}")
    print(f"  wall seconds per version: {steady['wall_seconds'] / (steady['to_version'] - steady['from_version']):.2f}")
    for role in ("leaves", "server", "driver"):
        print(f"  CPU ms per device, {role:7s}: {per_device[role]:.2f}")
    print(f"  training floor (same processor, groups of {group}, no NVFlare): {floor:.2f} CPU ms per device")
    print(f"  leaf CPU beyond training: {per_device['leaves'] - floor:.2f} ms per device")
    if baseline is not None:
        base = devices_per_second(baseline)
        print(f"  {args.baseline_rev}: {base:.1f} devices per second (same job)")
        print(f"speedup over {args.baseline_rev}: {devices_per_second(result) / base:.1f}x")


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
    p.add_argument("--versions", type=int, default=5)
    p.add_argument("--synthetic-size", type=int, default=4000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pool", default="", help="comma-separated devices per leaf, e.g. 100,10000,100000,1000000")
    p.add_argument("--baseline-rev", default="", help="an earlier commit to run the same job on first (ratio)")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="bench_protocol_")
    if args.pool:
        pools(args, work)
    else:
        throughput(args, work)


if __name__ == "__main__":
    main()
