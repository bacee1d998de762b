"""The selection examples (``examples/power_of_choice.py``, ``examples/oort_selection.py``) run as users run them,
``--method module:Class``, on real NVFlare jobs on exact simulated time. Their policies choose from what the
devices reported (their last losses), so their traces differ from the uniform schedule's; an Oort run repeats bit
for bit from its seed across sync intervals (the policy sees only applied updates, never a report that reached
the server early), and one killed with SIGKILL and resumed ends exactly like it (the policy's state
is in the checkpoint); ``--dry-run`` refuses a policy that needs training results in one line
(``tests/jobs/test_refused_in_process.py``).

The jobs run at once (their results do not depend on it: exact time)."""

from __future__ import annotations

import collections
import json

from common.delays import DELAY_PRESETS
from scheduling.event_reference import make_schedule, reference_trace
from tests.conftest import SMALL_JOB, assert_same_run, examples_env, job_commands
from tests.e2e.job_runs import run_one_killed_and_resumed

VERSIONS = 12
COMMON = [*SMALL_JOB, "--seed", "11", "--max-model-version", str(VERSIONS)]
OORT = ["--method", "oort_selection:Oort", "--checkpoint-every", "2"]
RUNS = {
    "power_of_choice": ["--method", "power_of_choice:PowerOfChoice", "--poc-choices", "3"],
    # the same workers (hence the same training groups and report bits), other sync timing; killed, then resumed
    "oort": [*OORT, "--num-workers", "2", "--update-interval", "0.1"],
    "oort_again": [*OORT, "--num-workers", "2", "--update-interval", "0.4"],
}


def uniform_reference() -> list[dict]:
    """FedBuff's trace with the same flags (its presets: B = 2, min hole 1)."""
    schedule = make_schedule(
        DELAY_PRESETS["paper"], 11, {"site-1": 12, "site-2": 12}, 8, 2, 1, max_model_version=VERSIONS
    )
    return reference_trace(schedule)


def test_selection_examples_run_as_jobs_differ_from_uniform_repeat_and_resume_exactly(tmp_path):
    killed = tmp_path / "oort_again" / "out"
    finished = run_one_killed_and_resumed(job_commands(RUNS, tmp_path, *COMMON), "oort_again", killed, examples_env())
    assert set(finished) == {"power_of_choice", "oort"}
    for code, output in finished.values():
        assert code == 0, output[-3000:]
    traces, metrics = {}, {}
    for name in RUNS:
        out = tmp_path / name / "out"
        traces[name] = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
        metrics[name] = json.loads((out / "metrics.json").read_text())
        assert set(collections.Counter(r["version"] for r in traces[name]).values()) == {2}  # B = 2, exactly
        assert [r["arrival"] for r in traces[name]] == sorted(r["arrival"] for r in traces[name])
    uniform = uniform_reference()
    for name in RUNS:  # the first selection is the policy's too, and later ones follow the reported losses
        assert [r["device"] for r in traces[name]] != [r["device"] for r in uniform], name
    # a function of the seed and the policy, not of timing, and continued exactly from a checkpoint
    assert_same_run(tmp_path / "oort" / "out", killed)
    assert metrics["power_of_choice"]["config"]["method_settings"] == {"choices": 3.0}
    assert metrics["oort"]["config"]["method"] == "oort_selection:Oort"
