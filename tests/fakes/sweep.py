"""The sweep tests' shared pieces (``tests/jobs/test_sweep*.py``): the spec's base flags, a spec file, the check
that a sweep is refused in one line before any trial, and a trial process that runs no job, with a record of the
fakes started, alive and stopped."""

from __future__ import annotations

import json
import math
import os

BASE = """
base:
  num-leaf-nodes: 2
  devices-per-leaf: 4
  device-selection-size: 4
  max_model_version: 5
"""

STARTED: list[dict] = []  # each fake's flags, in the order they started
LIVE: list = []  # the fakes alive now
PEAK: list[int] = [0]  # the most alive at once
STOPPED: list[dict] = []  # the flags of each fake the sweep stopped


def reset() -> None:
    """Forget every fake started so far (each test starts from none)."""
    STARTED.clear()
    LIVE.clear()
    STOPPED.clear()
    PEAK[0] = 0


class FakeTrial:
    """A trial's process that ends after a few polls; its accuracy is highest for a local lr near 1e-2, plus
    ``seed_bonus`` x its seed. Given ``seeds`` (a pack, ``jobs.sweep.pack``), it writes each seed's
    ``seed-N/metrics.json`` as a pack's job does: its versions after every poll, its outcome at the end."""

    seed_bonus = 0.0
    polls_to_end = 3  # rounds of polls before it ends (its records stop growing after the third)

    def __init__(self, flags: dict, folder: str, cores):
        self.flags, self.folder, self.polls, self.calls, self.code = flags, folder, 0, 0, None
        self.seeds = [int(s) for s in flags.get("seeds", [])]
        self.runs: dict[str, dict] = {}  # a pack of trials (``--runs FILE``): each run's flags
        if "runs" in flags:
            with open(flags["runs"]) as f:
                self.runs = json.load(f)
        self.pruned: set[str] = set()  # runs of the pack its server ended on a stop request
        self.accuracy = self.accuracy_of(int(flags.get("seed", 0)))
        self.wall_seconds, self.started = 1.0, 100.0
        STARTED.append(flags)
        LIVE.append(self)
        PEAK[0] = max(PEAK[0], len(LIVE))

    def accuracy_of(self, seed: int, flags: dict | None = None) -> float:
        """The accuracy of a run of ``flags`` (default the fake's own) at ``seed``."""
        lr = float((flags or self.flags).get("local-lr", 1e-2))
        return round(max(0.05, 0.9 - abs(math.log10(lr) + 2) / 4) + self.seed_bonus * seed, 4)

    def poll(self):
        self.calls += 1  # a pack's process is polled once per run in each round of the sweep: one round, one poll
        self.honour_stop_requests()
        if self.code is None and self.calls % max(1, len(self.seeds), len(self.runs)) == 0:
            self.polls += 1
            if self.polls > self.polls_to_end:
                self.code = 0
                LIVE.remove(self)
            self.write_seeds()
            self.write_runs()
        return self.code

    def records(self, accuracy: float | None = None):
        n = min(self.polls, 3)
        accuracy = self.accuracy if accuracy is None else accuracy
        return [{"version": v + 1, "accuracy": accuracy * v / 2, "sim_seconds": 4.0 * v} for v in range(n)]

    def write_seeds(self) -> None:
        from common.jsonio import write_json_atomic

        for seed in self.seeds:
            folder = os.path.join(self.folder, f"seed-{seed}")
            os.makedirs(folder, exist_ok=True)
            metrics = {"versions": self.records(self.accuracy_of(seed))}
            if self.code == 0:
                metrics["outcome"] = {"status": "completed", "reason": "version 3 (--max-model-version)"}
            write_json_atomic(os.path.join(folder, "metrics.json"), metrics)

    def write_runs(self) -> None:
        """A pack of trials: each run's ``metrics.json`` in its own ``output`` (a run ended on request keeps its
        outcome)."""
        from common.jsonio import write_json_atomic

        for name, flags in self.runs.items():
            if name in self.pruned:
                continue
            accuracy = self.accuracy_of(0, flags)
            os.makedirs(flags["output"], exist_ok=True)
            metrics = {"versions": self.records(accuracy)}
            if self.code == 0:
                metrics["outcome"] = {"status": "completed", "reason": "version 3 (--max-model-version)"}
            write_json_atomic(os.path.join(flags["output"], "metrics.json"), metrics)

    def honour_stop_requests(self) -> None:
        """As a pack's server does (``scheduling.pack_assessor``): a run whose folder holds a stop request ends
        ``pruned`` with its reason, the others go on."""
        from common.jsonio import write_json_atomic
        from common.result_files import STOP_REQUEST

        for name, flags in self.runs.items():
            request = os.path.join(flags["output"], STOP_REQUEST)
            if self.code is None and name not in self.pruned and os.path.exists(request):
                self.pruned.add(name)
                with open(request) as f:
                    reason = json.load(f)["reason"]
                metrics = {"versions": self.records(), "outcome": {"status": "pruned", "reason": reason}}
                write_json_atomic(os.path.join(flags["output"], "metrics.json"), metrics)
                STOPPED.append(flags)

    def stop(self):
        STOPPED.append(self.flags)
        if self in LIVE:
            LIVE.remove(self)
        self.code = 143
        return 143


