"""The utilisation profiles side by side: the same small real job once per ``--profile``, back to back.

Default case: synchronous FedAvg, 2 leaves x 20 devices, 20 devices a round, 3 model versions, synthetic data.
For each profile: seconds per model version and devices trained per second (from the job's ``metrics.json``),
peak RSS of the job's whole process tree (sampled with psutil every 0.2 s) and peak VRAM (``metrics.json``
``system``, when the job's monitor saw a GPU; else n/a), then each figure as a ratio to ``high``.
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

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from benchmarks.lib.harness import fleet_flags  # noqa: E402

SAMPLE_S = 0.2


def tree_rss(proc: psutil.Process) -> int:
    """Resident memory of a process and all its descendants, in bytes."""
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_job(flags: list[str], out: str) -> dict:
    started = time.time()
    popen = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "jobs", "pt_job_fedavg.py"), *flags, "--output", out],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        root = psutil.Process(popen.pid)
        while not stop.is_set():
            peak = max(peak, tree_rss(root))
            stop.wait(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = popen.communicate()[0]
    stop.set()
    sampler.join()
    if popen.returncode:
        sys.exit(f"job failed ({' '.join(flags)}):\n{output[-3000:]}")
    from common.result_files import METRICS

    with open(os.path.join(out, METRICS)) as f:
        metrics = json.load(f)
    summary = metrics["summary"]
    system = metrics.get("system") or {}
    return {
        "seconds_per_version": summary["seconds_per_version"],
        "devices_per_second": summary["devices_per_second"],
        "peak_rss_gb": peak / 2**30,
        "peak_vram_gb": system.get("gpu_mem_used_gb_peak"),
        "process_seconds": time.time() - started,
    }


def ratio(value, base) -> str:
    if value is None or not base:
        return "n/a"
    return f"{value / base:.2f}x"


def main() -> None:
    from common.profiles import PROFILES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices-per-leaf", type=int, default=20)
    p.add_argument("--selection", type=int, default=20)
    p.add_argument("--versions", type=int, default=3)
    p.add_argument("--synthetic-size", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated, in the order to run")
    args = p.parse_args()
    common = [
        *fleet_flags(args.devices_per_leaf, args.selection, args.versions),
        "--synthetic-size",
        str(args.synthetic_size),
        "--seed",
        str(args.seed),
    ]
    work = tempfile.mkdtemp(prefix="bench_profiles_")
    results = {}
    for name in args.profiles.split(","):
        print(f"running --profile {name} ...", flush=True)
        results[name] = r = run_job(
            [*common, "--profile", name, "--workspace", os.path.join(work, name)], os.path.join(work, name, "out")
        )
        vram = "n/a" if r["peak_vram_gb"] is None else f"{r['peak_vram_gb']:.2f} GB"
        print(
            f"  {name:12s}: {r['seconds_per_version']:.2f} s per version, {r['devices_per_second']:.2f} devices/s, "
            f"peak RSS {r['peak_rss_gb']:.2f} GB, peak VRAM {vram} (whole process {r['process_seconds']:.1f} s)",
            flush=True,
        )
    base = results.get("high")
    if base:
        print("ratios vs high (s/version, devices/s, peak RSS, peak VRAM):")
        for name, r in results.items():
            print(
                f"  {name:12s}: {ratio(r['seconds_per_version'], base['seconds_per_version'])}, "
                f"{ratio(r['devices_per_second'], base['devices_per_second'])}, "
                f"{ratio(r['peak_rss_gb'], base['peak_rss_gb'])}, "
                f"{ratio(r['peak_vram_gb'], base['peak_vram_gb'])}"
            )


if __name__ == "__main__":
    main()
