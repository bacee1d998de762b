"""Pure parts of benchmarks/compare_methods.py and bench_forwarding.py: budget cut, tables, version estimates."""

import csv
import io

import pytest

from benchmarks import compare_methods as cm

CURVE = [
    {"version": 3, "accuracy": 0.30, "sim_seconds": 40.0, "wall_seconds": 3.0},
    {"version": 1, "accuracy": 0.10, "sim_seconds": 0.0, "wall_seconds": 1.0},
    {"version": 2, "accuracy": 0.35, "sim_seconds": 20.0, "wall_seconds": 2.0},
    {"version": 4, "accuracy": 0.50, "sim_seconds": 60.0, "wall_seconds": 4.0},
]


def test_cut_at_budget_keeps_versions_within_budget_in_order():
    cut = cm.cut_at_budget(CURVE, 40.0)
    assert [r["version"] for r in cut] == [1, 2, 3]  # the budget is inclusive
    assert cm.cut_at_budget(CURVE, 19.9) == [CURVE[1]]
    assert cm.cut_at_budget([], 10.0) == []
    assert cm.covers_budget(CURVE, 60.0) and not cm.covers_budget(CURVE, 60.1)


def test_summarize_reports_final_and_best_at_budget():
    row = cm.summarize("fedbuff", CURVE, 50.0, wall_seconds=12.34, max_version=9)
    assert row["final_acc_at_budget"] == 0.30  # version 3, not the later, better version 4
    assert row["best_acc_at_budget"] == 0.35
    assert row["versions_in_budget"] == 2  # versions 2 and 3 trained; 1 is the initial model
    assert row["covered"] is True and row["sim_seconds_reached"] == 60.0
    assert row["wall_seconds"] == 12.3 and row["wall_seconds_at_budget"] == 3.0
    empty = cm.summarize("fedavg", [], 50.0, 1.0, 2)
    assert empty["final_acc_at_budget"] is None and empty["versions_in_budget"] == 0 and not empty["covered"]


def test_tables_markdown_and_csv():
    rows = [cm.summarize("fedavg", CURVE, 50.0, 10.0, 5), cm.summarize("fedrevive", [], 50.0, 3.0, 7)]
    md = cm.format_markdown(rows).splitlines()
    assert md[0].startswith("| method | final_acc_at_budget |") and md[1].startswith("| --- |")
    assert md[2].startswith("| fedavg | 0.3000 | 0.3500 | 2 | 60.0 | yes | 5 | 10.0 |")
    assert "| fedrevive | - | - | 0 |" in md[3] and "| NO |" in md[3]
    parsed = list(csv.DictReader(io.StringIO(cm.format_csv(rows))))
    assert [r["method"] for r in parsed] == ["fedavg", "fedrevive"]
    assert parsed[0]["final_acc_at_budget"] == "0.3" and parsed[1]["final_acc_at_budget"] == ""
    assert list(parsed[0]) == list(cm.COLUMNS)


def test_buffer_sizes_keep_the_presets():
    assert cm.buffer_size("fedavg", 20) == 20
    assert cm.buffer_size("fedbuff", 20) == 2 and cm.buffer_size("fedrevive", 20) == 1
    assert cm.buffer_size("fedbuff", 1) == 1  # never more than the devices in flight


def test_mean_task_seconds():
    assert cm.mean_task_seconds((10.0, 20.0, 40.0), (0.5, 0.3, 0.2), 1.0) == pytest.approx(20.0)
    assert cm.mean_task_seconds((10.0, 30.0)) == pytest.approx(20.0)
    assert cm.mean_task_seconds((), (), 3.0) == 3.0


