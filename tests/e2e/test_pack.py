"""Packs end to end (``docs/packs.md``), on one small run (2 leaves x 4 devices, a server learning rate of 1 so the
model moves), each packed run against the same run alone:

* FedBuff's two seeds as ONE NVFlare job from a sweep whose candidate repeats them (the sweep runs the job script's
  ``--seeds``), and from ``jobs.api.run(..., seeds=...)``; the same sweep with ``--pack 1`` runs each seed as a job
  of its own, as before packs, and gives the candidate the same objective;
* FedAvg, FedBuff and FedRevive, two seeds each, as ONE job from the job script's ``--runs``: each leaf sums the
  synchronous FedAvg runs' selections and forwards the buffered runs' updates one by one, per run
  (``simulation.versioned_updater``'s ``sums``), and the runs' devices train in the leaves' shared groups.

* Each seed's results are in ``OUTPUT/seed-N``, and the table printed at the end shows each seed's final accuracy
  and their mean +- std as computed from the seeds' ``metrics.json``; the API's ``SeedsResult`` holds the same.

* Each run's ``events.jsonl`` equals its standalone run's, line for line: each run has its own schedule and
  applier (``scheduling.run_server``), so its trace is its standalone trace whatever the other run does.
* Each run's accuracies equal its standalone run's within ``ACCURACY_TOLERANCE``: release n of both runs trains in
  one cross-run group (``processors.pack_trainer``, lock-step by release), and a device's diff there equals its
  standalone group's only up to floating-point summation order (1e-5 on a diff, tests/processors/
  test_pack_trainer.py), so the models differ in their last bits and an accuracy may flip a test sample or two;
  the tolerance is a few test samples, far below what a wrong start (another run's weights) or a lost update moves.
  Each run's devices train from their own run's weights (``processors.compute_context``'s cache is keyed by the
  run's processor: run 1's version 2 is not run 0's), each run's leaf sums its own selections (FedAvg), each run's
  strategy keeps its own seed and state (FedRevive's teachers, generator and pool) in its own global model.
* FedRevive's ``fedrevive_log.jsonl``, written by each run's strategy into its run's results folder, has its
  standalone run's phases and versions (but the wall-clock fields), distillation included.
* Two runs of the same pack (the job script's and the API's) are bit for bit the same: each leaf trains release n
  of every run together once every run has made it, so the groups are a function of the schedules, not of when
  each run's releases reach a leaf.

Each pack and the standalone jobs it is checked against run at once (their results do not depend on it): the two
sweeps (the seeds' pack, and FedBuff's two seeds alone), then the mixed pack and FedAvg's and FedRevive's seeds
alone.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
import yaml

from benchmarks.lib.fedrevive_small import FEDREVIVE_SMALL
from common.result_files import PACK_MANIFEST
from fedrevive.config import LOG_FILE, LOG_WALL_CLOCK
from tests.conftest import PYTHON, REPO, digest, outputs_when_done

SMALL = [
    "--num-leaf-nodes", "2", "--devices-per-leaf", "4", "--device-selection-size", "4", "--delays", "paper",
    "--synthetic-size", "600", "--subset-size", "40", "--local-iters", "2", "--local-batch-size", "16",
    "--local-lr", "0.02", "--global-lr", "1.0", "--eval-backlog", "wait",
]  # fmt: skip
# each method's flags, and the events a run of it has (not vacuous)
METHODS = {
    # B = 2: versions 2..6 of two updates each
    "fedbuff": (["--method", "fedbuff", "--num-updates-for-model", "2", "--min-hole-to-fill", "1",
                 "--max-model-version", "6"], 10),
    # every selected device: versions 2..3 of four updates each, summed by each leaf
    "fedavg": (["--method", "fedavg", "--max-model-version", "3"], 8),
    # B = 1: versions 2..8, distillation from version 2 and revival from 3 (``FEDREVIVE_SMALL``)
    "fedrevive": (["--method", "fedrevive", "--num-updates-for-model", "1", "--min-hole-to-fill", "1",
                   "--max-model-version", "8", *FEDREVIVE_SMALL], 7),
}  # fmt: skip
API_OPTIONS = {
    "num_leaf_nodes": 2, "devices_per_leaf": 4, "device_selection_size": 4, "num_updates_for_model": 2,
    "min_hole_to_fill": 1, "max_model_version": 6, "delays": "paper", "synthetic_size": 600, "subset_size": 40,
    "local_iters": 2, "local_batch_size": 16, "local_lr": 0.02, "global_lr": 1.0, "eval_backlog": "wait",
}  # fmt: skip
"""FedBuff's flags (``SMALL`` and ``METHODS["fedbuff"]``) as ``jobs.api.run``'s options."""
SEEDS = (3, 4)
# accuracies of a run in a pack against alone: a few of the small run's test samples (see the module docstring)
ACCURACY_TOLERANCE = 0.03


def run(args: list[str]) -> str:
    proc = subprocess.run([PYTHON, *args], cwd=REPO, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(procs: list[subprocess.Popen]) -> list[str]:
    """Each started job's output once it has ended with exit code 0 (``outputs_when_done``)."""
    return outputs_when_done(procs, 500)


