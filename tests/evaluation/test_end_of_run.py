"""The end of a run is safe: a slow evaluator skips superseded versions but always evaluates, records and saves the
last one; an interrupted run records itself; the end-of-run lines agree with ``metrics.json`` and name only files
that exist (the driver's watchdog: ``tests/jobs/test_watchdog.py``).

Fast and NVFlare-job free: the result components run on a stand-in engine, evaluation is made slow with a fake
that sleeps.
"""

from __future__ import annotations

import json
import threading
import time
import zipfile

import numpy as np
import torch
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.app_common.app_event_type import AppEventType

import evaluation.evaluator as evaluator_module
import evaluation.model_saver as saver_module
from common.protocol import CHECKPOINT_DUE, RUN_OUTCOME
from common.result_files import GLOBAL_MODEL, RUN_FILES
from evaluation.evaluator import GlobalModelEvaluator
from evaluation.events import (
    MODEL_SAVED,
    SAVED_VERSION,
    VERSION_MADE_LAST,
    VERSION_RECORD,
    VERSION_RECORDED,
    VERSION_WEIGHTS,
)
from evaluation.model_saver import GlobalModelSaver
from evaluation.progress import ProgressReporter, progress_line, version_ranges
from evaluation.run_recorder import RunRecorder, record_interruption, versions_made
from jobs.run.results import finalize, format_summary
from processors.models import build_model
from tests.fakes.engine import EventEngine, announce

DATA = {"dataset": "synthetic", "synthetic_size": 200}
RUN_INFO = {"config": {"federation": {"num_updates_for_model": 2}, "run": {"job_name": "edgesim_test"}}}


