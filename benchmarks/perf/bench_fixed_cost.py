"""What a SimEnv run pays besides its training: process start to its first version, its last version to the exit,
and the whole process, with where the time goes, from one run of this script.

The job (default: ``pt_job_fedavg.py --max-model-version 3 --devices-per-leaf 10 --device-selection-size 10
--subset-size 50 --seed 7``, almost no training) is run by ``benchmarks.lib.harness.run_job``; the clock starts just
before the process is started and stops when it has exited. The versions' times are the server's own
(``metrics.json``'s ``epoch`` of each evaluated version). The CPU seconds are the harness's samples of every
process of the job (every 50 ms, by role: the driver, the simulator's server processes, the leaves' workers) when
``metrics.json`` first holds version 1: on a shared machine the wall times move with the other users' load, the
CPU spent to the first version much less. "simulator to first version" leaves out the driver's phase (its imports
and plan, one process alone on a core: the phase the load moves most), from NVFlare's first log line on. The phases come from the time stamps of NVFlare's logs in the run's
``nvflare/`` folder, each from the phases it waits for (two run side by side: the server app and the leaves'
workers start together since the simulator starts the workers with the server app):

  driver            process start -> the simulator's first log line (imports, config, plan, the job's files,
                    the simulator process's own start)
  server cell       -> the server's cell has its listeners ("created backbone internal listener")
  server up         -> NVFlare asks for the server app ("Deploy and start the Server App")
  server app        server up -> the server's workflow is running ("Server runner starting")
  workers asked     server up -> NVFlare starts the first leaf's worker process ("Simulate Run client")
  leaves start      the later of the two -> the last leaf has its runner started ("client runner started")
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

"refused flag" is the same command with ``--local-lr -1`` added, from its start to its exit (2): how long a user
waits for the one line that names the fix.

``--baseline-rev REV`` runs the same job first on an earlier commit (a temporary git worktree, its own code first
on ``PYTHONPATH``), then on this one, ``--repeat N`` times each, alternating, and prints each figure's median and
the ratios. Every run writes into a fresh folder under ``--work`` (default: a temporary one)."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.lib.harness import REPO, ROLES, job_command, run_job, worktree  # noqa: E402

SCRIPT = "jobs/pt_job_fedavg.py"
FLAGS = "--max-model-version 3 --devices-per-leaf 10 --device-selection-size 10 --subset-size 50 --seed 7"
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - (\S+) - \w+ - (.*)$")
START_PHASES = (  # (name, the log line that ends it: logger, text in the message, which one; the phases it follows)
    ("driver", None, ()),
    ("server cell", ("CoreCell", "created backbone internal listener", "first"), ("driver",)),
    ("server up", ("SimulatorRunner", "Deploy and start the Server App", "first"), ("server cell",)),
    ("server app", ("ServerRunner", "Server runner starting", "first"), ("server up",)),
    ("workers asked", ("SimulatorClientRunner", "Simulate Run client", "first"), ("server up",)),
    ("leaves start", ("ClientRunner", "client runner started", "last"), ("server app", "workers asked")),
)
FIGURES = (
    "start to first version",
    "simulator to first version",
    "last version to exit",
    "whole process",
    "CPU to first version",
    "refused flag",
)
REFUSED = ["--local-lr", "-1"]  # a value the job refuses before any process starts (exit 2)
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


def refusal_seconds(script: str, flags: list[str], out: str, repo: str) -> float:
    """Seconds from starting the job from ``repo`` with ``REFUSED`` added to its exit (2, with one line naming the
    fix): what a user waits for that line."""
    import subprocess
    import time

    argv, env = job_command(script, [*flags, *REFUSED], out, repo)
    started = time.time()
    done = subprocess.run(argv, cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    seconds = time.time() - started
    if done.returncode != 2:
        sys.exit(f"{' '.join(REFUSED)} was not refused (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr}")
    return seconds


def measure(script: str, flags: list[str], out: str, repo: str) -> dict:
    """One run of the job from ``repo``: the fixed-cost figures, the CPU seconds to the first version and the
    phases, in seconds; then the same command with a refused flag (``refusal_seconds``)."""
    result = run_job(script, flags, out, sample_s=0.05, repo=repo)
    started, ended, versions = result.started, result.ended, result.versions
    first, last = versions[0]["epoch"], versions[-1]["epoch"]
    lines = log_lines(os.path.join(out, "nvflare"))
    phases, stamps = {}, {}
    for name, marker, after in START_PHASES:
        since = max((stamps[a] for a in after if stamps.get(a) is not None), default=started)
        stamps[name] = lines[0][0] if marker is None else find(lines, *marker)
        phases[name] = None if stamps[name] is None else stamps[name] - since
    phases["first version"] = first - max(t for t in stamps.values() if t is not None)
    for name, marker in END_PHASES:
        stamp = find(lines, *marker)
        phases[f"+{name}"] = None if stamp is None else stamp - last
    phases["+exit"] = ended - last
    done, end_run = phases["+workflow done"], phases["+END_RUN"]
    # NVFlare's own wait between the two, whatever the evaluation of the last version does meanwhile
    phases["workflow done -> END_RUN"] = None if done is None or end_run is None else end_run - done
    cpu = result.cpu_at_version.get(versions[0]["version"], {})
    return {
        "start to first version": first - started,
        "simulator to first version": first - stamps["driver"],  # the driver's imports and plan left out
        "last version to exit": ended - last,
        "whole process": ended - started,
        "CPU to first version": sum(cpu.values()) if cpu else None,
        "refused flag": refusal_seconds(script, flags, out + "-refused", repo),
        "cpu": {f"CPU {role}": cpu.get(role) for role in ROLES},
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
    for key in FIGURES:
        print(f"{key:<24}" + "".join(f"{fmt([r[key] for r in runs[label]]):>26}" for label in labels))
    for key in runs[labels[0]][0]["cpu"]:
        print(f"  {key:<22}" + "".join(f"{fmt([r['cpu'][key] for r in runs[lb]]):>26}" for lb in labels))
    print("phases:")
    for phase in runs[labels[0]][0]["phases"]:
        print(f"  {phase:<22}" + "".join(f"{fmt([r['phases'][phase] for r in runs[lb]]):>26}" for lb in labels))
    if args.baseline_rev:
        base, ours = runs[args.baseline_rev], runs["this commit"]
        for key in FIGURES:
            values = [[r[key] for r in side if r[key] is not None] for side in (ours, base)]
            if all(values):
                print(f"{key}: {statistics.median(values[0]) / statistics.median(values[1]):.2f}x {args.baseline_rev}")


if __name__ == "__main__":
    main()