def curve(folder) -> list[tuple[int, float]]:
    versions = json.loads((folder / "metrics.json").read_text())["versions"]
    return [(v["version"], v["accuracy"]) for v in versions if v.get("accuracy") is not None]


def final_accuracy(folder) -> float:
    return json.loads((folder / "metrics.json").read_text())["versions"][-1]["accuracy"]


def fedrevive_log(folder) -> list[dict]:
    lines = (folder / LOG_FILE).read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in LOG_WALL_CLOCK} for line in lines]


@dataclass
class MethodRuns:
    """A method's runs in one pack (seed 3 and seed 4) and each seed alone."""

    pack: Path  # the pack's --output: a folder per run
    printed: str  # what the pack's job script printed
    folders: dict[int, tuple[Path, Path]]  # seed -> (its packed results, its standalone results)


def alone(tmp: Path, method: str) -> tuple[list[subprocess.Popen], dict[int, Path]]:
    """Each seed of ``method`` run alone, started: the processes and each seed's results folder."""
    folders = {s: tmp / f"alone-{method}-{s}" for s in SEEDS}
    flags = [*SMALL, *METHODS[method][0]]
    return [
        start(["jobs/pt_job_fedrevive.py", *flags, "--seed", str(s), "--output", str(f)]) for s, f in folders.items()
    ], folders


def run_flags(flags: list[str]) -> dict[str, str]:
    """A run of ``--runs FILE``: its ``--flag value`` pairs as the file's ``{flag: value}``."""
    return {flag.removeprefix("--"): value for flag, value in zip(flags[::2], flags[1::2], strict=True)}


def seeds_spec(workspace: Path) -> str:
    """A sweep of one candidate, FedBuff's flags (``SMALL`` and ``METHODS["fedbuff"]``), repeated over ``SEEDS``."""
    base = {k: yaml.safe_load(v) for k, v in run_flags([*SMALL, *METHODS["fedbuff"][0]]).items()}
    spec = {"base": base | {"workspace": str(workspace)}, "repeat": {"seed": list(SEEDS)}}
    return json.dumps(spec | {"objective": {"metric": "final_accuracy"}})  # JSON is YAML


