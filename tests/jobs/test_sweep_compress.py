"""A sweep grids over compressors (``docs/sweeps.md``, ``docs/communication.md``): ``compress`` values in a grid,
quoted or not, become each trial's ``--compress`` and build its compression config; a compressor that cannot work
is refused in one line before any trial; the sweep's TensorBoard shows each trial's accuracy by kilobytes
uploaded, so the compressors compare by the bytes they sent."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from common.config_flags import flag_args
from jobs.sweep.board import Board
from jobs.sweep.spec import check_flags, parse_spec
from tests.fakes.sweep import BASE, refused_before_any_trial

COMPRESSORS = BASE + "  method: fedbuff\n  uplink-kbps: 500\n"


@pytest.mark.parametrize("grid", ['grid: {compress: [none, "topk:0.01"]}\n', "grid:\n  compress: [none, topk:0.01]\n"])
def test_a_grid_over_compressors_gives_each_trial_its_compressor(grid):
    from jobs.cli import build_parser, config_from_args

    spec = parse_spec(COMPRESSORS + grid + "when: {compress: {topk:0.01: {error-feedback: 'off'}}}\n", "c")
    assert spec.cells() == [{"compress": "none"}, {"compress": "topk:0.01"}]
    check_flags(spec)  # every cell builds a JobConfig
    parser = build_parser("", method_choice=True)
    built = []
    for cell in spec.cells():
        words = flag_args(spec.trial_flags(cell))
        assert words[words.index("--compress") + 1] == cell["compress"]
        args = parser.parse_args(words)
        built.append(config_from_args(args, args.method, presets=True).compression)
    assert [(c.compress, c.feedback, c.uplink_kbps) for c in built] == [
        ("none", False, 500.0),
        ("topk:0.01", False, 500.0),  # the when: case turned error feedback off
    ]


def test_a_compressor_that_cannot_work_is_refused_before_any_trial(tmp_path, capsys):
    err = refused_before_any_trial(tmp_path, capsys, COMPRESSORS + "grid: {compress: [none, 'topk:0']}\n")
    assert "--compress 'topk:0'" in err and "compress=topk:0" in err


def test_the_sweeps_board_shows_accuracy_by_kilobytes_uploaded(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = parse_spec(COMPRESSORS + "grid: {compress: [none, 'topk:0.01']}\n", "c")
    board = Board(str(tmp_path), spec)
    for n, (name, size) in enumerate((("none", 248200), ("topk:0.01", 4968))):
        fleet = [{"updates": 2 * v} | ({"bytes_up": 2 * v * size, "bytes_down": 0} if n else {}) for v in range(3)]
        records = [{"version": v + 1, "accuracy": 0.1 * (v + 1), "fleet": f} for v, f in enumerate(fleet)]
        run = SimpleNamespace(folder=str(tmp_path / "trials" / f"000{n}"), repeat={}, records=records)
        board.write_run(n, {"compress": name}, run, "complete", None)
    plain = EventAccumulator(str(tmp_path / "0000")).Reload()
    assert "accuracy_vs_kb_up" not in plain.Tags()["scalars"]  # nothing counted, nothing drawn
    counted = EventAccumulator(str(tmp_path / "0001")).Reload()
    assert [e.step for e in counted.Scalars("accuracy_vs_kb_up")] == [0, 10, 20]
