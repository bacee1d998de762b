"""Compressed updates on slow uplinks: accuracy at a fixed simulated-time budget (issue 60's goal).

FedBuff on ``reproduce_fedrevive.py``'s cpu scale (cifar10_convnet, K = 20, B = 2, 25 local Adam steps, the
paper's training delays), every device's uplink at ``--uplink-kbps`` (default 200 kbit/s: the convnet's
248,200-byte update takes 9.93 time units to send, against a mean training time of 1.3, so upload dominates) and
its downlink at ``--downlink-kbps`` (default 10,000: a version takes 0.2), until ``--budget`` simulated time units
have passed. By default on the generated data at difficulty 0 and 2 x 25 devices (``EFFECT``: each device takes
part about ten times, so an error-feedback residual comes back; ``--cpu-scale`` keeps the scale's hard data and
2 x 100 devices: there, at 500 kbit/s over 200 time units, top-1% learns far less per version than the dense
update and loses to it, while top-10% with error feedback beats it and top-10% without falls below, the figures in
PERFORMANCE_OPTIMIZATION.md). One run per compressor of ``--compressors``
(``none``, ``topk:0.01`` with error feedback, ``topk:0.01`` without: ``topk:0.01/off``; ``qsgd:4`` with
``--qsgd``), and one table: the compressor, the bytes per update (``processors.compress.transfer_bytes``), the
versions made by the budget, the accuracy at the budget (the last version, evaluated at the end) and the best,
and the megabytes the fleet moved up and down. The first lines print every setting, the job's flags as they
apply.

The goal: top-1% with error feedback reaches a higher accuracy at the budget than no compression (its updates
arrive 50x sooner, so more versions are made), and top-1% without error feedback a lower one than with it.
Accuracies are seeded (every version's model is a function of the seed), so the machine's load does not change
them; the wall seconds do.

    python benchmarks/perf/bench_compression.py --seed 0
    python benchmarks/perf/bench_compression.py --cpu-scale --uplink-kbps 500 --budget 200
    python benchmarks/perf/bench_compression.py --cpu-scale --uplink-kbps 500 --budget 200 \
        --compressors topk:0.1,topk:0.1/off

Extra job flags after ``--`` go to every run, last (e.g. ``-- --global-lr 0.1``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.lib.harness import run_job  # noqa: E402
from benchmarks.lib.scales import SCALES  # noqa: E402

CPU = SCALES["cpu"]
MODEL = "cifar10_convnet"  # the cpu scale's model (its flags)
EFFECT = ["--synthetic-difficulty", "0", "--devices-per-leaf", "25"]  # the default fleet and data (see above)


def parse_side(text: str) -> tuple[str, str]:
    """``COMPRESSOR[/on|off]`` as (compressor, --error-feedback value): ``topk:0.01/off`` -> ("topk:0.01", "off");
    without a suffix the job's default, ``auto`` (on for topk and randk)."""
    compress, _, feedback = text.strip().partition("/")
    return compress, feedback or "auto"


def side_flags(side: str, args: argparse.Namespace, extra: list[str]) -> list[str]:
    """A run's job flags: the cpu scale's FedBuff, the links, the budget and the side's compressor."""
    compress, feedback = parse_side(side)
    links = ["--uplink-kbps", f"{args.uplink_kbps:g}", "--downlink-kbps", f"{args.downlink_kbps:g}"]
    budget = ["--max-sim-time", f"{args.budget:g}", "--max-model-version", "100000"]  # the time budget ends it
    comp = [] if compress == "none" else ["--compress", compress, "--error-feedback", feedback]
    fleet = [] if args.cpu_scale else EFFECT
    return ["--method", "fedbuff", *CPU["flags"], *fleet, "--seed", str(args.seed), *links, *budget, *comp, *extra]


def applied(words: list[str]) -> list[str]:
    """Job flags as they apply: a flag given twice keeps its last value, in its first place (what argparse does)."""
    flags: dict[str, list[str]] = {}
    i = 0
    while i < len(words):
        has_value = i + 1 < len(words) and not words[i + 1].startswith("--")
        flags[words[i]] = words[i + 1 : i + 2] if has_value else []
        i += 2 if has_value else 1
    return [w for flag, value in flags.items() for w in (flag, *value)]


