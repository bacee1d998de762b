"""Does a precision stay within the seed spread? The accuracy curves of several seeds at each ``--precision``.

Every (precision, seed) is one real job (``jobs/pt_job_fedrevive.py``, FedBuff with the paper's delays by
default, a small run on the calibrated hard generated data); every run evaluates the same versions. It prints, for
each evaluated version, the float32 runs' mean and their range over seeds beside each other precision's mean,
then per precision: its final accuracy per seed, the largest gap between its mean curve and float32's, float32's
largest spread between seeds, how many evaluated versions have the precision's mean inside float32's range over
seeds, and the largest same-seed gap (a seed at both precisions: the same data, schedule and batches). Its last
line, per precision: ``PREC within the seed spread: yes|no``, yes when its mean stays inside float32's range at
every evaluated version after the first.

    python benchmarks/repro/precision_curve.py --seeds 0,1,2 --precisions fp32,bf16            # the CPU, about 3 minutes
    python benchmarks/repro/precision_curve.py --device cuda --precisions fp32,tf32,bf16 -- --model resnet18
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from common.result_files import METRICS  # noqa: E402

SMALL = (
    "--method fedbuff --dataset synthetic --synthetic-size 4000 --num-leaf-nodes 2 "
    "--devices-per-leaf 20 --device-selection-size 10 --subset-size 100 --local-iters 10 --local-lr 1e-3 "
    "--delays paper --max-model-version 60 --eval-frequency 10 --eval-backlog wait --checkpoint-every -1"
).split()


def run(precision: str, seed: int, device: str, out: str, extra: list[str]) -> list[tuple[int, float]]:
    """One job's curve: (version, accuracy) of every evaluated version."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, os.path.join(REPO, "jobs", "pt_job_fedrevive.py"), *SMALL, "--seed", str(seed)]
    cmd += ["--precision", precision, "--compute-device", device, "--output", out, "--workspace", out + "-ws", *extra]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(
            f"{precision} seed {seed} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    with open(os.path.join(out, METRICS)) as f:
        return [(r["version"], r["accuracy"]) for r in json.load(f)["versions"]]


def compare(curves: dict[str, dict[int, dict[int, float]]], base: str = "fp32") -> dict[str, dict]:
    """Per precision other than ``base``: its gaps to ``base``'s seeds (``curves[precision][seed][version]``)."""
    seeds = sorted(curves[base])
    versions = sorted(set.intersection(*(set(c) for p in curves.values() for c in p.values())))
    out = {}
    for precision, runs in curves.items():
        if precision == base:
            continue
        inside, gap, spread = 0, 0.0, 0.0
        for v in versions[1:]:  # version 1 is the initial model: the same at every precision
            ref = [curves[base][s][v] for s in seeds]
            mean = statistics.mean(runs[s][v] for s in seeds)
            inside += min(ref) <= mean <= max(ref)
            gap = max(gap, abs(mean - statistics.mean(ref)))
            spread = max(spread, max(ref) - min(ref))
        paired = max(abs(runs[s][v] - curves[base][s][v]) for s in seeds for v in versions)
        out[precision] = {
            "final": [runs[s][versions[-1]] for s in seeds],
            "largest mean gap": gap,
            "largest fp32 spread": spread,
            "versions inside": f"{inside}/{len(versions) - 1}",
            "within": inside == len(versions) - 1,
            "largest same-seed gap": paired,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--precisions", default="fp32,bf16", help="the first is the reference (fp32)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--output", default="")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    precisions = args.precisions.split(",")
    if precisions[0] != "fp32" or len(seeds) < 2:
        p.error("--precisions starts with fp32 (the reference) and --seeds names at least two seeds")
    output = args.output or tempfile.mkdtemp(prefix="precision_curve_")
    curves: dict[str, dict[int, dict[int, float]]] = {}
    started = time.time()
    for seed in seeds:  # each seed at every precision in turn: the machine's load hits them alike
        for precision in precisions:
            out = os.path.join(output, f"{precision}-seed{seed}")
            curves.setdefault(precision, {})[seed] = dict(run(precision, seed, args.device, out, extra))
            print(f"[precision] {precision} seed {seed}: {curves[precision][seed]}", flush=True)
    versions = sorted(curves["fp32"][seeds[0]])
    print(
        f"{'version':>7} {'fp32 mean':>9} {'fp32 range':>15} " + " ".join(f"{p + ' mean':>10}" for p in precisions[1:])
    )
    for v in versions:
        ref = [curves["fp32"][s][v] for s in seeds]
        others = " ".join(f"{statistics.mean(curves[p][s][v] for s in seeds):>10.4f}" for p in precisions[1:])
        print(f"{v:>7} {statistics.mean(ref):>9.4f} {min(ref):>7.4f}-{max(ref):<7.4f} {others}")
    result = compare(curves)
    with open(os.path.join(output, "precision_curve.json"), "w") as f:
        json.dump({"curves": curves, "comparison": result, "extra": extra}, f, indent=1)
    print(f"[precision] {len(seeds) * len(precisions)} runs in {time.time() - started:.0f} s; {output}")
    for precision, r in result.items():
        print(f"{precision}: " + "; ".join(f"{k} {v}" for k, v in r.items() if k != "within"))
    for precision, r in result.items():
        print(f"{precision} within the seed spread: {'yes' if r['within'] else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
