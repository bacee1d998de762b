"""The first end-to-end pack (``docs/packs.md``): two seeds of a small FedBuff run (2 leaves x 4 devices, B = 2, 6
versions, a server learning rate of 1 so the model moves) as ONE NVFlare job, from the job script's ``--seeds``
and from ``jobs.api.run(..., seeds=...)``, each seed against the same seed run alone.

* Each seed's results are in ``OUTPUT/seed-N``, and the table printed at the end shows each seed's final accuracy
  and their mean +- std as computed from the seeds' ``metrics.json``; the API's ``SeedsResult`` holds the same.

* Each run's ``events.jsonl`` equals its standalone run's, line for line: each run has its own schedule and
  applier (``scheduling.run_server``), so its trace is its standalone trace whatever the other run does.
* Run 0's model and accuracies equal its standalone run's bit for bit. A later run's accuracies equal its standalone
  run's within ``ACCURACY_TOLERANCE``, and bit for bit, its model too: the runs of a pack train in groups of their
  own run and release (``simulation.fast_simulator.make_groups``; cross-run groups are step 4), the groups it has
  alone, each run's devices from its own run's weights of a version (``processors.compute_context``'s cache is
  keyed by the run's processor: run 1's version 2 is not run 0's). The tolerance is what cross-run groups will
  allow: a device's diff summed in another order than standalone, the engine's stated 1e-5 on a diff
  (``tests/processors/test_mixed_settings.py``), moves the model through a few versions far less than one test
  sample's worth of accuracy (1 / the test split); it allows two samples.
"""

from __future__ import annotations

import json
import statistics
import subprocess

import pytest

from tests.conftest import PYTHON, REPO, digest

FLAGS = [
    "--method", "fedbuff", "--num-leaf-nodes", "2", "--devices-per-leaf", "4", "--device-selection-size", "4",
    "--num-updates-for-model", "2", "--min-hole-to-fill", "1", "--max-model-version", "6", "--delays", "paper",
    "--synthetic-size", "600", "--subset-size", "40", "--local-iters", "2", "--local-batch-size", "16",
    "--local-lr", "0.02", "--global-lr", "1.0", "--eval-backlog", "wait",
]  # fmt: skip
API_OPTIONS = {
    "num_leaf_nodes": 2, "devices_per_leaf": 4, "device_selection_size": 4, "num_updates_for_model": 2,
    "min_hole_to_fill": 1, "max_model_version": 6, "delays": "paper", "synthetic_size": 600, "subset_size": 40,
    "local_iters": 2, "local_batch_size": 16, "local_lr": 0.02, "global_lr": 1.0, "eval_backlog": "wait",
}  # fmt: skip
"""``FLAGS`` as ``jobs.api.run``'s options."""
SEEDS = (3, 4)
TEST_SAMPLES = 600 // 5  # the synthetic dataset's test split is a fifth of --synthetic-size
ACCURACY_TOLERANCE = 2 / TEST_SAMPLES  # two test samples


