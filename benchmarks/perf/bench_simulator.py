"""Stock NVFlare device simulator vs ours, on the same job, back to back in one run.

Default case (no delays): synchronous FedAvg, 2 leaves x 60 devices, 100 devices a round, Cifar10ConvNet, Adam
25 iterations of batch 32, 3 model versions. The stock path is NVFlare's ``Simulator`` (via ``TPORunner``) with
its own ``BuffModelManager`` and weights as Python lists, as in NVFlare's edge example. Ours is
``--simulator fast`` with numpy weights. It also measures the compute floor: the same 100 devices trained one
after another in this process, with no NVFlare at all.

``--delays``: the example's heterogeneity scale (speed means 100/200/400 s, std 4, upload 5 s), 2 model
versions: the stock path sleeps those seconds, ours runs them on the virtual clock.

The last line is ``speedup: <X>x``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from benchmarks.lib.harness import fleet_flags  # noqa: E402


def run_job(flags: list[str], out: str) -> dict:
    started = time.time()
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "jobs", "pt_job_fedavg.py"), *flags, "--output", out],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        sys.exit(f"job failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    from common.result_files import METRICS

    with open(os.path.join(out, METRICS)) as f:
        metrics = json.load(f)
    metrics["summary"]["process_seconds"] = round(time.time() - started, 2)
    return metrics


def compute_floor(devices: int, seed: int, synthetic_size: int) -> float:
    """Seconds to train ``devices`` devices one after another in-process (no NVFlare): the floor per version."""
    import torch

    from processors.data.config import DataConfig
    from processors.models import build_model
    from processors.task_processor import TrainingTaskProcessor
    from processors.training import TrainingConfig

    data, training = DataConfig(synthetic_size=synthetic_size), TrainingConfig()
    proc = TrainingTaskProcessor(data=data.to_dict(), training=training.to_dict(), seed=seed)
    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    proc.train("warmup#0", weights, version=1)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.time()
    for i in range(devices):
        proc.train(f"site-{i % 2 + 1}#{i}", weights, version=1)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.time() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--delays", action="store_true", help="the example's device speeds and upload delay")
    p.add_argument("--devices-per-leaf", type=int, default=60)
    p.add_argument("--selection", type=int, default=100)
    p.add_argument("--versions", type=int, default=None, help="default 3 (2 with --delays)")
    p.add_argument("--synthetic-size", type=int, default=20000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    versions = args.versions or (2 if args.delays else 3)
    common = [
        *fleet_flags(args.devices_per_leaf, args.selection, versions),
        "--synthetic-size",
        str(args.synthetic_size),
        "--seed",
        str(args.seed),
    ]
    if args.delays:
        common += ["--delays", "edge-example"]
    work = tempfile.mkdtemp(prefix="bench_simulator_")
    # NVFlare's example runs the stock simulator with 10 workers; with delays we give it one thread per device a
    # leaf trains per round, so all its sleeps overlap (the most favourable setting for the stock path)
    stock_workers = str(-(-args.selection // 2)) if args.delays else "10"
    cases = {
        "stock": ["--simulator", "stock", "--num-workers", stock_workers],
        "fast": ["--simulator", "fast"],
    }
    results = {}
    for name, flags in cases.items():
        print(f"running {name} ...", flush=True)
        m = run_job([*common, *flags, "--workspace", os.path.join(work, name)], os.path.join(work, name, "out"))
        s = m["summary"]
        results[name] = s
        print(
            f"  {name:5s}: {s['seconds_per_version']:.2f} s per model version "
            f"(whole process {s['process_seconds']:.1f} s, simulated {s.get('simulated_seconds', 0):.0f} s, "
            f"final accuracy {s['final_accuracy']})",
            flush=True,
        )
    if not args.delays:
        floor = compute_floor(args.selection, args.seed, args.synthetic_size)
        print(
            f"  compute floor: {floor:.2f} s per model version ({args.selection} devices trained serially, no NVFlare)"
        )
        print(
            f"  fast path overhead above the floor: {results['fast']['seconds_per_version'] - floor:.2f} s per version"
        )
    ratio = results["stock"]["seconds_per_version"] / results["fast"]["seconds_per_version"]
    print(f"speedup: {ratio:.1f}x")


if __name__ == "__main__":
    main()
