"""``bench_protocol.py``'s two other modes: ``--cpu-scale`` (FedBuff at ``reproduce_fedrevive.py --scale cpu``'s
training against its floor) and ``--pool`` (seconds per version and memory by pool size)."""

from __future__ import annotations

import os

from benchmarks.lib.harness import run_job
from benchmarks.lib.scales import SCALES
from benchmarks.perf.protocol_runs import describe, job_flags, training_floor_ms


def cpu_scale(args, work: str) -> None:
    """FedBuff at the reproduction harness's cpu scale (``reproduce_fedrevive.py --scale cpu``: 25 Adam steps of
    batch 32 per device): updates per second against the training floor of its devices' groups."""
    flags = [
        *SCALES["cpu"]["flags"],
        "--method",
        "fedbuff",
        "--max-model-version",
        str(args.cpu_scale_versions),
        "--seed",
        str(args.seed),
        "--checkpoint-every",
        "-1",
        "--workspace",
        os.path.join(work, "ws-cpu"),
    ]
    flags += ["--eval-frequency", str(max(1, args.cpu_scale_versions // 10))]  # the later flag wins
    print("running FedBuff at the cpu scale ...", flush=True)
    out = os.path.join(work, "cpu-scale")
    r = describe(run_job("jobs/pt_job_fedrevive.py", flags, out), out)
    options = {"synthetic_difficulty": 1.0, "dirichlet_alpha": 0.5}
    floors = {g: training_floor_ms(max(8 * g, 40), args.seed, 20000, g, 100, 25, 32, **options) for g in r["groups"]}
    total = sum(r["groups"].values())
    floor = sum(n * floors[g] for g, n in r["groups"].items()) / total
    cores = os.cpu_count() or 1
    rate, floor_rate = r["devices_per_second"], 1000 * cores / floor
    print(f"cpu scale, FedBuff (K = 20, B = 2, 25 Adam steps of batch 32 per device), {cores} cores:")
    print(
        f"  updates per second: {rate:.2f}; training floor {floor_rate:.2f} ({floor:.1f} CPU ms per device in the "
        f"groups it was trained in: {dict(sorted(r['groups'].items()))}); floor / rate: {floor_rate / rate:.2f}x"
    )


def pools(args, work: str) -> None:
    sizes = [int(v) for v in args.pool.split(",")]
    rows = []
    for size in sizes:
        print(f"running pool {size} per leaf ...", flush=True)
        ws = os.path.join(work, f"pool{size}")
        result = run_job(
            "jobs/pt_job_fedavg.py",
            [*job_flags(args, size, args.selection or 200), "--workspace", os.path.join(ws, "ws")],
            os.path.join(ws, "out"),
        )
        steady = result.steady_state()
        rows.append(
            (size, steady["wall_seconds"] / (steady["to_version"] - steady["from_version"]), result.peak_rss_bytes)
        )
    base_size, base_s, base_rss = rows[0]
    print(f"{'pool/leaf':>10} {'s/version':>10} {'ratio':>7} {'peak RSS GB':>12} {'ratio':>7}")
    for size, seconds, rss in rows:
        print(f"{size:>10} {seconds:>10.2f} {seconds / base_s:>6.2f}x {rss / 2**30:>12.2f} {rss / base_rss:>6.2f}x")
    size, _, rss = rows[-1]
    if size > base_size:
        per_idle = (rss - base_rss) / (args.leaves * (size - base_size))
        print(f"memory per idle device: {per_idle:.0f} bytes (peak RSS difference over the added devices)")
