"""``bench_transport_floor.py``'s table: the floor measured with each ``--bulk`` mode (each in a process of its own
when there are two), beside the job's figures (``--beside-job``), with the ratio of the two modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.bench_protocol import all_busy_rate
from benchmarks.bench_transport_floor import RATE_GOAL, SERVER_GOAL_MS, run_server

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_transport_floor.py")


def measured_floor(args, mode: str) -> dict:
    """``run_server``'s figures for ``--bulk mode``: in this process for one mode, else in a process of its own (the
    server's; NVFlare keeps a process's cells by name)."""
    if len(args.modes) == 1:
        args.bulk = mode
        return run_server(args)
    argv = [sys.executable, SCRIPT, "--measure", "--bulk", mode, "--model", args.model, "--leaves", str(args.leaves)]
    argv += [
        "--seconds",
        repr(args.seconds),
        "--warmup",
        repr(args.warmup),
        "--diffs-per-sync",
        str(args.diffs_per_sync),
    ]
    argv += ["--versions-per-update", repr(args.versions_per_update)]
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"bench_transport_floor: the --bulk {mode} measurement failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(args, job: dict | None) -> None:
    """Measure the floor with each ``--bulk`` mode and print the table (beside the job's figures, if any)."""
    cores = os.cpu_count() or 1
    if job:
        args.diffs_per_sync, args.versions_per_update = job["diffs_per_sync"], job["versions_per_update"]
        print(
            f"the job's traffic: {args.diffs_per_sync} diffs per report, {args.versions_per_update:.2f} versions per update"
        )
    columns = {}
    for mode in args.modes:
        columns[f"transport, {mode}"] = floor = measured_floor(args, mode)
        choices = ", ".join(f"{leaf}: {choice}" for leaf, choice in sorted(floor["bulk"].items()))
        print(
            f"NVFlare's transport alone, --bulk {mode}: {args.leaves} leaves, {args.diffs_per_sync} diffs up and "
            f"{floor['versions_per_sync']} versions down per sync, each {floor['blob_bytes'] / 1000:.0f} kB "
            f"({args.model}), {floor['updates']} updates in {args.seconds:g} s, {cores} cores"
            + (f" ({choices})" if choices else "")
        )
    if job:
        ms = job["cpu_ms"]
        columns = {f"the job, {args.modes[0]}": {"updates_per_s": job["devices_per_second"], "server_ms": ms["server"],
                   "leaves_ms": ms["leaves"], "server_cores": job["server_cores"]}} | columns  # fmt: skip
        first = columns[f"transport, {args.modes[0]}"]
        columns["job - transport"] = {
            k: columns[f"the job, {args.modes[0]}"][k] - first[k] for k in ("server_ms", "leaves_ms")
        }
    if len(args.modes) == 2:
        a, b = (columns[f"transport, {m}"] for m in args.modes)
        keys = ("updates_per_s", "server_ms", "leaves_ms", "server_cores", "sync_p50_ms", "sync_p99_ms")
        columns[f"{args.modes[0]} / {args.modes[1]}"] = {k: a[k] / b[k] for k in keys} | {"ratio": True}
    print(f"{'':26}" + "".join(f"{name:>20}" for name in columns) + f"{'goal':>12}")

    def row(label: str, key: str, digits: int, goal: str = "") -> None:
        def cell(c: dict) -> str:
            if key not in c:
                return ""
            return f"{c[key]:.2f}x" if c.get("ratio") else f"{c[key]:.{digits}f}"

        print(f"{label:26}" + "".join(f"{cell(c):>20}" for c in columns.values()) + f"{goal:>12}")

    for c in columns.values():
        if "server_ms" in c and not c.get("ratio"):
            c["all_ms"] = c["server_ms"] + c["leaves_ms"]
            if "updates_per_s" in c:
                c["all_busy"] = all_busy_rate(c["leaves_ms"], c["server_ms"])
    row("updates/s", "updates_per_s", 1, f"{RATE_GOAL:.0f}")
    row("server CPU ms per update", "server_ms", 3, f"{SERVER_GOAL_MS:.3f}")
    row("leaves CPU ms per update", "leaves_ms", 3)
    row("all CPU ms per update", "all_ms", 3, f"{cores * 1000 / RATE_GOAL:.3f}")
    row("server cores used", "server_cores", 2)
    row("sync round trip p50 ms", "sync_p50_ms", 2)
    row("sync round trip p99 ms", "sync_p99_ms", 2)
    row("/s all busy", "all_busy", 0, f"{RATE_GOAL:.0f}")
