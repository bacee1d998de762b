"""What checkpoints cost: wall time per version with a checkpoint at every version against none, and the size and
write time of one checkpoint, for each method.

For each method the same seeded job runs twice, back to back: ``--checkpoint-every 1`` (a checkpoint at every
version, the worst case) and ``--checkpoint-every -1`` (none). It prints, side by side, the steady-state wall
seconds per version of both and their ratio, and the last checkpoint's size on disk and write time (from
``checkpoint/meta.json``). The default, ``--checkpoint-every 0``, waits at least ``max(60 s, 20 x the last write)``
between checkpoints, so its cost is the write time over that interval: at most 5% by construction; the table
says what it is for each method.

    python benchmarks/perf/bench_checkpoint.py                      # convnet, the three methods
    python benchmarks/perf/bench_checkpoint.py --model resnet18 --methods fedavg
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.lib.harness import fleet_flags, run_job  # noqa: E402
from common.result_files import CHECKPOINT  # noqa: E402
from scheduling.checkpoint import AUTO_COST_SHARE, AUTO_MIN_SECONDS  # noqa: E402

METHOD_FLAGS = {
    "fedavg": ["--method", "fedavg"],
    "fedbuff": ["--method", "fedbuff", "--delays", "paper"],
    "fedrevive": ("--method fedrevive --delays paper --fr-distill-from-version 3 --fr-kd-train-from-version 5").split(),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="fedavg,fedbuff,fedrevive")
    parser.add_argument("--model", default="cifar10_convnet")
    parser.add_argument("--versions", type=int, default=12)
    parser.add_argument("--devices-per-leaf", type=int, default=50)
    parser.add_argument("--selection", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_checkpoint_") as tmp:
        for method in args.methods.split(","):
            flags = [
                *METHOD_FLAGS[method],
                "--model",
                args.model,
                *fleet_flags(args.devices_per_leaf, args.selection, args.versions),
                "--local-iters",
                "2",
                "--subset-size",
                "64",
                "--synthetic-size",
                "3000",
                "--seed",
                str(args.seed),
                "--eval-frequency",
                "1",
                "--workspace",
                os.path.join(tmp, "ws"),
            ]
            per_version = {}
            for every in ("1", "-1"):
                out = os.path.join(tmp, f"{method}_{every}")
                result = run_job("jobs/pt_job_fedrevive.py", [*flags, "--checkpoint-every", every], out)
                steady = result.steady_state()
                per_version[every] = steady["wall_seconds"] / (steady["to_version"] - steady["from_version"])
                if every == "1":
                    with open(os.path.join(out, CHECKPOINT, "meta.json")) as f:
                        meta = json.load(f)
            interval = max(AUTO_MIN_SECONDS, AUTO_COST_SHARE * meta["write_seconds"])
            rows.append((method, per_version["1"], per_version["-1"], meta["bytes"], meta["write_seconds"], interval))

    print(
        f"\n{args.model}, 2 leaves x {args.devices_per_leaf} devices, {args.selection} per round, "
        f"{args.versions} versions (steady state from the second evaluated version)"
    )
    print(
        f"{'method':10} {'s/version every 1':>18} {'s/version never':>16} {'ratio':>6} {'checkpoint MB':>14} "
        f"{'write s':>8} {'default: cost share':>20}"
    )
    for method, every, never, size, write, interval in rows:
        print(
            f"{method:10} {every:18.3f} {never:16.3f} {every / never:6.2f} {size / 1e6:14.2f} {write:8.3f} "
            f"{write / (interval + write):19.2%}"
        )


if __name__ == "__main__":
    main()
