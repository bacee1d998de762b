"""benchmarks/peers/bench_peers.py parses its flags, without the peers extra refuses in one line with exit 2, and refuses
to report a Flower run whose clients failed. It never runs a side here: the benchmark itself is run by hand or in CI only where the extra is installed."""

import importlib.util

import pytest

from benchmarks.peers import bench_peers


def test_its_flags_describe_the_issue_s_work_with_few_rounds_by_default():
    args = bench_peers.parse_args([])
    assert (args.users, args.samples, args.cohort, args.rounds) == (1000, 50, 50, 5)
    flower = ["flower"] if importlib.util.find_spec("flwr") else []  # by default only where Flower imports
    assert args.sides == ["ours", "pfl", *flower, "floor"]
    w = bench_peers.work(args)
    assert (w["synthetic_size"], w["difficulty"], w["steps"], w["batch"], w["lr"]) == (50000, 1.0, 5, 10, 0.1)
    names = bench_peers.user_names(w)
    assert len(set(names)) == 1000 and names[0] == "site-1#0" and names[-1] == "site-2#499"  # our job's devices


@pytest.mark.parametrize("flags", [["--sides", "ours,nope"], ["--users", "999"], ["--users", "10", "--cohort", "50"]])
def test_bad_flags_are_refused(flags):
    with pytest.raises(SystemExit) as ex:
        bench_peers.parse_args(flags)
    assert ex.value.code == 2


def test_without_the_extra_it_says_so_in_one_line_and_exits_2(capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(bench_peers.importlib.util, "find_spec", lambda m: None if m == "pfl" else real(m))
    assert bench_peers.main(["--sides", "pfl,floor"]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "pip install -e '.[peers]'" in out
    assert bench_peers.missing_peers(["ours", "floor"]) == []  # sides without a peer need no extra
    monkeypatch.setattr(bench_peers.importlib.util, "find_spec", lambda m: None if m == "flwr" else real(m))
    assert "flower" not in bench_peers.parse_args([]).sides  # left out of the default without Flower
    assert bench_peers.main(["--sides", "flower"]) == 2  # asked for: refused in one line


def test_the_project_never_imports_the_peers():
    import subprocess
    import sys

    from tests.conftest import REPO

    code = "import sys, jobs.cli, jobs.run.driver; print(sorted(m for m in ('pfl', 'flwr') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True).stdout == "[]\n"


def test_a_flower_run_whose_clients_failed_is_refused_not_reported(monkeypatch):
    """Flower logs a failing client and goes on with the old model: its timings would describe no training. Ray's
    workers once failed every client ("Can't get attribute 'actor_work' on <module '__main__'>") and the table still
    printed Flower's seconds per round."""
    import json
    import subprocess

    def fake_run(cmd, env, **_):
        with open(env["BENCH_PEERS_OUT"], "w") as f:
            json.dump({"ready": 0.0, "round_ends": [1.0, 2.0], "accuracy": 0.1, "unchanged_rounds": 2}, f)
        log = "INFO: > Received error in reply from node 7: AttributeError: Can't get attribute 'actor_work'"
        return subprocess.CompletedProcess(cmd, 0, stdout=log, stderr="")

    monkeypatch.setattr(bench_peers.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match=r"did not change in 2 of 2 rounds(.|\n)*actor_work"):
        bench_peers.run_flower({"rounds": 2})