def label(side: str) -> str:
    """A side's name in the table: the compressor, and ``+ EF`` or ``no EF`` for one that can keep a residual."""
    from common.compression import CompressionConfig

    compress, feedback = parse_side(side)
    if compress == "none":
        return "none"
    config = CompressionConfig(compress=compress, error_feedback=feedback)  # type: ignore[arg-type]
    if not config.spec.biased and feedback == "auto":
        return compress  # an unbiased compressor keeps no residual by default
    on = config.feedback
    return f"{compress} {'+ EF' if on else 'no EF'}"


def row_of(side: str, records: list[dict], upload_bytes: int, wall: float) -> dict:
    """One table row from a run's ``metrics.json`` versions."""
    fleet = next((r["fleet"] for r in reversed(records) if r.get("fleet")), {})
    return {
        "compressor": label(side),
        "bytes per update": upload_bytes,
        "versions": records[-1]["version"],
        "accuracy at budget": records[-1]["accuracy"],
        "best accuracy": max(r["accuracy"] for r in records),
        "MB up": round(fleet.get("bytes_up", 0) / 1e6, 2),
        "MB down": round(fleet.get("bytes_down", 0) / 1e6, 2),
        "wall s": round(wall, 1),
    }


def table(rows: list[dict]) -> str:
    head = list(rows[0])
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        + ["| " + " | ".join(str(r[k]) for k in head) + " |" for r in rows]
    )


def settings(args: argparse.Namespace, extra: list[str]) -> str:
    """The first lines a run prints: the job's flags as they apply (a side's compressor aside) and the links' times."""
    from processors.compress import transfer_bytes

    full, _ = transfer_bytes(MODEL, "none")
    up = full * 8 / (args.uplink_kbps * 1000)
    down = full * 8 / (args.downlink_kbps * 1000)
    return (
        f"job flags: {' '.join(applied(side_flags('none', args, extra)))}\n"
        f"uplink {args.uplink_kbps:g} kbit/s (a full update {full} bytes: {up:.2f} time units), downlink "
        f"{args.downlink_kbps:g} kbit/s (a version {down:.2f} units); training ~ Exponential(mean 1, 1.3 or 1.6 "
        f"by speed class); budget {args.budget:g} simulated time units; chance 0.1"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--compressors", default="none,topk:0.01/on,topk:0.01/off", help="COMPRESSOR[/on|off], ...")
    p.add_argument("--qsgd", action="store_true", help="add qsgd:4")
    p.add_argument("--uplink-kbps", type=float, default=200.0)
    p.add_argument("--downlink-kbps", type=float, default=10000.0)
    p.add_argument("--budget", type=float, default=CPU["budget"], help="simulated time units")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu-scale", action="store_true", help="the cpu scale's own data and 2 x 100 devices")
    p.add_argument("--output", default=None, help="where the runs go (default: a new temporary folder)")
    args = p.parse_args(argv)
    args.output = args.output or tempfile.mkdtemp(prefix="bench_compression_")
    sides = [s for s in args.compressors.split(",") if s.strip()] + (["qsgd:4"] if args.qsgd else [])
    from processors.compress import transfer_bytes

    head = settings(args, extra)
    print(f"[bench_compression] runs in {args.output}\n{head}", flush=True)
    rows = []
    for side in sides:
        name = side.replace(":", "").replace("/", "-")
        result = run_job("jobs/pt_job_fedrevive.py", side_flags(side, args, extra), os.path.join(args.output, name))
        row = row_of(
            side, result.versions, transfer_bytes(MODEL, parse_side(side)[0])[0], result.ended - result.started
        )
        rows.append(row)
        print(" | ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    text = table(rows)
    with open(os.path.join(args.output, "results.md"), "w") as f:
        f.write(f"{head}\n\n{text}\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
