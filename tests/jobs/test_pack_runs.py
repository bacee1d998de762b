"""A job script's ``--runs FILE`` (``jobs.pack_runs``): every refusal is one line naming the fix, exit code 2,
before any process starts; a run's flags come after the command line's and win; and the table shows each run. The
pack itself runs end to end, one run stopped on request, in ``tests/e2e/test_pack_runs.py``."""

from __future__ import annotations

import json

import pytest

from common.choices import ConfigError
from jobs.cli import build_parser, method_and_options, raising_parse
from jobs.pack_runs import RunsResult, option_configs, read_runs, run_configs, runs_table
from jobs.run.results import RunResult

SMALL = ["--method", "fedbuff", "--devices-per-leaf", "3", "--device-selection-size", "4", "--synthetic-size", "500"]


pytestmark = pytest.mark.usefixtures("no_pack_starts")


def runs_file(tmp_path, runs) -> str:
    path = tmp_path / "runs.json"
    path.write_text(runs if isinstance(runs, str) else json.dumps(runs))
    return str(path)


@pytest.mark.parametrize(
    "runs, says",
    [
        ("{not json", "not JSON"),
        ([{"lr": 0.1}], "write a JSON object of runs"),
        ({"a": {"local-lr": 0.1}}, "a pack needs at least 2 runs; for one, give its settings as a single run's"),
        ({"a/b": {}, "c": {}}, "run name 'a/b': use letters, digits"),
        ({"a": {"seeds": "1,2"}, "b": {}}, "run a gives --seeds: a run of a pack is one new run; leave it out"),
        ({"a": {}, "b": {"resume": True}}, "run b gives --resume"),
        ({"a": {"local-lr": "fast"}, "b": {}}, "run a: argument --local-lr: invalid float value: 'fast'"),
        (
            {"a": {"num-leaf-nodes": 3}, "b": {}},
            "run b has --num-leaf-nodes 2, run a has 3: runs of one pack share --num-leaf-nodes",
        ),
        ({"a": {"output": "{out}/same"}, "b": {"output": "{out}/same"}}, "run b: its results folder"),
    ],
)
def test_a_bad_runs_file_is_refused_in_one_line_before_anything_starts(tmp_path, capsys, runs, says):
    from jobs.pt_job_fedrevive import main

    if isinstance(runs, dict):
        runs = {k: {f: str(v).replace("{out}", str(tmp_path)) for f, v in flags.items()} for k, flags in runs.items()}
    path = runs_file(tmp_path, runs)
    with pytest.raises(SystemExit) as ended:
        raise SystemExit(main([*SMALL, "--runs", path, "--output", str(tmp_path / "out")]))
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert ended.value.code == 2 and len(lines) == 1 and not out.strip(), (out, err)
    assert lines[0].startswith("error: ") and says in lines[0], lines[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_runs_with_seeds_are_refused_in_one_line(tmp_path, capsys):
    from jobs.pt_job_fedrevive import main

    path = runs_file(tmp_path, {"a": {}, "b": {}})
    with pytest.raises(SystemExit) as ended:
        raise SystemExit(main([*SMALL, "--runs", path, "--seeds", "0,1"]))
    err = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and "--seeds with --runs: give each run its seed in the --runs file" in err, err


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--runs-at-once", "2"], "--runs-at-once without --runs: it says how many runs of a --runs pack go at a time"),
        (["--runs", "{runs}", "--runs-at-once", "0"], "--runs-at-once 0: give 1 or more runs at a time"),
        (["--runs", "{runs}", "--runs-at-once", "-1"], "--runs-at-once -1: give 1 or more runs at a time"),
    ],
)
def test_a_bad_runs_at_once_is_refused_in_one_line(tmp_path, capsys, flags, says):
    from jobs.api import run
    from jobs.pt_job_fedrevive import main

    path = runs_file(tmp_path, {"a": {}, "b": {}})
    with pytest.raises(SystemExit) as ended:
        raise SystemExit(main([*SMALL, *(f.replace("{runs}", path) for f in flags), "--output", str(tmp_path / "o")]))
    err = capsys.readouterr().err.strip()
    assert ended.value.code == 2 and len(err.splitlines()) == 1 and says in err, err
    with pytest.raises(ConfigError, match=r"runs_at_once=2: give it with runs=, 1 or more runs at a time"):
        run("fedbuff", runs_at_once=2, output=str(tmp_path / "api"))
    with pytest.raises(ConfigError, match=r"runs_at_once=0: give it with runs="):
        run("fedbuff", runs={"a": {}, "b": {}}, runs_at_once=0, output=str(tmp_path / "api"))
    assert not (tmp_path / "o").exists() and not (tmp_path / "api").exists()