class SeededFake(FakeTrial):
    """A fake whose accuracy also grows with its seed (0.01 per seed), so runs over seeds differ."""

    seed_bonus = 0.01


ONE_SEED = BASE + "grid: {seed: [1]}\n"  # the smallest sweep: one trial


def write_spec(tmp_path, text: str = ONE_SEED) -> str:
    """A spec file of ``text`` in ``tmp_path``; its path."""
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return str(path)


def refused_before_any_trial(tmp_path, capsys, text: str, *args: str) -> str:
    """Run the sweep of spec ``text`` with ``args``: it must be refused (exit 2) in one line, ``error: ...``, before
    any trial starts. That line."""
    from jobs.sweep.cli import main

    assert main([write_spec(tmp_path, text), "--output", str(tmp_path / "sweep"), "--no-bar", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert not (tmp_path / "sweep" / "trials").exists()
    return err


class BudgetFake(FakeTrial):
    """A fake that writes its ``metrics.json`` as a job on a time budget would: made every 2 simulated seconds up
    to its ``max-sim-time``, or, when its ``max-model-version`` comes first, ended there by that cap."""

    def poll(self):
        code = super().poll()
        if code == 0 and not os.path.exists(os.path.join(self.folder, "metrics.json")):
            from common.jsonio import write_json_atomic

            os.makedirs(self.folder, exist_ok=True)
            records = self.records()
            last = records[-1]
            if int(self.flags.get("max-model-version", 10)) <= last["version"]:
                outcome = {"status": "completed", "reason": f"version {last['version']} (--max-model-version)"}
            else:
                outcome = {"status": "completed", "reason": "simulated time (--max-sim-time)"}
            outcome |= {"version": last["version"], "sim_seconds": last["sim_seconds"]}
            federation = {"max_model_version": int(self.flags.get("max-model-version", 10))}
            federation["max_sim_time"] = float(self.flags["max-sim-time"]) if "max-sim-time" in self.flags else None
            config = {"method": self.flags.get("method", "fedrevive"), "federation": federation}
            metrics = {"config": config, "versions": records, "outcome": outcome}
            write_json_atomic(os.path.join(self.folder, "metrics.json"), metrics)
        return code

    def records(self):
        limit = float(self.flags.get("max-sim-time", 1e9))
        cap = int(self.flags.get("max-model-version", 10))
        made = [v for v in range(1, cap + 1) if 2.0 * (v - 1) <= limit]
        return [{"version": v, "accuracy": self.accuracy * v / len(made), "sim_seconds": 2.0 * (v - 1)} for v in made]