def weights_of(version: int) -> dict[str, np.ndarray]:
    """A recognisable model per version: its first bias holds the version number."""
    weights = {k: v.numpy().copy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    first_bias = next(k for k in weights if k.endswith("bias"))
    weights[first_bias][:] = version
    return weights, first_bias


def run_versions(
    tmp_path, monkeypatch, versions: int, backlog: str, eval_seconds: float, checkpoint_at: int = 0
) -> dict:
    """Versions 1..``versions`` made faster than they are evaluated, then the outcome and END_RUN. With
    ``checkpoint_at``, the assessor's CHECKPOINT_DUE is fired after that version, and the versions ``metrics.json``
    records when it returns are kept under ``"at_checkpoint"``."""
    real = evaluator_module.evaluate

    def slow(*args, **kwargs):
        time.sleep(eval_seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluator_module, "evaluate", slow)
    engine = EventEngine(
        {
            "evaluator": GlobalModelEvaluator(
                "cifar10_convnet", DATA, compute_device="cpu", max_model_version=versions, backlog=backlog
            ),
            "recorder": RunRecorder(str(tmp_path), RUN_INFO, updates_per_version=2),
            "progress": ProgressReporter(versions),
            "saver": GlobalModelSaver("cifar10_convnet", str(tmp_path)),
        }
    )
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    for version in range(1, versions + 1):
        weights, _ = weights_of(version)
        announce(ctx, version, weights)
        engine.fire_event(AppEventType.GLOBAL_WEIGHTS_UPDATED, ctx)
        if version == checkpoint_at:
            ctx.set_prop(CHECKPOINT_DUE, version, private=True, sticky=False)
            engine.fire_event(CHECKPOINT_DUE, ctx)
            recorded = json.loads((tmp_path / "metrics.json").read_text())["versions"]
            at_checkpoint = [r["version"] for r in recorded]
        time.sleep(eval_seconds / 10)  # versions come ten times faster than they are evaluated
    outcome = {"status": "completed", "reason": f"version {versions}", "version": versions, "sim_seconds": 0.0}
    ctx.set_prop(RUN_OUTCOME, outcome, private=True, sticky=False)
    engine.fire_event(RUN_OUTCOME, ctx)
    engine.fire_event(EventType.END_RUN, ctx)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    return metrics | ({"at_checkpoint": at_checkpoint} if checkpoint_at else {})


def test_a_slow_evaluator_skips_superseded_versions_but_evaluates_records_and_saves_the_last(
    tmp_path, monkeypatch, capsys
):
    metrics = run_versions(tmp_path, monkeypatch, versions=8, backlog="skip", eval_seconds=0.5)
    evaluated = [r["version"] for r in metrics["versions"]]
    assert evaluated[0] == 1 and evaluated[-1] == 8, evaluated
    assert len(evaluated) < 8  # it fell behind and skipped
    assert evaluated == sorted(evaluated)
    assert sum(r.get("skipped", 0) for r in metrics["versions"]) == 8 - len(evaluated)
    skipped = sorted(v for r in metrics["versions"] for v in r.get("skipped_versions", []))
    assert skipped == sorted(set(range(1, 9)) - set(evaluated))  # each record names the ones it superseded
    _, bias = weights_of(8)
    saved = torch.load(tmp_path / "global_model.pt")
    assert float(saved[bias][0]) == 8.0  # the saved model is the last version's
    summary = metrics["summary"]
    assert summary["versions_trained"] == 7 and summary["last_version"] == 8
    assert summary["versions_evaluated"] == len(evaluated) and summary["last_evaluated_version"] == 8
    printed = capsys.readouterr().out
    assert "older version(s) not evaluated" in printed and "[edgesim] version 8/8" in printed
    assert (tmp_path / "accuracy.png").exists()  # drawn by the server's recorder at the end


def test_the_wait_backlog_evaluates_every_scheduled_version(tmp_path, monkeypatch):
    metrics = run_versions(tmp_path, monkeypatch, versions=5, backlog="wait", eval_seconds=0.2)
    assert [r["version"] for r in metrics["versions"]] == [1, 2, 3, 4, 5]
    assert not any("skipped" in r for r in metrics["versions"])


def test_a_checkpoint_waits_until_every_version_up_to_it_is_recorded(tmp_path, monkeypatch):
    """A run killed after a checkpoint resumes past its version: with ``--eval-backlog wait`` every scheduled
    version up to it must be in ``metrics.json`` before it is written (seen lost: version 13 of a resumed run)."""
    metrics = run_versions(tmp_path, monkeypatch, versions=5, backlog="wait", eval_seconds=0.3, checkpoint_at=4)
    assert metrics["at_checkpoint"] == [1, 2, 3, 4]
    assert [r["version"] for r in metrics["versions"]] == [1, 2, 3, 4, 5]


def write_events(folder, counted: int, failed: int = 0) -> None:
    lines = [
        {"version": 2 + i // 2, "device": f"d{i}", "base_version": 1, "arrival": 0.0, "tau": 0} for i in range(counted)
    ]
    lines += [{"version": 9, "device": "x", "base_version": 1, "arrival": 0.0, "tau": 0, "failed": True}] * failed
    (folder / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_versions_made_count_exactly_b_counted_updates_each(tmp_path):
    assert versions_made(str(tmp_path), 2) is None  # no events.jsonl
    write_events(tmp_path, counted=7, failed=3)
    assert versions_made(str(tmp_path), 2) == 4  # versions 2, 3, 4 from 6 updates; the 7th waits for its pair


def test_an_interrupted_run_records_its_signal_last_version_and_summary(tmp_path):
    records = [{"version": v, "accuracy": 0.1 * v, "wall_seconds": float(v)} for v in (1, 2, 3)]
    (tmp_path / "metrics.json").write_text(json.dumps(RUN_INFO | {"versions": records}))
    write_events(tmp_path, counted=8)
    metrics = record_interruption(str(tmp_path), RUN_INFO, "SIGINT")
    assert metrics["outcome"] == {
        "status": "interrupted",
        "reason": "SIGINT before the run's end",
        "signal": "SIGINT",
        "version": 5,
    }
    assert metrics["summary"]["last_version"] == 5 and metrics["summary"]["last_evaluated_version"] == 3
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    lines = format_summary(finalize(str(tmp_path), 1.0), str(tmp_path), RUN_FILES)
    assert "4 version(s) trained, 3 evaluated (the last evaluated is version 3 of 5)" in lines
    assert "final accuracy 0.3000 (version 3)" in lines


def test_interrupted_before_version_one_says_so_and_lists_only_files_that_exist(tmp_path):
    record_interruption(str(tmp_path), RUN_INFO, "SIGTERM")  # the server never wrote metrics.json
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["outcome"]["status"] == "interrupted" and metrics["outcome"]["version"] == 1
    assert metrics["config"] == RUN_INFO["config"]
    lines = format_summary(finalize(str(tmp_path), 1.0), str(tmp_path), RUN_FILES)
    assert "no version evaluated" in lines and "None" not in lines
    assert "(metrics.json)" in lines  # not global_model.pt nor accuracy.png: they do not exist
    assert not (tmp_path / "accuracy.png").exists()


def test_the_progress_line_shows_the_methods_status_and_skipped_versions():
    record = {"version": 7, "accuracy": 0.5, "wall_seconds": 3.0, "method": "FedRevive revival, 4 update(s) revived"}
    line = progress_line(record | {"skipped": 4, "skipped_versions": [3, 4, 5, 6]}, None, 10)
    assert "FedRevive revival, 4 update(s) revived" in line
    assert "4 older version(s) not evaluated (3-6)" in line and "--eval-backlog skip" in line
    assert version_ranges([9, 3, 4, 5, 7]) == "3-5, 7, 9"


def test_the_driver_draws_the_plot_once_the_summary_is_recorded_and_only_then(tmp_path):
    """``PlotAhead``: nothing drawn while the run has no summary; drawn (every version) once the server recorded it,
    and ``finalize`` then keeps that plot; stopped before any summary, it draws nothing and ``finalize`` draws."""
    from common.jsonio import write_json_atomic
    from jobs.run.results import PlotAhead

    records = [{"version": v, "accuracy": 0.1 * v, "wall_seconds": float(v)} for v in (1, 2, 3)]
    metrics = tmp_path / "metrics.json"
    plot = tmp_path / "accuracy.png"
    with PlotAhead(str(tmp_path), interval=0.01) as plotter:
        write_json_atomic(str(metrics), RUN_INFO | {"versions": records, "outcome": {"status": "completed"}})
        time.sleep(1.5)
        assert not plot.exists()
        write_json_atomic(str(metrics), RUN_INFO | {"versions": records, "summary": {"last_version": 3}})
        assert plotter.finish() == 3 and plot.exists()
    drawn_at = plot.stat().st_mtime
    time.sleep(0.05)
    metrics.write_text(metrics.read_text())  # the system summary, written after the summary
    finalize(str(tmp_path), 1.0, drawn=3)
    assert plot.stat().st_mtime == drawn_at
    plot.unlink()
    write_json_atomic(str(metrics), RUN_INFO | {"versions": records})  # stopped before its summary
    with PlotAhead(str(tmp_path), interval=0.01) as plotter:
        assert plotter.finish() is None and not plot.exists()
    finalize(str(tmp_path), 1.0, drawn=None)
    assert plot.exists()


def test_the_last_version_is_saved_at_the_outcome_before_it_is_evaluated_and_evaluation_beats(tmp_path, monkeypatch):
    """An evaluation that never ends (a server killed in it) still leaves the run's last version on disk, recorded
    as ``saved_version``; while it scores, the evaluator beats (``working.json``) for the driver's watchdog."""
    import threading

    from common.heartbeat import read_heartbeat

    release, beats = threading.Event(), []
    real = evaluator_module.evaluate

    def held(*args, **kwargs):  # version 1 scores at once; later ones wait until released
        beats.append(read_heartbeat(str(tmp_path)))
        if len(beats) > 1:
            release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluator_module, "evaluate", held)
    evaluator = GlobalModelEvaluator("cifar10_convnet", DATA, compute_device="cpu", max_model_version=3)
    evaluator.results_dir = str(tmp_path)
    engine = EventEngine(
        {
            "evaluator": evaluator,
            "recorder": RunRecorder(str(tmp_path), RUN_INFO, updates_per_version=2),
            "saver": GlobalModelSaver("cifar10_convnet", str(tmp_path)),
        }
    )
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    for version in (1, 2, 3):
        announce(ctx, version, weights_of(version)[0])
        engine.fire_event(AppEventType.GLOBAL_WEIGHTS_UPDATED, ctx)
    ctx.set_prop(RUN_OUTCOME, {"status": "completed", "reason": "v3", "version": 3}, private=True, sticky=False)
    engine.fire_event(RUN_OUTCOME, ctx)
    _, bias = weights_of(3)
    assert float(torch.load(tmp_path / "global_model.pt")[bias][0]) == 3.0  # on disk, not evaluated yet
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["saved_version"] == 3 and 3 not in [r["version"] for r in metrics["versions"]]
    release.set()
    engine.fire_event(EventType.END_RUN, ctx)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [r["version"] for r in metrics["versions"]] == [1, 2, 3]
    assert float(torch.load(tmp_path / "global_model.pt")[bias][0]) == 3.0  # versions 1, 2 recorded later: kept
    assert metrics["saved_version"] == 3 and metrics["summary"]["versions_unevaluated"] == []
    assert all(b is not None and b["what"] == "evaluating" and not b["done"] for b in beats), beats
    assert [b["version"] for b in beats] == [1, 1, 2, 3]  # the initial model scored ahead, then version 1's own


def test_an_older_version_saved_at_the_same_moment_never_lands_over_the_last(tmp_path, monkeypatch):
    """The evaluator's thread saves a recorded version while the assessor's saves the last one: the older save,
    held mid-write, must neither land over the last version nor be what ``saved_version`` names (a run's model was
    once version 11 while its ``metrics.json`` said 12)."""
    writing, release = threading.Event(), threading.Event()
    real_save = torch.save

    def held_save(obj, path, *args, **kwargs):
        if threading.current_thread().name != "recorded":
            return real_save(obj, path, *args, **kwargs)
        with open(path, "wb") as f:  # the older version stops mid-write, its file open
            writing.set()
            release.wait(5)
            real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(saver_module.torch, "save", held_save)
    saved = []

    class Listener(FLComponent):
        def handle_event(self, event_type, fl_ctx):
            if event_type == MODEL_SAVED:
                saved.append(fl_ctx.get_prop(SAVED_VERSION))

    engine = EventEngine({"saver": GlobalModelSaver("cifar10_convnet", str(tmp_path)), "listener": Listener()})

    def save(version: int, event: str) -> None:
        ctx = engine.new_context()
        ctx.set_prop(VERSION_RECORD, {"version": version}, private=True, sticky=False)
        ctx.set_prop(VERSION_WEIGHTS, weights_of(version)[0], private=True, sticky=False)
        engine.fire_event(event, ctx)

    older = threading.Thread(target=save, args=(11, VERSION_RECORDED), name="recorded")
    older.start()
    assert writing.wait(5)
    last = threading.Thread(target=save, args=(12, VERSION_MADE_LAST), name="last")
    last.start()
    last.join(0.5)  # the last version's save, racing the older one's
    release.set()
    older.join(5)
    last.join(5)
    _, first_bias = weights_of(12)
    on_disk = torch.load(tmp_path / GLOBAL_MODEL)
    assert on_disk[first_bias].eq(12).all(), on_disk[first_bias][:3]
    assert saved[-1] == 12 and saved == sorted(saved), saved
    assert sorted(p.name for p in tmp_path.iterdir()) == [GLOBAL_MODEL]  # no temporary file or folder left
    # torch names the archive after the file it writes: the temporary file's name must not reach the model's bytes
    assert {n.split("/")[0] for n in zipfile.ZipFile(tmp_path / GLOBAL_MODEL).namelist()} == {GLOBAL_MODEL}
