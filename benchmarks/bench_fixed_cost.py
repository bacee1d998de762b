"""What a SimEnv run pays besides its training: process start to its first version, its last version to the exit,
and the whole process, with where the time goes, from one run of this script.

The job (default: ``pt_job_fedavg.py --max-model-version 3 --devices-per-leaf 10 --device-selection-size 10
--subset-size 50 --seed 7``, almost no training) is run as a subprocess; the clock starts just before the process
is started and stops when it has exited. The versions' times are the server's own (``metrics.json``'s ``epoch`` of
each evaluated version). The phases come from the time stamps of NVFlare's logs in the run's ``nvflare/`` folder:

  driver            process start -> the simulator's first log line (imports, config, plan, the job's files,
                    the simulator process's own start)
  server cell       -> the server's cell has its listeners ("created backbone internal listener")
  server up         -> NVFlare asks for the server app ("Deploy and start the Server App")
  server app        -> the server's workflow is running ("Server runner starting")
  workers asked     -> NVFlare starts the first leaf's worker process ("Simulate Run client")
  leaves start      -> the last leaf has its runner started ("client runner started")
  first version     -> the first evaluated version
  ...
and after the last evaluated version, each as seconds since that version (END_RUN may come first: an evaluation
still running holds END_RUN's handlers, not NVFlare's END_RUN itself):

  workflow done     the workflow's task is done (the run's outcome is decided; the leaves are told to end it)
  END_RUN           the server fires END_RUN (its workflow has ended, the leaves are told)
  server's end      the simulator's last log line ("Good Bye")
  exit              the driver process has exited (the plot, the summary)

and "workflow done -> END_RUN", NVFlare's wait between the two (under load the last version's evaluation can end
after either).

``--baseline-rev REV`` runs the same job first on an earlier commit (a temporary git worktree, its own code first
on ``PYTHONPATH``), then on this one, ``--repeat N`` times each, alternating, and prints each figure's median and
the ratios. Every run writes into a fresh folder under ``--work`` (default: a temporary one).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_protocol import worktree  # noqa: E402
from benchmarks.harness import REPO, start_job  # noqa: E402
from common.result_files import METRICS  # noqa: E402

SCRIPT = "jobs/pt_job_fedavg.py"
FLAGS = "--max-model-version 3 --devices-per-leaf 10 --device-selection-size 10 --subset-size 50 --seed 7"
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - (\S+) - \w+ - (.*)$")
START_PHASES = (  # (name, the log line that ends it: logger, text in the message, which one: first or last)
    ("driver", None),
    ("server cell", ("CoreCell", "created backbone internal listener", "first")),
    ("server up", ("SimulatorRunner", "Deploy and start the Server App", "first")),
    ("server app", ("ServerRunner", "Server runner starting", "first")),
    ("workers asked", ("SimulatorClientRunner", "Simulate Run client", "first")),
    ("leaves start", ("ClientRunner", "client runner started", "last")),
)
END_PHASES = (
    ("workflow done", ("ScatterAndGatherForEdge", "is done: assessment", "first")),
    ("END_RUN", ("ServerRunner", "END_RUN fired", "first")),
    ("server's end", ("MPM", "Good Bye", "last")),
)


def log_lines(nvflare_dir: str) -> list[tuple[float, str, str]]:
    """(epoch seconds, logger, message) of every line of every NVFlare log of the run, in time order."""
    found = []
    for folder, _dirs, files in os.walk(nvflare_dir):
        for name in files:
            if name != "log.txt":
                continue
            with open(os.path.join(folder, name), errors="replace") as f:
                for line in f:
                    m = STAMP.match(line)
                    if m:
                        stamp = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                        found.append((stamp, m.group(2), m.group(3)))
    return sorted(found)


def find(lines: list[tuple[float, str, str]], logger: str, text: str, which: str) -> float | None:
    stamps = [t for t, lg, msg in lines if lg == logger and text in msg]
    if not stamps:
        return None
    return stamps[0] if which == "first" else stamps[-1]


def measure(script: str, flags: list[str], out: str, repo: str) -> dict:
    """One run of the job from ``repo``: the fixed-cost figures and the phases, in seconds."""
    started = time.time()
    proc = start_job(script, flags, out, repo)
    output = proc.communicate()[0]
    ended = time.time()
    if proc.returncode:
        sys.exit(f"job failed ({script} {' '.join(flags)}):\n{output[-3000:]}")
    with open(os.path.join(out, METRICS)) as f:
        versions = json.load(f)["versions"]
    first, last = versions[0]["epoch"], versions[-1]["epoch"]
    lines = log_lines(os.path.join(out, "nvflare"))
    phases, previous = {}, started
    for name, marker in START_PHASES:
        stamp = lines[0][0] if marker is None else find(lines, *marker)
        phases[name] = None if stamp is None else stamp - previous
        previous = stamp if stamp is not None else previous
    phases["first version"] = first - previous
    for name, marker in END_PHASES:
        stamp = find(lines, *marker)
        phases[f"+{name}"] = None if stamp is None else stamp - last
    phases["+exit"] = ended - last
    done, end_run = phases["+workflow done"], phases["+END_RUN"]
    # NVFlare's own wait between the two, whatever the evaluation of the last version does meanwhile
    phases["workflow done -> END_RUN"] = None if done is None or end_run is None else end_run - done
    return {
        "start to first version": first - started,
        "last version to exit": ended - last,
        "whole process": ended - started,
        "phases": phases,
    }


def fmt(values: list[float | None]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):.2f}" + (f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--script", default=SCRIPT)
    p.add_argument("--flags", default=FLAGS, help="the job's flags (one string)")
    p.add_argument("--baseline-rev", default="", help="an earlier commit to run the same job on (ratios)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each side, alternating")
    p.add_argument("--work", default="", help="where the runs write (default: a temporary folder)")
    args = p.parse_args()
    flags = args.flags.split()
    with contextlib.ExitStack() as stack:
        work = args.work or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-fixed-"))
        trees = {"this commit": REPO}
        if args.baseline_rev:
            trees = {args.baseline_rev: stack.enter_context(worktree(args.baseline_rev, work))} | trees
        runs: dict[str, list[dict]] = {label: [] for label in trees}
        for i in range(args.repeat):
            for label, tree in trees.items():
                slug = "".join(c if c.isalnum() else "-" for c in f"{label}-{i}")
                print(f"run {i + 1}/{args.repeat} on {label} ...", flush=True)
                runs[label].append(measure(args.script, flags, os.path.join(work, slug), tree))
    print(f"\n{args.script} {args.flags}; {os.cpu_count()} cores; median (min-max) of {args.repeat} run(s), seconds")
    labels = list(runs)
    print(f"{'':<24}" + "".join(f"{label:>26}" for label in labels))
    for key in ("start to first version", "last version to exit", "whole process"):
        print(f"{key:<24}" + "".join(f"{fmt([r[key] for r in runs[label]]):>26}" for label in labels))
    print("phases:")
    for phase in runs[labels[0]][0]["phases"]:
        print(f"  {phase:<22}" + "".join(f"{fmt([r['phases'][phase] for r in runs[lb]]):>26}" for lb in labels))
    if args.baseline_rev:
        base, ours = runs[args.baseline_rev], runs["this commit"]
        for key in ("start to first version", "last version to exit", "whole process"):
            ratio = statistics.median(r[key] for r in ours) / statistics.median(r[key] for r in base)
            print(f"{key}: {ratio:.2f}x {args.baseline_rev}")


if __name__ == "__main__":
    main()