def run(args: list[str]) -> str:
    proc = subprocess.run([PYTHON, *args], cwd=REPO, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def curve(folder) -> list[tuple[int, float]]:
    versions = json.loads((folder / "metrics.json").read_text())["versions"]
    return [(v["version"], v["accuracy"]) for v in versions if v.get("accuracy") is not None]


def final_accuracy(folder) -> float:
    return json.loads((folder / "metrics.json").read_text())["versions"][-1]["accuracy"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The job script's pack of both seeds (run 0: seed 3, run 1: seed 4): its folder and what it printed."""
    tmp = tmp_path_factory.mktemp("pack")
    out = run(["jobs/pt_job_fedrevive.py", *FLAGS, "--seeds", ",".join(map(str, SEEDS)), "--output", str(tmp)])
    assert "a pack of 2 runs in one job" in out
    return tmp, out


@pytest.fixture(scope="module")
def runs(packed, tmp_path_factory):
    """The pack's seeds and each seed alone, each job once."""
    tmp = tmp_path_factory.mktemp("alone")
    for seed in SEEDS:
        run(["jobs/pt_job_fedrevive.py", *FLAGS, "--seed", str(seed), "--output", str(tmp / f"alone-{seed}")])
    return {seed: (packed[0] / f"seed-{seed}", tmp / f"alone-{seed}") for seed in SEEDS}


def test_each_seed_has_its_folder_and_the_printed_mean_and_std_are_the_seeds(packed):
    folder, out = packed
    assert sorted(p.name for p in folder.iterdir()) == [f"seed-{s}" for s in SEEDS]
    finals = [final_accuracy(folder / f"seed-{s}") for s in SEEDS]
    assert len(set(finals)) == 2  # two seeds, two results: the mean and std below are not vacuous
    rows = out.splitlines()[-len(SEEDS) - 1 :]
    for seed, final, row in zip(SEEDS, finals, rows, strict=False):
        assert row.split() == [str(seed), f"{final:.4f}", "6", "completed", str(folder / f"seed-{seed}")]
    mean, std = statistics.mean(finals), statistics.stdev(finals)
    assert rows[-1] == f"final accuracy, mean +- std over 2 seeds: {mean:.4f} +- {std:.4f}"


API_SCRIPT = """
import json, sys
from jobs.api import run
result = run("fedbuff", seeds=[3, 4], output=sys.argv[1], **json.loads(sys.argv[2]))
runs = {s: [r.exit_code, r.output, r.final_accuracy] for s, r in result.runs.items()}
print(json.dumps({"code": result.exit_code, "runs": runs, "mean": result.mean, "std": result.std}))
"""


def test_the_api_runs_the_same_pack_and_returns_each_seeds_result_and_mean_and_std(packed, tmp_path):
    out = run(["-c", API_SCRIPT, str(tmp_path), json.dumps(API_OPTIONS)])
    got = json.loads(out.splitlines()[-1])
    finals = [final_accuracy(packed[0] / f"seed-{s}") for s in SEEDS]
    assert got["code"] == 0
    assert got["runs"] == {str(s): [0, str(tmp_path / f"seed-{s}"), a] for s, a in zip(SEEDS, finals, strict=True)}
    assert (got["mean"], got["std"]) == (statistics.mean(finals), statistics.stdev(finals))
    printed = out.splitlines()[-2]  # the same table as the job script's
    assert printed == packed[1].splitlines()[-1]
    for seed in SEEDS:  # the API's pack is the job script's: the same schedules
        mine = (tmp_path / f"seed-{seed}" / "events.jsonl").read_text()
        assert mine == (packed[0] / f"seed-{seed}" / "events.jsonl").read_text()


@pytest.mark.parametrize("seed", SEEDS)
def test_each_runs_events_equal_its_standalone_runs_line_for_line(runs, seed):
    packed, alone = runs[seed]
    events = (packed / "events.jsonl").read_text().splitlines()
    assert len(events) == 10  # versions 2..6 of B = 2 each (not vacuous)
    assert events == (alone / "events.jsonl").read_text().splitlines()
    other = runs[SEEDS[1 - SEEDS.index(seed)]][0]
    assert events != (other / "events.jsonl").read_text().splitlines()  # two seeds: two schedules


def test_the_first_runs_model_and_accuracies_are_its_standalone_runs_bit_for_bit(runs):
    packed, alone = runs[SEEDS[0]]
    assert digest(packed / "global_model.pt") == digest(alone / "global_model.pt")
    assert curve(packed) == curve(alone) and len({a for _, a in curve(alone)}) > 1  # the model learns


def test_a_later_runs_model_and_accuracies_equal_its_standalone_runs(runs):
    packed, alone = runs[SEEDS[1]]
    mine, theirs = curve(packed), curve(alone)
    assert [v for v, _ in mine] == [v for v, _ in theirs] and len({a for _, a in theirs}) > 1  # the model learns
    gap = max(abs(a - b) for (_, a), (_, b) in zip(mine, theirs, strict=True))
    assert gap <= ACCURACY_TOLERANCE, (mine, theirs)
    # its groups are its standalone ones (one run's, by release): the same bits
    assert mine == theirs and digest(packed / "global_model.pt") == digest(alone / "global_model.pt")