def sweep(spec: Path, folder: Path, *args: str) -> subprocess.Popen:
    cmd = [PYTHON, "-m", "jobs.sweep", str(spec), "--output", str(folder), "--no-bar", "--pruner", "none", *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@dataclass
class SeedSweeps:
    """The seeds' sweep both ways: packed (its candidate's seeds one job) and apart (``--pack 1``)."""

    packed: Path  # the packed sweep's --output
    apart: Path  # the --pack 1 sweep's --output
    printed: list[str]  # what each sweep printed (packed, apart)


@pytest.fixture(scope="module")
def seed_sweeps(tmp_path_factory) -> SeedSweeps:
    """One sweep whose candidate repeats FedBuff's two seeds, run twice at once (three jobs): packed, its seeds as
    one job (the job script's ``--seeds``), and with ``--pack 1``, each seed its own job."""
    tmp = tmp_path_factory.mktemp("pack-seeds")
    spec = tmp / "seeds.yaml"
    spec.write_text(seeds_spec(tmp / "ws"))
    procs = [sweep(spec, tmp / "packed", "--parallel", "1"), sweep(spec, tmp / "apart", "--pack", "1")]
    return SeedSweeps(tmp / "packed", tmp / "apart", outputs_when_done(procs, 600))


@pytest.fixture(scope="module")
def seeds_pack(seed_sweeps) -> MethodRuns:
    """FedBuff's two seeds as one job (the packed sweep's only trial, ``trials/0000``: what its job script printed
    is the trial's log), and each seed alone (the ``--pack 1`` sweep's trials)."""
    trials = seed_sweeps.packed / "trials"
    printed = (trials / "0000.log").read_text()
    assert "a pack of 2 runs in one job" in printed
    folders = {s: (trials / "0000" / f"seed-{s}", seed_sweeps.apart / "trials" / f"0000-seed{s}") for s in SEEDS}
    return MethodRuns(trials / "0000", printed, folders)


@pytest.fixture(scope="module")
def mixed_pack(seeds_pack, tmp_path_factory) -> dict[str, MethodRuns]:
    """FedAvg, FedBuff and FedRevive, two seeds each, as ONE job from the job script's ``--runs`` (six runs named
    ``METHOD-SEED``), and FedAvg's and FedRevive's seeds alone (FedBuff's are ``seeds_pack``'s): five jobs at once."""
    tmp = tmp_path_factory.mktemp("pack-mixed")
    runs = {f"{m}-{s}": {**run_flags(METHODS[m][0]), "seed": s} for m in METHODS for s in SEEDS}
    (tmp / "runs.json").write_text(json.dumps(runs))
    procs = [
        start(["jobs/pt_job_fedrevive.py", *SMALL, "--runs", str(tmp / "runs.json"), "--output", str(tmp / "pack")])
    ]
    standalone = {"fedbuff": {s: f for s, (_, f) in seeds_pack.folders.items()}}
    for method in ("fedavg", "fedrevive"):
        started, standalone[method] = alone(tmp, method)
        procs += started
    printed = finish(procs)[0]
    assert "a pack of 6 runs in one job" in printed
    table = {
        line.split()[0]: line.split()[3]
        for line in printed.splitlines()
        if line.split()[:1] and line.split()[0] in runs
    }
    assert table == dict.fromkeys(runs, "completed"), printed[-3000:]
    return {
        m: MethodRuns(tmp / "pack", printed, {s: (tmp / "pack" / f"{m}-{s}", standalone[m][s]) for s in SEEDS})
        for m in METHODS
    }


@pytest.fixture(scope="module")
def packed(seeds_pack):
    """FedBuff's pack of seeds from the job script (launched by the sweep): its folder and what it printed."""
    return seeds_pack.pack, seeds_pack.printed


# each packed run against its standalone run: FedBuff's seeds from --seeds, and every method's in the mixed pack
PACKED = [("seeds", "fedbuff"), *(("mixed", m) for m in METHODS)]


@pytest.fixture(scope="module", params=PACKED, ids=[f"{p}-{m}" for p, m in PACKED])
def runs(request):
    """A method and its runs in one of the packs: ``(method, {seed: (packed results, standalone results)})``."""
    pack, method = request.param
    made = request.getfixturevalue("seeds_pack") if pack == "seeds" else request.getfixturevalue("mixed_pack")[method]
    return method, made.folders


def test_each_seed_has_its_folder_and_the_printed_mean_and_std_are_the_seeds(packed):
    folder, out = packed
    assert sorted(p.name for p in folder.iterdir()) == [PACK_MANIFEST] + [f"seed-{s}" for s in SEEDS]
    assert json.loads((folder / PACK_MANIFEST).read_text()) == {
        "kind": "seeds",
        "runs": {str(s): f"seed-{s}" for s in SEEDS},
    }
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
    for seed in SEEDS:  # the API's pack is the job script's: the same schedules, and the same bits (lock-step)
        mine = (tmp_path / f"seed-{seed}" / "events.jsonl").read_text()
        assert mine == (packed[0] / f"seed-{seed}" / "events.jsonl").read_text()
        assert digest(tmp_path / f"seed-{seed}" / "global_model.pt") == digest(
            packed[0] / f"seed-{seed}" / "global_model.pt"
        )


def only_trial(folder: Path) -> optuna.trial.FrozenTrial:
    names = optuna.study.get_all_study_names(f"sqlite:///{folder / 'study.db'}")
    (trial,) = optuna.load_study(study_name=names[0], storage=f"sqlite:///{folder / 'study.db'}").get_trials()
    return trial


def test_a_sweeps_candidate_runs_its_seeds_as_one_job_with_the_results_of_one_job_each(seed_sweeps):
    """By default a candidate's seeds run as ONE job (the job script's ``--seeds``, ``jobs.sweep.pack``), each seed's
    results in its run's folder (``trials/0000/seed-N``); with ``--pack 1`` each seed is a job of its own
    (``trials/0000-seedN``). Each seed's events are the same line for line both ways, and its accuracies are the
    same (this pair's, bit for bit; in general to summation order, ``ACCURACY_TOLERANCE``), so the candidate's
    objective is too."""
    assert "[sweep] a candidate's 2 seeds run as one job of 2 runs" in seed_sweeps.printed[0], seed_sweeps.printed[0]
    packed, apart = seed_sweeps.packed / "trials", seed_sweeps.apart / "trials"
    assert sorted(p.name for p in packed.iterdir()) == ["0000", "0000.log"]  # one job, one log
    assert sorted(p.name for p in apart.iterdir()) == ["0000-seed3", "0000-seed3.log", "0000-seed4", "0000-seed4.log"]
    for seed in SEEDS:
        mine, alone = packed / "0000" / f"seed-{seed}", apart / f"0000-seed{seed}"
        events = (mine / "events.jsonl").read_text().splitlines()
        assert len(events) == METHODS["fedbuff"][1] and events == (alone / "events.jsonl").read_text().splitlines()
        assert len({a for _, a in curve(mine)}) > 1 and curve(mine) == curve(alone)
    one, other = only_trial(seed_sweeps.packed), only_trial(seed_sweeps.apart)
    assert one.state == other.state == optuna.trial.TrialState.COMPLETE
    assert one.value == other.value and one.user_attrs["values"] == other.user_attrs["values"]
    assert [r["folder"] for r in one.user_attrs["runs"]] == ["trials/0000/seed-3", "trials/0000/seed-4"]
    assert [r["command"] for r in one.user_attrs["runs"]] == [r["command"] for r in other.user_attrs["runs"]]


@pytest.mark.parametrize("seed", SEEDS)
def test_each_runs_events_equal_its_standalone_runs_line_for_line(runs, seed):
    method, folders = runs
    packed, alone = folders[seed]
    events = (packed / "events.jsonl").read_text().splitlines()
    assert len(events) == METHODS[method][1]  # not vacuous
    assert events == (alone / "events.jsonl").read_text().splitlines()
    other = folders[SEEDS[1 - SEEDS.index(seed)]][0]
    assert events != (other / "events.jsonl").read_text().splitlines()  # two seeds: two schedules


@pytest.mark.parametrize("seed", SEEDS)
def test_each_runs_accuracies_and_log_are_its_standalone_runs_to_summation_order(runs, seed):
    method, folders = runs
    packed, alone = folders[seed]
    assert len({a for _, a in curve(alone)}) > 1  # the model learns
    mine, theirs = curve(packed), curve(alone)
    assert [v for v, _ in mine] == [v for v, _ in theirs]
    gap = max(abs(a - b) for (_, a), (_, b) in zip(mine, theirs, strict=True))
    print(f"{method} seed {seed}: largest accuracy gap to its standalone run {gap:.4f}")
    assert gap <= ACCURACY_TOLERANCE
    if method == "fedrevive":  # its strategy's own log, in its run's folder, distillation and revival included
        log = fedrevive_log(packed)
        assert len(log) == METHODS[method][1] and any(r["phase"] == "distill" and r["beta"] > 0 for r in log)
        keys = ("client_id", "tau", "phase")  # what the schedule decides; its losses and beta move with the model
        assert [[r[k] for k in keys] for r in log] == [[r[k] for k in keys] for r in fedrevive_log(alone)]


def leaf_logs(folder) -> dict[str, list[tuple]]:
    """Each leaf's report lines (``leaf_<leaf>.jsonl``) as what the schedule decides: device, version, selection,
    success (the wall clock, group and seconds are the leaf's timing)."""
    found = {}
    for path in sorted(folder.glob("leaf_*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        found[path.name] = sorted((r["device"], r["version"], r["selection"], r["ok"]) for r in lines)
    return found


def test_each_packed_run_has_its_standalone_runs_leaf_logs_and_the_leaves_plans(runs):
    """The leaves' report lines of a pack name their run: each run's ``leaf_<leaf>.jsonl`` has the same line for
    every update its standalone run applied, and its ``metrics.json`` the leaves' plans and bulk links. Lines of updates never
    applied (devices training when the run ended) may differ: a standalone job ends with its run, a pack goes on."""
    _, folders = runs
    for packed_run, alone in folders.values():
        mine, theirs = leaf_logs(packed_run), leaf_logs(alone)
        assert sorted(mine) == sorted(theirs) == ["leaf_site-1.jsonl", "leaf_site-2.jsonl"]
        events = [json.loads(line) for line in (alone / "events.jsonl").read_text().splitlines()]
        applied = {(r["device"], r["base_version"]) for r in events}
        for logs in (mine, theirs):  # every applied update's device logged its training
            assert applied <= {(d, v) for lines in logs.values() for d, v, _, ok in lines if ok}
        for leaf, lines in theirs.items():
            differ = (Counter(mine[leaf]) - Counter(lines)) + (Counter(lines) - Counter(mine[leaf]))
            assert not {(d, v) for d, v, _, _ in differ} & applied, (leaf, differ)  # only updates never applied
        metrics, standalone = (json.loads((f / "metrics.json").read_text()) for f in (packed_run, alone))
        assert metrics["leaf_plans"].keys() == standalone["leaf_plans"].keys() == {"site-1", "site-2"}
        assert metrics["groups"]["devices"] >= len(events)
        # --bulk auto: each leaf's diffs and versions through shared memory, in the pack as alone
        assert metrics["bulk"] == standalone["bulk"] == {"site-1": "shm", "site-2": "shm"}


def test_each_packed_run_writes_its_own_tensorboard_curve_as_its_standalone_run_does(runs):
    """TensorBoard is every run's default tracker: each packed run's ``tensorboard/`` holds its own accuracy curve
    (its ``metrics.json``'s, not another run's), as its standalone run's folder holds its own."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, folders = runs
    for packed_run, alone in folders.values():
        for folder in (packed_run, alone):
            board = EventAccumulator(str(folder / "tensorboard")).Reload()
            steps, values = zip(*[(e.step, e.value) for e in board.Scalars("accuracy")], strict=True)
            assert list(steps) == [v for v, _ in curve(folder)]
            assert list(values) == pytest.approx([a for _, a in curve(folder)], abs=1e-5)  # float32 in TensorBoard
