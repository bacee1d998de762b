"""Same bits: the digests of seeded FedAvg, FedBuff and FedRevive runs, to compare two commits after a refactor.

    python benchmarks/checks/same_bits.py --out A.json                    # this checkout
    python benchmarks/checks/same_bits.py --out B.json --repo OTHER_TREE  # another checkout (e.g. a git worktree)
    python benchmarks/checks/same_bits.py --compare A.json B.json         # exit 0 when every digest is equal
    python benchmarks/checks/same_bits.py --out C.json --precision bf16   # the runs at another --precision

Each run's digest names the precision it ran at (``--precision``, default fp32: the flag is then not passed, so
a checkout from before the flag runs too); a precision repeats its own bits on one machine, never another's.
    python benchmarks/checks/same_bits.py --out S.json --bulk shm         # every run with its bulk arrays in shared memory
    python benchmarks/checks/same_bits.py --out W.json --bulk wire        # ... or on NVFlare's wire: S and W must be equal

Each run is small but real (SimEnv, 2 leaves): FedAvg; FedBuff with the paper's delays (updates of many versions,
stale ones included); FedRevive with its phases from version 2 (``benchmarks.lib.fedrevive_small``), so distillation runs. Every scheduled version is
evaluated (``--eval-backlog wait``), so the accuracy curve does not depend on the machine's load. A digest is the
SHA-256 of ``events.jsonl`` and of ``global_model.pt``, the list of (version, accuracy), and FedRevive's log without
its wall-clock fields (``fedrevive.config.LOG_WALL_CLOCK``).

``--bulk MODE`` adds ``--bulk MODE`` to every run (how diffs and versions travel, ``docs/deployment.md``): the
digests of ``shm`` and ``wire`` runs must be equal, and equal to those of a checkout that has no such flag.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from benchmarks.lib.fedrevive_small import FEDREVIVE_SMALL  # noqa: E402
from benchmarks.lib.harness import job_command  # noqa: E402
from common.result_files import EVENTS, GLOBAL_MODEL, METRICS  # noqa: E402
from fedrevive.config import LOG_FILE as FEDREVIVE_LOG  # noqa: E402
from fedrevive.config import LOG_WALL_CLOCK  # noqa: E402

SMALL = [
    "--seed",
    "3",
    "--num-leaf-nodes",
    "2",
    "--devices-per-leaf",
    "10",
    "--device-selection-size",
    "8",
    "--synthetic-size",
    "3000",
    "--local-iters",
    "10",
    "--local-lr",
    "1e-3",
    "--eval-backlog",
    "wait",
    "--eval-frequency",
    "1",
]
RUNS = {
    "fedavg": ["jobs/pt_job_fedavg.py", *SMALL, "--max-model-version", "4"],
    "fedbuff": ["jobs/pt_job_fedrevive.py", "--method", "fedbuff", *SMALL, "--delays", "paper"]
    + ["--max-model-version", "12"],
    "fedrevive": ["jobs/pt_job_fedrevive.py", "--method", "fedrevive", *SMALL, "--delays", "paper"]
    + ["--max-model-version", "8", *FEDREVIVE_SMALL],
}


def sha256(path: str) -> str | None:
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def digest(out: str) -> dict:
    """What must not change: the trace, the model's bytes, the curve and FedRevive's decisions."""
    with open(os.path.join(out, METRICS)) as f:
        metrics = json.load(f)
    found = {
        EVENTS: sha256(os.path.join(out, EVENTS)),
        GLOBAL_MODEL: sha256(os.path.join(out, GLOBAL_MODEL)),
        "accuracies": [[v["version"], v.get("accuracy")] for v in metrics["versions"]],
    }
    log = os.path.join(out, FEDREVIVE_LOG)
    if os.path.exists(log):
        with open(log) as f:
            lines = [
                {k: v for k, v in json.loads(line).items() if k not in LOG_WALL_CLOCK} for line in f if line.strip()
            ]
        found["fedrevive_log"] = hashlib.sha256(json.dumps(lines, sort_keys=True).encode()).hexdigest()
    return found


def run_all(repo: str, names: list[str], precision: str = "fp32", bulk: str = "") -> dict:
    digests = {}
    extra = [] if precision == "fp32" else ["--precision", precision]
    with tempfile.TemporaryDirectory(prefix="same_bits_") as tmp:
        for name in names:
            out, ws = os.path.join(tmp, name, "out"), os.path.join(tmp, name, "ws")
            script, *flags = RUNS[name]
            flags += ["--bulk", bulk] if bulk else []
            command, env = job_command(script, [*flags, *extra, "--workspace", ws], out, repo)
            proc = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                sys.exit(f"{name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
            digests[name] = digest(out) | {"precision": precision}
            print(f"{name}: {json.dumps(digests[name])}", flush=True)
    return digests


def compare(a: dict, b: dict) -> list[str]:
    """The fields that differ, one line each."""
    return [
        f"{run}.{field}: {a[run].get(field)} != {b.get(run, {}).get(field)}"
        for run in sorted(a)
        for field in sorted(a[run])
        if a[run].get(field) != b.get(run, {}).get(field)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the digests here (JSON)")
    parser.add_argument("--repo", default=REPO, help="the checkout whose jobs run (default: this one)")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {','.join(RUNS)}")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two digest files instead")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"], help="every run's")
    parser.add_argument(
        "--bulk", choices=["auto", "shm", "wire"], default="", help="add --bulk MODE to every run (default: none)"
    )
    args = parser.parse_args(argv)
    if args.compare:
        with open(args.compare[0]) as fa, open(args.compare[1]) as fb:
            differences = compare(json.load(fa), json.load(fb))
        print("\n".join(differences) or "same bits: every digest is equal")
        return 1 if differences else 0
    names = args.runs.split(",")
    unknown = sorted(set(names) - set(RUNS))
    if unknown or not args.out:
        parser.error(f"unknown run(s) {unknown}" if unknown else "--out FILE is needed (or --compare A B)")
    digests = run_all(os.path.abspath(args.repo), names, args.precision, args.bulk)
    with open(args.out, "w") as f:
        json.dump(digests, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
