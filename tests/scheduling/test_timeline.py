"""The timing-only planner (``scheduling.timeline``, ``--dry-run``): the trace a real run writes, computed from
the schedule alone, and the figures it is planned with."""

from __future__ import annotations

import json

import pytest

from common.delays import DELAY_PRESETS
from scheduling.event_reference import make_schedule, reference_trace
from scheduling.timeline import run_timeline, timeline_summary, write_timeline


def schedule(**overrides):
    args = dict(selection_size=8, updates_per_version=2, min_hole_to_fill=1, max_model_version=30) | overrides
    return make_schedule(DELAY_PRESETS["paper"], 3, {"site-1": 20, "site-2": 20}, **args)


def test_the_timeline_is_the_reference_trace_and_its_figures_add_up(tmp_path):
    timeline = run_timeline(schedule(), fleet=40)
    assert timeline.trace == reference_trace(schedule())
    summary = write_timeline(timeline, str(tmp_path))
    assert [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()] == timeline.trace
    assert json.loads((tmp_path / "timeline.json").read_text()) == json.loads(json.dumps(summary))
    assert summary["versions"] == 30 and summary["updates"] == 58  # B = 2 from version 1 to 30
    assert sum(summary["staleness_histogram"].values()) == 58
    assert sum(summary["versions_in_each_time_unit"]) == 29 and summary["failure_rate"] == 0.0
    assert summary["versions_per_time_unit"] == pytest.approx(29 / timeline.sim_time)
    # 8 devices are always in flight, so at most 8 of 40 train at a moment
    assert 0 < summary["fleet_utilisation"] <= 8 / 40 and summary["devices_used"] <= 40


def test_a_synchronous_timeline_makes_one_version_per_round():
    summary = timeline_summary(
        run_timeline(schedule(updates_per_version=8, min_hole_to_fill=8, max_model_version=5), 40)
    )
    assert summary["updates"] == 32 and summary["staleness_histogram"] == {0: 32}


def test_dry_run_writes_the_trace_a_real_run_writes_and_starts_no_job(tmp_path, monkeypatch, capsys):
    """``tests/e2e/test_exact_time.py`` shows a real run's trace equals the reference; so does the dry run's. The job
    script's entry point runs in this process (a fresh interpreter's torch import cost seconds, and checked
    nothing more): NVFlare's environment is never made."""
    from jobs.pt_job_fedrevive import main
    from jobs.run import driver
    from tests.e2e.test_exact_time import COMMON, reference

    monkeypatch.setattr(driver, "make_env", lambda *a, **k: pytest.fail("the dry run started a job"))
    flags = [*COMMON, "--method", "fedbuff", "--max-model-version", "12", "--dry-run", "--output", str(tmp_path)]
    flags += ["--workspace", str(tmp_path / "ws")]
    assert main(flags) == 0
    assert [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()] == reference("fedbuff")
    assert "dry run: 12 versions" in capsys.readouterr().out and not (tmp_path / "ws").exists()  # no workspace
    with pytest.raises(SystemExit) as refused:
        main(["--dry-run", "--resume", str(tmp_path)])
    assert refused.value.code == 2 and "leave out --resume" in capsys.readouterr().err
