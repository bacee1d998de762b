"""``bench_protocol.py``'s tables: each run's figures by side (a baseline commit, this one, each ``--bulk`` mode),
the medians of repeated runs, and the ratios between sides."""

from __future__ import annotations

import os

from benchmarks.perf.protocol_runs import (
    GPU_SAMPLES_PER_SECOND,
    NEAR_ZERO_TRAINING,
    OURS,
    PAPER_SAMPLES_PER_DEVICE,
    at_full_cpu,
    mean_group,
)

ROW = "{:<22} {:<26} {:>10} {:>9} {:>8} {:>10} {:>9} {:>12} {:>8} {:>14} {:>8} {:>12}"
NULL_ROW = "{:<22} {:<26} {:>10} {:>9} {:>10} {:>9} {:>12} {:>14} {:>8} {:>12} {:>12} {:>12}"


def sync_columns(r: dict) -> tuple[str, str]:
    syncs = r.get("syncs")
    return (f"{syncs['p50']:.1f}", f"{syncs['p99']:.1f}") if syncs else ("-", "-")


def print_table(args, measured: dict[str, dict[str, dict]], floors) -> None:
    """Near-zero training: each run against the compute floor of the groups its devices were trained in."""
    ours = next(v for k, v in measured.items() if k.startswith(OURS))
    cores = os.cpu_count() or 1
    best = ours.get("FedAvg", next(iter(ours.values())))["groups"].most_common(1)[0][0]
    print(
        f"\n{args.leaves} leaves x {args.devices_per_leaf} devices on {cores} cores, near-zero training "
        f"({' '.join(NEAR_ZERO_TRAINING)}); K = {args.selection or 'every device'}, FedBuff B = 2"
    )
    print(
        "compute floor: the job's processor alone, CPU ms per device by group size: "
        + ", ".join(f"{g}: {floors.at(g):.2f}" for g in sorted({1, best}))
    )
    print("each run's floor prices its devices at the group sizes they were trained in (leaf report lines)")
    head = ("run", "side", "devices/s", "x FedAvg", "x floor", "s/version", "CPU busy", "leaf ms/dev", "- floor")
    print(ROW.format(*head, "server ms/dev", "srv cores", "/s all busy"))
    for label, results in measured.items():
        base = results.get("FedAvg", {}).get("devices_per_second")
        for name, r in results.items():
            rate, floor = r["devices_per_second"], floors.of_run(r["groups"])
            print(
                ROW.format(
                    name,
                    label,
                    f"{rate:.1f}",
                    f"{rate / base:.2f}x" if base else "-",
                    f"{rate * floor / 1000 / cores:.2f}x",
                    f"{r['seconds_per_version']:.3f}",
                    f"{r['cpu_busy']:.0%}",
                    f"{r['cpu_ms']['leaves']:.2f}",
                    f"{r['cpu_ms']['leaves'] - floor:.2f}",
                    f"{r['cpu_ms']['server']:.2f}",
                    f"{r['server_cores']:.2f}",
                    at_full_cpu(r),
                )
            )


def print_null(args, measured: dict[str, dict[str, dict]]) -> None:
    """The protocol's ceiling: every device's training a fixed diff returned at once, against the GPU floor (the
    devices per second a GPU trains at the paper's 25 x 32 samples per device)."""
    cores = os.cpu_count() or 1
    gpu = args.gpu_samples_per_second
    gpu_devices = gpu / PAPER_SAMPLES_PER_DEVICE
    source = "an ESTIMATE: bench_engine's goal for the vectorised engine on an H100 (GPU_FIX_NOTES.md), not measured"
    source = "given (--gpu-samples-per-second)" if gpu != GPU_SAMPLES_PER_SECOND else source
    print(
        f"\n{args.model}, {args.leaves} leaves x {args.devices_per_leaf} devices on {cores} cores, NULL training (each "
        f"device returns a fixed diff at once); K = {args.selection or 'every device'}, FedBuff B = 2"
        + (f"; medians of {args.repeat} runs per side" if args.repeat > 1 else "")
    )
    print(
        f"GPU floor: {gpu:,.0f} samples/s ({source}); at the paper's {PAPER_SAMPLES_PER_DEVICE} samples per device "
        f"{gpu_devices:,.0f} devices/s. 'x GPU floor' > 1: the protocol outpaces that GPU"
    )
    head = ("run", "side", "devices/s", "x FedAvg", "s/version", "CPU busy", "leaf ms/dev", "server ms/dev")
    print(NULL_ROW.format(*head, "srv cores", "sync p50 ms", "sync p99 ms", "x GPU floor"))
    for label, results in measured.items():
        base = results.get("FedAvg", {}).get("devices_per_second")
        for name, r in results.items():
            rate = r["devices_per_second"]
            print(
                NULL_ROW.format(
                    name,
                    label,
                    f"{rate:.1f}",
                    f"{rate / base:.2f}x" if base else "-",
                    f"{r['seconds_per_version']:.4f}",
                    f"{r['cpu_busy']:.0%}",
                    f"{r['cpu_ms']['leaves']:.3f}",
                    f"{r['cpu_ms']['server']:.3f}",
                    f"{r['server_cores']:.2f}",
                    *sync_columns(r),
                    f"{rate / gpu_devices:.2f}x",
                )
            )
    print("'/s all busy' (the rate this CPU per device allows with every core busy): ", end="")
    print(", ".join(f"{name} ({label}) {at_full_cpu(r)}" for label, rs in measured.items() for name, r in rs.items()))


def print_tail(args, measured: dict[str, dict[str, dict]]) -> None:
    """Group sizes, versions kept, the ratios of each side to the first (the baseline commit, or the first
    ``--bulk`` mode), and between the FedBuff runs."""
    for label, results in measured.items():
        for name, r in results.items():
            line = f"{name} ({label}): mean group size {mean_group(r['groups']):.1f} devices per training call"
            if r["retention"]:
                n, memory, disk = r["retention"]
                line += f"; versions kept for pending devices: peak {n} ({memory:.1f} MB in memory, {disk:.1f} on disk)"
            print(line)
    labels = list(measured)
    for label in labels[1:]:
        for name, r in measured[label].items():
            base = measured[labels[0]].get(name)
            if base is None:
                continue
            rate = r["devices_per_second"] / base["devices_per_second"]
            server = r["cpu_ms"]["server"] / base["cpu_ms"]["server"]
            leaves = r["cpu_ms"]["leaves"] / base["cpu_ms"]["leaves"]
            print(
                f"{name}, {label} / {labels[0]}: {rate:.2f}x the devices/s, {server:.2f}x the server's CPU per device, "
                f"{leaves:.2f}x the leaves'"
            )
    for label, results in measured.items():
        paper, none = results.get("FedBuff, paper delays"), results.get("FedBuff, no delays")
        avg = results.get("FedAvg")
        if paper and avg:
            print(
                f"FedBuff paper delays / FedAvg ({label}): {paper['devices_per_second'] / avg['devices_per_second']:.2f}x"
            )
        if paper and none:
            print(
                f"FedBuff no delays / paper delays ({label}): {none['devices_per_second'] / paper['devices_per_second']:.2f}x"
            )
