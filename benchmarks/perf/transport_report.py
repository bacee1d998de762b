"""``bench_transport_floor.py``'s table: the floor it measured with each ``--bulk`` mode, beside the job's figures
(``--beside-job``), with the ratio of the two modes and issue 33's goals. It takes the figures; it measures
nothing."""

from __future__ import annotations

import os

from benchmarks.perf.protocol_runs import all_busy_rate

SERVER_GOAL_MS = 0.5  # issue 33's goals: the server's CPU per update, and updates per second
RATE_GOAL = 1500.0


def print_report(args, floors: dict[str, dict], job: dict | None) -> None:
    """Print the floor measured with each ``--bulk`` mode (``floors``: mode -> ``run_server``'s figures) and the
    table, beside the job's figures (``job``: ``job_beside``'s, if any)."""
    cores = os.cpu_count() or 1
    if job:
        print(
            f"the job's traffic: {args.diffs_per_sync} diffs per report, {args.versions_per_update:.2f} versions per update"
        )
    columns = {}
    for mode in args.modes:
        columns[f"transport, {mode}"] = floor = floors[mode]
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
