"""What a local provisioned hierarchy costs: time to stand it up, its processes and memory idle and during a small
FedAvg job through ``--env prod``, and that job's time from submission to results in ``--output``.

    python benchmarks/perf/bench_hierarchy.py                  # 2 relays, 4 leaves, a 6-version job
    python benchmarks/perf/bench_hierarchy.py --leaves 8 --versions 10
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.lib.harness import REPO  # noqa: E402
from jobs.deploy import local  # noqa: E402


def resident(processes) -> int:
    total = 0
    for p in processes:
        try:
            total += p.memory_info().rss
        except Exception:  # gone in between
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--relays", type=int, default=2)
    parser.add_argument("--leaves", type=int, default=4)
    parser.add_argument("--versions", type=int, default=6)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_hierarchy_") as tmp:
        folder = os.path.join(tmp, "h")
        started = time.time()
        deployment = local.start(folder, args.relays, args.leaves)
        up_seconds = time.time() - started
        try:
            idle = local.deployment_processes(deployment)
            idle_rss = resident(idle)
            peak = [0, 0]
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.5):
                    procs = local.deployment_processes(deployment)
                    rss = resident(procs)
                    if rss > peak[0]:
                        peak[:] = [rss, len(procs)]

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            flags = [
                *deployment.job_flags,
                "--devices-per-leaf",
                "4",
                "--device-selection-size",
                str(2 * args.leaves),
                "--max-model-version",
                str(args.versions),
                "--local-iters",
                "2",
                "--synthetic-size",
                "1500",
                "--output",
                os.path.join(tmp, "out"),
            ]
            submitted = time.time()
            job = subprocess.run(
                [sys.executable, "jobs/pt_job_fedavg.py", *flags], cwd=REPO, capture_output=True, text=True
            )
            job_seconds = time.time() - submitted
            done.set()
            sampler.join()
            if job.returncode:
                sys.exit(f"the job failed:\n{job.stdout[-2000:]}\n{job.stderr[-2000:]}")
        finally:
            local.stop(folder)

    print(f"\nlocal hierarchy: server, {args.relays} relays, {args.leaves} leaves (2 devices a leaf a round)")
    print(f"  up, every leaf connected:   {up_seconds:.1f} s")
    print(f"  idle:                       {len(idle)} processes, {idle_rss / 1e9:.2f} GB resident")
    print(f"  during the job (peak):      {peak[1]} processes, {peak[0] / 1e9:.2f} GB resident")
    print(f"  {args.versions}-version FedAvg job:     {job_seconds:.1f} s from submission to results in --output")


if __name__ == "__main__":
    main()
