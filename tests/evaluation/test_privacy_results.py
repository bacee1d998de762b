"""What a DP run shows: the progress line's epsilon, noised fraction clipped and adaptive clip norm, the summary's last
epsilon, and the plot's accuracy-against-epsilon panel."""

from __future__ import annotations

from evaluation.plots import plot_accuracy
from evaluation.progress import progress_line
from evaluation.run_recorder import run_summary


def records() -> list[dict]:
    base = {"mechanism": "gaussian", "accountant": "rdp", "noise_multiplier": 1.1, "sampling_probability": 1.0}
    base |= {"delta": 1e-5, "clip_norm": 0.84}
    return [
        {
            "version": 1,
            "accuracy": 0.1,
            "wall_seconds": 1.0,
            "sim_seconds": 0.0,
            "privacy": base | {"compositions": 0, "epsilon": 0.0},
        },
        {
            "version": 2,
            "accuracy": 0.3,
            "wall_seconds": 2.0,
            "sim_seconds": 1.0,
            "privacy": base | {"compositions": 1, "epsilon": 1.2345, "noised_unclipped_fraction": 0.55},
        },
    ]


def test_the_progress_line_shows_epsilon_the_noised_fraction_clipped_and_an_adaptive_clip_norm():
    line = progress_line(records()[1])
    assert "| epsilon 1.234 at delta 1e-05 | ~45% clipped (noised) | clip norm 0.84" in line
    assert "clipped" not in progress_line(records()[0]) and "epsilon 0.000" in progress_line(records()[0])


def test_the_summary_repeats_the_last_epsilon_and_the_plot_draws_accuracy_against_it(tmp_path, monkeypatch):
    summary = run_summary(records(), 2)
    assert summary["epsilon"] == 1.2345 and summary["delta"] == 1e-5
    assert "epsilon" not in run_summary([{k: v for k, v in r.items() if k != "privacy"} for r in records()], 2)
    import matplotlib.pyplot as plt

    made = []
    real = plt.subplots
    monkeypatch.setattr(plt, "subplots", lambda *a, **k: made.append(a) or real(*a, **k))
    plot_accuracy(records(), str(tmp_path / "accuracy.png"), "dp")
    assert made == [(1, 4)] and (tmp_path / "accuracy.png").exists()  # version, wall, simulated time, epsilon
