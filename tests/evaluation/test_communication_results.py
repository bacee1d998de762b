"""What a run with compression or a bandwidth shows (``docs/communication.md``): ``accuracy.png`` gains a panel of
accuracy against the megabytes the fleet moved, TensorBoard and MLflow the bytes per version and the accuracy by
kilobytes uploaded; a run without them draws and logs what it did before."""

from __future__ import annotations

import pytest

from evaluation.plots import plot_accuracy
from evaluation.tensorboard_writer import TensorBoardWriter
from jobs.tracking.mlflow_run import MlflowRun
from jobs.tracking.series import BYTES_METRIC, SIM_METRIC, bytes_step, version_metrics


def records(moved: bool) -> list[dict]:
    out = []
    for v in (1, 2, 3):
        r = {"version": v, "accuracy": round(0.1 * v, 3), "wall_seconds": float(v), "sim_seconds": 2.0 * v}
        r["fleet"] = {"online": 10, "devices": 10, "updates": 2 * (v - 1), "failed": 0}
        if moved:
            r["fleet"] |= {"bytes_up": 4968 * 2 * (v - 1), "bytes_down": 248200 * (20 + 2 * (v - 1))}
        out.append(r)
    return out


def drawn(monkeypatch, tmp_path, recs: list[dict]):
    import matplotlib.pyplot as plt

    made = []
    real = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    monkeypatch.setattr(plt, "close", lambda fig: None)  # keep the figure to read its lines
    plot_accuracy(recs, str(tmp_path / "accuracy.png"), "fedbuff")
    assert (tmp_path / "accuracy.png").stat().st_size > 0
    (fig, axes), *_ = made
    return axes


def test_the_plot_draws_accuracy_against_the_megabytes_moved_only_when_they_were_counted(monkeypatch, tmp_path):
    axes = drawn(monkeypatch, tmp_path, records(moved=True))
    assert len(axes) == 4  # version, wall seconds, simulated seconds, bytes
    up, down = axes[3].get_lines()
    assert list(up.get_xdata()) == pytest.approx([0.0, 0.009936, 0.019872])
    assert list(down.get_xdata()) == pytest.approx([4.964, 5.4604, 5.9568])
    assert list(up.get_ydata()) == pytest.approx([0.1, 0.2, 0.3])
    assert axes[3].get_xlabel() == "megabytes moved by the fleet"
    assert len(drawn(monkeypatch, tmp_path, records(moved=False))) == 3  # as before: no bytes panel


class Client:
    def __init__(self):
        self.metrics = []

    def log_batch(self, run_id, metrics=()):
        self.metrics += list(metrics)


def logged(recs: list[dict]) -> dict[str, list[tuple[int, float]]]:
    run = MlflowRun.__new__(MlflowRun)
    run.client, run.run_id = Client(), "r"
    run.log_versions(recs)
    series: dict[str, list[tuple[int, float]]] = {}
    for m in run.client.metrics:
        series.setdefault(m.key, []).append((m.step, m.value))
    return series


def test_trackers_log_the_bytes_per_version_and_accuracy_by_kilobytes_uploaded():
    series = logged(records(moved=True))
    assert series["fleet/bytes_up"] == [(1, 0.0), (2, 9936.0), (3, 19872.0)]
    assert series["fleet/bytes_down"] == [(1, 4964000.0), (2, 5460400.0), (3, 5956800.0)]
    assert series[BYTES_METRIC] == [(0, 0.1), (10, 0.2), (20, 0.3)]
    assert series[SIM_METRIC] == [(2000, 0.1), (4000, 0.2), (6000, 0.3)]
    plain = logged(records(moved=False))
    assert BYTES_METRIC not in plain and "fleet/bytes_up" not in plain
    assert bytes_step({"fleet": None}) is None and bytes_step({}) is None
    assert "fleet/bytes_up" not in version_metrics(records(moved=False)[1])


class Writer:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def flush(self):
        pass


class Context:
    def __init__(self, props: dict):
        self.props = props

    def get_prop(self, key, default=None):
        return self.props.get(key, default)


def tensorboard_tags(record: dict) -> list[tuple]:
    from evaluation.events import VERSION_RECORD

    writer = TensorBoardWriter("")
    writer._writer = Writer()
    full = record | {"system": {}, "seconds_per_version": None, "devices_per_second": None}
    writer._write_version("", Context({VERSION_RECORD: full}))
    return [s for s in writer._writer.scalars if "bytes" in s[0] or "kb" in s[0]]


def test_tensorboard_gets_the_bytes_and_accuracy_by_kilobytes_uploaded_only_when_counted():
    assert tensorboard_tags(records(moved=True)[2]) == [
        ("fleet/bytes_up", 19872.0, 3),
        ("fleet/bytes_down", 5956800.0, 3),
        (BYTES_METRIC, pytest.approx(0.3), 20),
    ]
    assert tensorboard_tags(records(moved=False)[2]) == []
