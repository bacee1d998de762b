"""A pack's diffs and versions through shared memory against NVFlare's wire: the seeds of a null-training FedBuff run
with ResNet-18's shapes (every device returns a fixed diff at once, ``benchmarks.lib.null_training``), as one pack,
with ``--bulk auto`` (each leaf's diffs up through its ring and each run's versions down through the run's own,
``scheduling.pack_links``) and ``--bulk wire``.

The sides alternate, ``--repeat`` times each, one job command at a time, timed from its start to its exit. It
prints each job's wall seconds and updates applied per second (every run's ``events.jsonl`` lines over the wall:
start-up included), then ``auto / wire`` of the medians, and checks what the link must not change: each run's
``events.jsonl`` and final model are the same bytes on both sides (exit 1 otherwise).

    python benchmarks/perf/bench_pack_bulk.py
    python benchmarks/perf/bench_pack_bulk.py --versions 40 --repeat 1     # a quick try
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.lib.harness import fleet_flags, start_job  # noqa: E402
from common.result_files import EVENTS, GLOBAL_MODEL  # noqa: E402

SCRIPT = "benchmarks/lib/null_training.py"
SIDES = ("auto", "wire")


def flags(seeds: str, versions: int, bulk: str) -> list[str]:
    """The pack's command line (after the script): FedBuff's seeds on 2 leaves of 20 devices, 10 in flight."""
    return [
        "fedrevive",
        *("--method fedbuff --model resnet18 --synthetic-size 1000 --eval-frequency 100000".split()),
        *fleet_flags(20, 10, versions),
        *("--seeds", seeds, "--bulk", bulk),
    ]


def run(seeds: str, versions: int, bulk: str, out: str) -> tuple[float, int, dict[str, str]]:
    """One pack: its wall seconds, the updates its runs applied, and each run's digest (events and model)."""
    started = time.time()
    popen = start_job(SCRIPT, flags(seeds, versions, bulk), out)
    output = popen.communicate()[0]
    wall = time.time() - started
    if popen.returncode:
        sys.exit(f"the pack failed (--bulk {bulk}):\n{output[-3000:]}")
    updates, digests = 0, {}
    for seed in seeds.split(","):
        folder = os.path.join(out, f"seed-{seed}")
        digest = hashlib.sha256()
        for name in (EVENTS, GLOBAL_MODEL):
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            digest.update(data)
            updates += data.count(b"\n") if name == EVENTS else 0
        digests[seed] = digest.hexdigest()[:16]
    return wall, updates, digests


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1", help="the pack's seeds (comma-separated, at least two)")
    p.add_argument("--versions", type=int, default=150, help="each run's last version")
    p.add_argument("--repeat", type=int, default=3, help="jobs of each side, alternating")
    p.add_argument("--output", default=None, help="where the runs' results go (default: a temporary folder)")
    args = p.parse_args(argv)
    root = args.output or tempfile.mkdtemp(prefix="bench_pack_bulk-")
    walls: dict[str, list[float]] = {side: [] for side in SIDES}
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    seen: dict[str, dict[str, str]] = {}
    for i in range(args.repeat):
        for side in SIDES:
            wall, updates, digests = run(args.seeds, args.versions, side, os.path.join(root, f"{side}-{i}"))
            walls[side].append(wall)
            rates[side].append(updates / wall)
            seen[f"{side}-{i}"] = digests
            print(f"{side:5s} #{i}: {wall:7.1f} s, {updates} updates, {updates / wall:6.1f} updates/s", flush=True)
    wall = {side: statistics.median(v) for side, v in walls.items()}
    rate = {side: statistics.median(v) for side, v in rates.items()}
    print(
        f"medians: auto {wall['auto']:.1f} s ({rate['auto']:.1f} updates/s), wire {wall['wire']:.1f} s "
        f"({rate['wire']:.1f} updates/s); auto / wire: wall {wall['auto'] / wall['wire']:.2f}x, "
        f"updates/s {rate['auto'] / rate['wire']:.2f}x"
    )
    if len({tuple(sorted(d.items())) for d in seen.values()}) != 1:
        print(f"the runs differ between jobs: {seen}")
        return 1
    print("each run's events and final model: the same bytes on every job of both sides")
    return 0


if __name__ == "__main__":
    sys.exit(main())
