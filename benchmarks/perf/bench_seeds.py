"""Seeds as one NVFlare job (a pack, ``--seeds``) against one seed alone and against each seed run alone in turn:
issue 59's goal that five seeds of the cpu scale's FedBuff as one pack take at most 2x one seed's wall time.

Three sides, one after the other in one run, each a whole job command timed from its start to its exit (start-up
and shut-down included, since a pack pays them once):

- ``one``: the first seed alone (``--seed S``);
- ``pack``: every seed of ``--seeds`` as one job (``--seeds S1,S2,..``: ``jobs.seeds``);
- ``apart``: every seed alone, one job after another (what a pack replaces; ``--no-apart`` leaves it out).

It prints each side's wall seconds, then ``pack / one: <X>x`` (the goal: at most 2x for five seeds) and
``pack / apart: <X>x``, and checks what a pack must not change: the first seed's ``events.jsonl`` in the pack equals
its run alone, line for line (exit 1 otherwise). The cpu scale (``benchmarks.lib.scales``) runs to its budget of
simulated time; ``--scale small`` is a seconds-long stand-in for trying the bench.

    python benchmarks/perf/bench_seeds.py --seeds 0,1,2,3,4
    python benchmarks/perf/bench_seeds.py --scale small --seeds 0,1 --no-apart
    python benchmarks/perf/bench_seeds.py --no-apart --bulk wire    # every job on NVFlare's wire
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.lib.harness import fleet_flags, start_job  # noqa: E402
from benchmarks.lib.scales import SCALES  # noqa: E402
from common.result_files import EVENTS, METRICS  # noqa: E402

SCRIPT = "jobs/pt_job_fedrevive.py"


def scale_flags(scale: str) -> list[str]:
    """FedBuff's flags at ``scale``: the cpu scale to its time budget, or a small fleet of a few versions."""
    if scale == "cpu":
        cpu = SCALES["cpu"]
        return [*cpu["flags"], "--max-sim-time", str(cpu["budget"]), "--max-model-version", "100000"]
    return [*fleet_flags(6, 4, 6), "--synthetic-size", "1000", "--local-iters", "2", "--eval-backlog", "wait"]


def timed(flags: list[str], out: str) -> float:
    """Run the job script with ``flags`` and ``--output out``; its wall seconds (exit with its output if it fails)."""
    started = time.time()
    popen = start_job(SCRIPT, flags, out)
    output = popen.communicate()[0]
    if popen.returncode:
        sys.exit(f"job failed ({SCRIPT} {' '.join(flags)}):\n{output[-3000:]}")
    return time.time() - started


def final(out: str) -> tuple[int, float]:
    """A run's last evaluated version and its accuracy."""
    with open(os.path.join(out, METRICS)) as f:
        last = json.load(f)["versions"][-1]
    return last["version"], last["accuracy"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2,3,4", help="the pack's seeds (comma-separated, at least two)")
    p.add_argument("--scale", choices=("cpu", "small"), default="cpu")
    p.add_argument("--no-apart", action="store_true", help="leave out running each seed alone in turn")
    p.add_argument("--output", default=None, help="where the runs' results go (default: a temporary folder)")
    p.add_argument("--bulk", choices=("auto", "shm", "wire"), default="auto", help="every job's data plane")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    base = ["--method", "fedbuff", *scale_flags(args.scale), "--bulk", args.bulk]
    root = args.output or tempfile.mkdtemp(prefix="bench_seeds_")
    print(f"FedBuff at the {args.scale} scale, seeds {args.seeds}, --bulk {args.bulk}; results in {root}", flush=True)

    one = timed([*base, "--seed", str(seeds[0])], os.path.join(root, "one"))
    print(f"one   ({seeds[0]} alone): {one:.1f} s, version {final(os.path.join(root, 'one'))}", flush=True)
    pack = timed([*base, "--seeds", args.seeds], os.path.join(root, "pack"))
    packed = [final(os.path.join(root, "pack", f"seed-{s}")) for s in seeds]
    print(f"pack  ({len(seeds)} seeds, one job): {pack:.1f} s, versions {packed}", flush=True)
    apart = None
    if not args.no_apart:
        apart = sum(timed([*base, "--seed", str(s)], os.path.join(root, f"apart-{s}")) for s in seeds)
        print(f"apart ({len(seeds)} jobs in turn): {apart:.1f} s", flush=True)

    print(f"pack / one: {pack / one:.2f}x (goal for five seeds: at most 2x)")
    if apart is not None:
        print(f"pack / apart: {pack / apart:.2f}x")
    with (
        open(os.path.join(root, "one", EVENTS)) as f,
        open(os.path.join(root, "pack", f"seed-{seeds[0]}", EVENTS)) as g,
    ):
        alone, in_pack = f.read().splitlines(), g.read().splitlines()
    same = alone == in_pack
    print(f"seed {seeds[0]}'s events.jsonl in the pack equals its run alone: {same} ({len(in_pack)} lines)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
