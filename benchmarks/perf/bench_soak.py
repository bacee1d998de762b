"""A soak test: a long FedBuff run, and whether any of its processes grows.

Runs ``jobs/pt_job_fedrevive.py --method fedbuff`` for ``--versions`` versions (default 2,000) at near-zero
training, the paper's delays and an evaluation every ``--eval-every`` versions, and samples every process of the
job every ``--interval`` seconds with psutil: resident memory (RSS), threads and open file descriptors (and
regular files open). It prints a table per role (driver, server, each leaf) at intervals of the run, then, per
process, the growth from the end of the warm-up (the first ``--warmup`` share of the run) to the end, and the
trend over the post-warm-up samples (least-squares slope, as a share of the warm-up value per 1,000 versions).
The goal: under 10% growth and no trend.

    python benchmarks/perf/bench_soak.py                    # 2,000 versions, 2 leaves x 100 devices, 20 at once
    python benchmarks/perf/bench_soak.py --versions 200      # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.lib.harness import REPO  # noqa: E402
from common.result_files import METRICS  # noqa: E402

FIELDS = ("rss_mb", "threads", "fds", "files")


def process_name(proc: psutil.Process, root: psutil.Process) -> str:
    """driver, server, or the leaf's client name (NVFlare's simulator_worker process of that leaf)."""
    if proc.pid == root.pid:
        return "driver"
    try:
        cmdline = proc.cmdline()
    except psutil.Error:
        return f"pid{proc.pid}"
    if any("simulator_worker" in part for part in cmdline):
        for flag in ("--client", "-c"):
            if flag in cmdline and cmdline.index(flag) + 1 < len(cmdline):
                return f"leaf {cmdline[cmdline.index(flag) + 1]}"
        return f"leaf pid{proc.pid}"
    return "server" if "python" in " ".join(cmdline[:1]).lower() else f"other pid{proc.pid}"


def sample(root: psutil.Process) -> dict[str, dict]:
    """Each live process of the job tree: its RSS (MB), threads, open descriptors and regular files."""
    rows = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            with proc.oneshot():
                name = process_name(proc, root)
                if name in rows:
                    name = f"{name} pid{proc.pid}"
                rows[name] = {
                    "rss_mb": proc.memory_info().rss / 2**20,
                    "threads": proc.num_threads(),
                    "fds": proc.num_fds(),
                    "files": len(proc.open_files()),
                }
        except psutil.Error:
            pass
    return rows


def last_version(metrics_path: str) -> int:
    try:
        with open(metrics_path) as f:
            return max((r["version"] for r in json.load(f).get("versions", [])), default=0)
    except (OSError, ValueError):
        return 0


def run(args, work: str) -> tuple[list[tuple[float, int, dict]], str, int]:
    out = os.path.join(work, "out")
    flags = [
        *("--method fedbuff --delays paper --local-iters 1 --local-batch-size 8 --subset-size 32".split()),
        *("--num-leaf-nodes", str(args.leaves), "--devices-per-leaf", str(args.devices_per_leaf)),
        *("--device-selection-size", str(args.selection), "--max-model-version", str(args.versions)),
        *("--eval-frequency", str(args.eval_every), "--synthetic-size", "4000", "--seed", str(args.seed)),
        *("--checkpoint-every", "-1", "--workspace", os.path.join(work, "ws"), "--output", out),
    ]
    popen = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "jobs/pt_job_fedrevive.py"), *flags],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    root = psutil.Process(popen.pid)
    samples: list[tuple[float, int, dict]] = []
    stop = threading.Event()
    started = time.time()

    def sampler() -> None:
        while not stop.is_set():
            samples.append((time.time() - started, last_version(os.path.join(out, METRICS)), sample(root)))
            stop.wait(args.interval)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        output = popen.communicate()[0]
    finally:
        stop.set()
        thread.join()
    return samples, output, popen.returncode


def report(samples: list[tuple[float, int, dict]], versions: int, warmup: float) -> None:
    names = sorted({n for _, _, rows in samples for n in rows})
    print(f"\n{'wall s':>7} {'version':>8}  " + "  ".join(f"{n[:18]:>30}" for n in names))
    print(f"{'':>7} {'':>8}  " + "  ".join(f"{'RSS MB / threads / fds':>30}" for _ in names))
    step = max(1, len(samples) // 12)
    for wall, version, rows in samples[::step] + samples[-1:]:
        cells = []
        for n in names:
            r = rows.get(n)
            cells.append(f"{r['rss_mb']:>14.0f} / {r['threads']:>3} / {r['fds']:>4}" if r else f"{'-':>30}")
        print(f"{wall:>7.0f} {version:>8}  " + "  ".join(f"{c:>30}" for c in cells))
    print(f"\ngrowth from the end of the warm-up (version >= {int(warmup * versions)}) to the end, and the trend")
    print(f"{'process':<22} {'field':<8} {'warm-up':>9} {'end':>9} {'growth':>8} {'trend per 1,000 versions':>26}")
    for n in names:
        steady = [(v, rows[n]) for _, v, rows in samples if n in rows and v >= warmup * versions]
        if len(steady) < 3:
            continue
        for field in FIELDS:
            start, end = steady[0][1][field], steady[-1][1][field]
            xs = np.array([v for v, _ in steady], dtype=float)
            ys = np.array([r[field] for _, r in steady], dtype=float)
            slope = np.polyfit(xs, ys, 1)[0] if np.ptp(xs) > 0 else 0.0
            growth = (end - start) / start if start else 0.0
            trend = 1000 * slope / start if start else 0.0
            print(f"{n:<22} {field:<8} {start:>9.1f} {end:>9.1f} {growth:>+7.1%} {trend:>+25.1%}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--versions", type=int, default=2000)
    p.add_argument("--leaves", type=int, default=2)
    p.add_argument("--devices-per-leaf", type=int, default=100)
    p.add_argument("--selection", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=0.2, help="share of the versions counted as warm-up")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_soak_") as work:
        samples, output, code = run(args, work)
        if code != 0:
            sys.exit(f"the run failed (exit {code}):\n{output[-3000:]}")
        print("\n".join(line for line in output.splitlines() if "done in" in line or "s per version" in line))
        report(samples, args.versions, args.warmup)


if __name__ == "__main__":
    main()