def test_each_runs_flags_follow_the_command_line_and_win(tmp_path):
    parser = build_parser("", method_choice=True, seeds=True)
    path = runs_file(
        tmp_path,
        {"slow": {"local-lr": 0.001, "seed": 4}, "fast": {"local-lr": 0.1, "output": str(tmp_path / "elsewhere")}},
    )
    argv = [*SMALL, "--local-lr", "0.05", "--output", str(tmp_path / "p")]
    cfgs = run_configs(raising_parse(parser), method_and_options, argv, read_runs(path), f"--runs {path}")
    assert [(c.training.local_lr, c.run.seed) for c in cfgs] == [(0.001, 4), (0.1, 0)]
    assert [c.output_dir for c in cfgs] == [str(tmp_path / "p" / "slow"), str(tmp_path / "elsewhere")]
    assert {c.federation.device_selection_size for c in cfgs} == {4}  # the command line's, for every run
    with pytest.raises(SystemExit):  # the parser exits as before once the runs are read
        parser.parse_args(["--local-lr", "fast"])


def test_the_table_names_each_run_and_how_it_ended(tmp_path):
    done = {"versions": [{"version": 3, "accuracy": 0.5}], "outcome": {"status": "completed"}}
    pruned = {"versions": [{"version": 1, "accuracy": 0.25}], "outcome": {"status": "pruned"}}
    runs = {"a": RunResult(0, str(tmp_path / "x"), done), "b": RunResult(1, str(tmp_path / "y"), pruned)}
    rows = [line.split() for line in runs_table(RunsResult(1, runs)).splitlines()]
    assert rows[0][:2] == ["run", "final"]
    assert rows[1][:4] == ["a", "0.5000", "1", "completed"] and rows[2][:4] == ["b", "0.2500", "1", "pruned"]


def test_the_apis_runs_take_options_the_run_wins_and_refusals_raise(tmp_path):
    from jobs.api import run

    options = {"devices_per_leaf": 3, "device_selection_size": 4, "synthetic_size": 500, "local_lr": 0.05}
    runs = {"a": {"local_lr": 0.001, "seed": 4}, "b": {}}
    cfgs = option_configs("fedbuff", options | {"output": str(tmp_path / "p")}, runs)
    assert [(c.training.local_lr, c.run.seed) for c in cfgs] == [(0.001, 4), (0.05, 0)]
    assert [c.output_dir for c in cfgs] == [str(tmp_path / "p" / "a"), str(tmp_path / "p" / "b")]
    with pytest.raises(ConfigError, match="runs=: a pack needs at least 2 runs"):
        run("fedbuff", runs={"a": {}}, **options)
    with pytest.raises(ConfigError, match="runs=: run b gives seeds: a run of a pack is one new run"):
        run("fedbuff", runs={"a": {}, "b": {"seeds": [1, 2]}}, **options)
    with pytest.raises(ConfigError, match="runs= with seeds= or a JobConfig"):
        run("fedbuff", runs={"a": {}, "b": {}}, seeds=[1, 2], **options)
    with pytest.raises(ConfigError, match="run b has --num-leaf-nodes 3, run a has 2"):
        run("fedbuff", runs={"a": {}, "b": {"num_leaf_nodes": 3}}, **options)
