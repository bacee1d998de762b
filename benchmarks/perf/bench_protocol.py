"""What a simulated device costs beyond its training, synchronous and asynchronous: devices per second, the
compute floor, and CPU per device by process, from one run of this script.

Near-zero training (``--local-iters 1 --local-batch-size 8 --subset-size 32``), 2 leaves x 1,000 devices, every
device selected (K = 2,000), no checkpoints, three jobs:

* FedAvg (a round of 2,000);
* FedBuff, B = 2, min hole 1, ``--delays paper`` (``--fedbuff-versions``, default 1,500 versions);
* FedBuff, the same with ``--delays none`` (every update due at time 0).

From each job's process tree (``benchmarks/lib/harness.py``), between the second and the last evaluated version:
devices per second, seconds per version, how busy the CPU was, and CPU milliseconds per device for the leaves and
the server. The compute floor is the job's own task processor and engine training the same devices in this
process (no NVFlare), at the group sizes the run's leaves really trained them in (their report lines); a run's
``x floor`` is its devices per second over what the floor allows on all cores, and ``- floor`` is the leaves'
CPU per device beyond training. ``/s all busy`` is the devices per second the run's CPU per device (leaves and
server) allows with every core busy: its ceiling on this machine, however well its phases overlap.
``--only fedavg,fedbuff-paper,fedbuff-none`` runs a subset.

``--baseline-rev REV``: runs the same jobs first on an earlier commit of this repository (a temporary git
worktree, its own code on ``PYTHONPATH``), then on this one, and prints the ratios.

``--null-training``: the same jobs with devices that return a fixed diff at once (``benchmarks/lib/null_training.py``),
against a GPU floor (``--gpu-samples-per-second``; default an estimate). Each run prints the server's peak of versions
kept for pending devices.

``--model resnet18``: the same jobs with the paper's ResNet-18 (its shapes: 11M parameters, 44.7 MB per diff and
per version), at its own scale unless given (2 leaves x 50 devices, K = 20, 100 FedBuff versions): with
``--null-training`` only (training it on the CPU would measure the CPU, not the protocol).

``--bulk shm,wire``: each job once per mode (``--bulk``: diffs and versions through shared memory, or NVFlare's
wire), with the ratios between them; a ``--baseline-rev`` runs without the flag (as its own default). Each run
also prints the server process's cores used (its CPU seconds over the wall seconds) and the leaves' sync round
trips (p50, p99: from each leaf's log, ``simulation.sync_times``). ``--repeat N`` runs every side N times,
alternating, and prints the medians.

``--cpu-scale``: FedBuff at ``reproduce_fedrevive.py --scale cpu``'s training (25 Adam steps of batch 32 per
device), updates per second against its training floor.

``--pool 100,10000,100000,1000000``: FedAvg at a fixed selection (``--selection``, default 200) with each pool
size per leaf; prints seconds per version and peak memory per pool, each as a ratio to the smallest pool, and the
memory each idle device adds.

This script holds the flags; the jobs, the measurement and what is read from a run are ``protocol_runs``, the
tables ``protocol_report`` (figures in, lines out) and the two other modes ``protocol_modes``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.perf.protocol_modes import cpu_scale, pools  # noqa: E402
from benchmarks.perf.protocol_report import print_null, print_table, print_tail  # noqa: E402
from benchmarks.perf.protocol_runs import CONVNET, GPU_SAMPLES_PER_SECOND, Floors, measure, scaled  # noqa: E402


def throughput(args, work: str) -> None:
    args = scaled(args)
    if args.model != CONVNET and not args.null_training:
        sys.exit(f"--model {args.model}: with --null-training only (its training on the CPU is not the protocol)")
    measured = measure(args, work)
    if args.null_training:
        print_null(args, measured)
    else:
        print_table(args, measured, Floors(args))
    print_tail(args, measured)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--leaves", type=int, default=2)
    p.add_argument("--devices-per-leaf", type=int, default=None, help="default: 1000, or the model's own (50)")
    p.add_argument(
        "--selection", type=int, default=None, help="default: every device, the model's own (20) or 200 (--pool)"
    )
    p.add_argument("--versions", type=int, default=5, help="FedAvg versions")
    p.add_argument("--fedbuff-versions", type=int, default=None, help="default: 1500, or the model's own (100)")
    p.add_argument("--model", default=CONVNET, help="cifar10_convnet, or resnet18 (with --null-training)")
    p.add_argument("--bulk", default="", help="comma-separated --bulk modes to run each job with: shm,wire")
    p.add_argument("--repeat", type=int, default=1, help="runs of every side, alternating (medians printed)")
    p.add_argument("--cpu-scale", action="store_true", help="FedBuff at reproduce_fedrevive's cpu scale vs its floor")
    p.add_argument("--cpu-scale-versions", type=int, default=150)
    p.add_argument(
        "--only", default="", help="comma-separated runs: fedavg, fedbuff-paper, fedbuff-none (fedbuff: both)"
    )
    p.add_argument("--synthetic-size", type=int, default=None, help="default: 4000, or the model's own (250)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pool", default="", help="comma-separated devices per leaf, e.g. 100,10000,100000,1000000")
    p.add_argument("--baseline-rev", default="", help="an earlier commit to run the same job on first (ratio)")
    p.add_argument(
        "--null-training", action="store_true", help="each device returns a fixed diff at once: the protocol's ceiling"
    )
    p.add_argument(
        "--gpu-samples-per-second",
        type=float,
        default=GPU_SAMPLES_PER_SECOND,
        help="the GPU floor for --null-training (default: bench_engine's H100 goal, an estimate)",
    )
    args = scaled(p.parse_args())
    work = tempfile.mkdtemp(prefix="bench_protocol_")
    if args.cpu_scale:
        cpu_scale(args, work)
    elif args.pool:
        pools(args, work)
    else:
        throughput(args, work)


if __name__ == "__main__":
    main()