def test_estimate_max_version_async_and_sync():
    speeds = dict(means=(10.0, 20.0, 40.0), stds=(0.0, 0.0, 0.0), probs=(0.5, 0.3, 0.2), comm_mean=1.0)
    # async: 20 in flight, 20 s per task -> 1 update per simulated second; buffer 2 -> 2 s per version
    v = cm.estimate_max_version("fedbuff", 100.0, 20, 2, 2, margin=1.0, **speeds)
    assert v == 1 + 50
    assert cm.estimate_max_version("fedbuff", 100.0, 20, 2, 2, margin=1.5, **speeds) == 1 + 75
    assert cm.estimate_max_version("fedrevive", 100.0, 20, 1, 2, margin=1.0, **speeds) == 1 + 100
    # sync: each round waits for a leaf's slowest device (10 per leaf): with no std, 41 s almost surely
    v = cm.estimate_max_version("fedavg", 410.0, 20, 20, 2, margin=1.0, **speeds)
    assert 11 <= v <= 12
    assert cm.estimate_max_version("fedrevive", 1e6, 20, 1, 2, cap=50, **speeds) == 50
    assert cm.estimate_max_version("fedavg", 1.0, 20, 20, 2, **speeds) == 2  # at least one trained version
    with pytest.raises(ValueError):
        cm.estimate_max_version("fedbuff", 100.0, 20, 2, 2)  # no heterogeneity: no simulated time
    with pytest.raises(ValueError):
        cm.estimate_max_version("fedbuff", 0.0, 20, 2, 2, **speeds)


def test_expected_round_seconds_is_the_slowest_device():
    one_class = cm.expected_round_seconds(10, (5.0,), (0.0,))
    assert one_class == pytest.approx(5.0)
    mixed = cm.expected_round_seconds(50, (10.0, 40.0), (0.0, 0.0), (0.5, 0.5))
    assert mixed == pytest.approx(40.0)  # with 50 devices a slow one is (almost) always selected
    assert cm.expected_round_seconds(4, (), ()) == 0.0


def test_reestimate_from_an_observed_run():
    records = [{"version": 1, "sim_seconds": 0.0}, {"version": 11, "sim_seconds": 50.0}]  # 5 s per version
    assert cm.reestimate_max_version(records, 100.0, margin=1.0) == 21
    assert cm.reestimate_max_version(records, 100.0, margin=1.2, cap=10) == 10
    with pytest.raises(ValueError):
        cm.reestimate_max_version([{"version": 1, "sim_seconds": 0.0}], 100.0)


def test_job_command_passes_presets_and_fr_flags(tmp_path):
    args, passthrough = cm.build_parser().parse_known_args(["--output", str(tmp_path), "--fr-gen-width", "8", "--x"])
    assert passthrough == ["--x"]
    cmd = cm.job_command(args, "fedrevive", 17, str(tmp_path / "fedrevive"), passthrough)
    flags = dict(zip(cmd[2::2], cmd[3::2], strict=False))
    assert cmd[-1] == "--x" and "--method" in cmd and cmd[cmd.index("--method") + 1] == "fedrevive"
    assert cmd[cmd.index("--max-model-version") + 1] == "17"
    assert cmd[cmd.index("--num-updates-for-model") + 1] == "1"
    assert cmd[cmd.index("--fr-s-max") + 1] == "15"  # 75 x 20 / 100
    assert cmd[cmd.index("--fr-gen-width") + 1] == "8"
    assert flags  # a well-formed flag list
    fedavg = cm.job_command(args, "fedavg", 5, str(tmp_path / "fedavg"), [])
    assert "--fr-s-max" not in fedavg and fedavg[fedavg.index("--min-hole-to-fill") + 1] == "20"


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "acc.png"
    cm.plot_curves({"fedavg": CURVE, "fedbuff": CURVE[:2]}, 50.0, str(path), "t")
    assert path.stat().st_size > 1000


def test_forwarding_bytes_grow_with_updates_and_summing_does_not():
    from nvflare.app_common.decomposers import numpy_decomposers
    from nvflare.edge.aggregators.model_update_dxo import ModelUpdateDXOAggregator

    from benchmarks import bench_forwarding as bf

    numpy_decomposers.register()
    template = {"w": (64, 32), "b": (32,)}
    model_bytes = (64 * 32 + 32) * 4
    s1 = bf.measure(ModelUpdateDXOAggregator, template, 1, 1, 0)
    s4 = bf.measure(ModelUpdateDXOAggregator, template, 4, 1, 0)
    f4 = bf.measure(bf.ForwardingLeaf, template, 4, 1, 0)
    assert s1["payload_bytes"] == s4["payload_bytes"] == model_bytes
    assert f4["payload_bytes"] == 4 * model_bytes
    assert f4["bytes"] > 3.5 * s4["bytes"]
    table = bf.format_table([{"n": 4, "summing": s4, "forwarding": f4}])
    assert table.splitlines()[2].startswith("| 4 | ")
