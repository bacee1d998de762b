"""Bad configurations are refused before any NVFlare process starts, with a message that names the fix."""

import os
import subprocess
import sys

import pytest

from jobs.pt_job_fedavg import main
from jobs.run import driver


def fresh_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """``python -c code args`` in a fresh interpreter at the checkout's root, the checkout first on ``PYTHONPATH``
    (this process has torch loaded already)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=False, cwd=root, env=env
    )


@pytest.fixture(autouse=True)
def no_nvflare(monkeypatch):
    """Fail the test if validation lets a bad config reach the point where NVFlare would start."""

    def boom(*_a, **_k):
        raise AssertionError("NVFlare environment was created for an invalid config")

    monkeypatch.setattr(driver, "make_env", boom)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--device-selection-size", "50", "--devices-per-leaf", "10"], "larger than the device pool"),
        (["--num-leaf-nodes", "0"], "--num-leaf-nodes 0: must be a positive integer"),
        (["--local-iters", "0"], "--local-iters 0"),
        (["--max-model-version", "1"], "--max-model-version 1: must be >= 2"),
        (["--upload-delays", "-1"], "must be >= 0"),
        (["--speed-means", "1,2", "--speed-stds", "1"], "one std per speed class"),
        (["--delays", "paper", "--speed-stds", "1,1,1"], "exponential times have no std"),
        (["--speed-means", "1,2", "--speed-stds", "1,1", "--speed-probs", "0.3,0.3"], "sum to 1"),
        (["--dataset", "/nonexistent/data.npz"], "no such file"),
        (["--dataset", "imagenet"], "use cifar10, synthetic"),
        (["--env", "prod"], "--startup-kit"),
        (["--num-workers", "0"], "--num-workers 0"),
        (["--job-timeout", "0"], "--job-timeout 0"),
        (["--subset-size", "10"], "smaller than --local-batch-size"),
        (["--time-scale", "-0.5"], "--time-scale -0.5: must be >= 0"),
        (["--simulator", "stock", "--time-scale", "1"], "--time-scale needs --simulator fast"),
        (["--simulator", "stock", "--engine", "vectorized"], "--engine vectorized needs --simulator fast"),
        (["--simulator", "stock", "--bulk", "shm"], "--bulk shm needs --simulator fast"),
        (["--model", "resnet18_bn", "--engine", "vectorized"], "use --engine per-device"),
        (["--group-size", "0"], "--group-size 0"),
        (["--update-interval", "0"], "--update-interval 0"),
        (
            ["--simulator", "stock", "--devices-per-leaf", "1000000000", "--device-selection-size", "8"],
            "keeps every one of the 2,000,000,000 devices in memory",
        ),
        (["--checkpoint-every", "-2"], "--checkpoint-every -2"),
        (["--seed", "-3"], "--seed -3: use a non-negative integer"),
        (["--leaf-timeout", "0"], "--leaf-timeout 0"),
        (["--devices", "phones"], "invalid choice: 'phones'"),
        (["--devices", "real"], "--devices real needs devices that reach the leaves: use --env poc"),
        (["--devices", "real", "--env", "poc", "--time-scale", "1"], "leave out --time-scale"),
        (["--devices", "real", "--env", "poc", "--availability", "diurnal"], "leave out --availability"),
        (["--devices", "real", "--env", "poc", "--max-sim-time", "10"], "--max-sim-time budgets simulated"),
        (["--devices", "real", "--env", "poc", "--device-timeout", "-1"], "--device-timeout -1.0: must be >= 0"),
    ],
)
def test_invalid_config_is_refused_early(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        code = main(flags)
        raise SystemExit(code)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_fedavg_refuses_async_buffer_settings(capsys):
    with pytest.raises(SystemExit):
        main(["--device-selection-size", "10", "--num-updates-for-model", "5"])
    assert "fedavg is synchronous" in capsys.readouterr().err


def test_a_method_the_engine_cannot_run_is_refused_from_the_methods_table(capsys):
    from jobs.pt_job_fedrevive import main as async_main

    with pytest.raises(SystemExit):
        async_main(["--method", "fedrevive", "--simulator", "stock"])
    assert "--method fedrevive needs our server" in capsys.readouterr().err


def test_missing_cifar10_stops_before_nvflare(tmp_path, capsys):
    code = main(["--dataset", "cifar10", "--data-root", str(tmp_path / "no-cifar")])
    assert code == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "no-cifar") in err and "--dataset synthetic" in err


def test_help_lists_every_flag_with_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for flag in (
        "--dataset --data-root --num-leaf-nodes --devices-per-leaf --device-selection-size --max-model-version "
        "--local-iters --local-batch-size --local-lr --subset-size --dirichlet-alpha --num-workers --job-timeout "
        "--device-wait-timeout --eval-frequency --seed --env --startup-kit --username --output --export-only "
        "--simulator"
    ).split():
        assert flag in out
    assert "(default: synthetic)" in out


def test_an_output_folder_that_cannot_be_created_is_refused_before_start(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["--output", str(tmp_path / "file" / "results")]) == 2
    assert "cannot be created" in capsys.readouterr().err


def test_a_non_empty_folder_that_holds_no_earlier_run_is_never_cleared(tmp_path, capsys):
    (tmp_path / "precious.txt").write_text("keep me")
    assert main(["--output", str(tmp_path)]) == 2
    assert "not empty and holds no earlier run" in capsys.readouterr().err
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_an_output_folder_with_a_space_is_refused_before_anything_is_made(tmp_path, capsys):
    """NVFlare's simulator splits its worker commands on spaces: such a run failed after its processes started."""
    target = tmp_path / "my results"
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(["--output", str(target)]))
    assert exit_info.value.code == 2
    assert "holds whitespace" in capsys.readouterr().err
    assert not target.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_output_folder_is_refused(tmp_path, capsys):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    assert main(["--output", str(folder)]) == 2
    assert "not writable" in capsys.readouterr().err


def test_resuming_on_a_deployment_is_refused_naming_the_flag(tmp_path):
    from common.choices import ConfigError
    from jobs.run_config import RunConfig

    with pytest.raises(ConfigError, match="--resume with --env prod: resuming continues SimEnv runs only"):
        RunConfig(env="prod", startup_kit=str(tmp_path), username="admin@nvidia.com", resume=str(tmp_path))


def test_resume_refuses_a_checkpoint_whose_model_lacks_todays_statistics(tmp_path):
    """A checkpoint from before the convnet had statistic trackers cannot continue: the devices would be sent
    weights without them. The refusal comes before any process starts."""
    import torch

    from common.choices import ConfigError
    from jobs.resume import check_checkpoint_model
    from processors.models import build_model
    from scheduling import checkpoint

    weights = {k: v for k, v in build_model("cifar10_convnet").state_dict().items() if "track" not in k}
    checkpoint.write(
        str(tmp_path), {"meta": {"version": 3}, "model_manager": {"current_version": 3, "versions": {3: weights}}}
    )
    with pytest.raises(ConfigError, match=r"lacks \['track1.running_mean'.*start a new run"):
        check_checkpoint_model(str(tmp_path), "cifar10_convnet")
    whole = {k: torch.zeros(1) for k in build_model("cifar10_convnet").state_dict()}
    checkpoint.write(
        str(tmp_path), {"meta": {"version": 3}, "model_manager": {"current_version": 3, "versions": {3: whole}}}
    )
    check_checkpoint_model(str(tmp_path), "cifar10_convnet")


def flag_help(out: str) -> dict[str, str]:
    """Each flag's help text in ``--help`` output, joined onto one line."""
    helps, flag = {}, None
    for line in out.splitlines():
        stripped = line.strip()
        if line.startswith("  -") and stripped.startswith("--"):
            flag = stripped.split()[0]
            helps[flag] = " ".join(stripped.split()[2:])
        elif flag and line.startswith(" " * 10):
            helps[flag] += " " + stripped
        else:
            flag = None
    return helps


def test_help_reads_right_one_default_per_flag_plain_description_and_fedrevive_docs(capsys):
    from jobs.pt_job_fedrevive import main as async_main

    with pytest.raises(SystemExit):
        async_main(["--help"])
    out = capsys.readouterr().out
    helps = flag_help(out)
    doubled = [h for h in helps.values() if h.count("(default") > 1]
    assert not doubled, doubled
    assert "(default: None)" not in out and "(default: )" not in out
    assert "``" not in out  # the description is plain text
    assert "once its update arrived" in helps["--no-device-reuse"]
    assert "(default: True)" not in helps["--no-device-reuse"]
    assert "staleness scale of the blend" in helps["--fr-s-max"] and "(default: 75.0)" in helps["--fr-s-max"]
    assert not [f for f, h in helps.items() if f.startswith("--fr-") and "FedReviveConfig." in h]


def test_an_argparse_error_is_one_line_that_points_at_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--num-leaf-nodes", "two"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "invalid int value: 'two'" in err and "--help" in err


def test_a_fedrevive_run_too_short_to_revive_says_so_before_it_starts():
    from jobs.api import make_config
    from jobs.run.plan import method_notes

    short = method_notes(make_config("fedrevive", max_model_version=12))
    assert len(short) == 1 and "every update passes unchanged, as in FedBuff" in short[0]
    warming = method_notes(make_config("fedrevive", max_model_version=80))
    assert "revives no update before version 100" in warming[0]
    assert method_notes(make_config("fedrevive", max_model_version=150)) == ()
    assert method_notes(make_config("fedbuff", max_model_version=12)) == ()


@pytest.fixture
def missing(tmp_path):
    return str(tmp_path / "missing")


BUILD_IO_CASES = [
    ({"env": "prod", "startup_kit": "{missing}", "username": "admin"}, "--startup-kit {missing}: no such directory"),
    ({"capacity_file": "{missing}.pkl"}, "--capacity-file {missing}.pkl: no such file"),
    ({"availability": "{missing}.json"}, "--availability {missing}.json: no such file"),
    ({"model": "resnet18_bn", "engine": "vectorized"}, "use --engine per-device"),
    ({"model": "no_such_package_here:Net"}, "cannot import Net from no_such_package_here"),
]


@pytest.mark.parametrize("options, message", BUILD_IO_CASES)
def test_building_a_config_reads_no_file_and_builds_no_model_validate_refuses(options, message, missing, monkeypatch):
    """A config that names a missing file or an unusable model builds (nothing is read, imported or built while
    it is), and ``validate()`` refuses it with the message the command line prints."""
    import builtins
    import importlib

    import torch

    from common.choices import ConfigError
    from jobs.options import config_from_options

    options = {k: v.format(missing=missing) for k, v in options.items()}

    def touched(*args, **_kwargs):
        raise AssertionError(f"building a config did I/O: {args}")

    with monkeypatch.context() as io:
        for owner, name in ((builtins, "open"), (os, "stat"), (os, "listdir"), (os, "scandir")):
            io.setattr(owner, name, touched)
        io.setattr(importlib, "import_module", touched)
        io.setattr(torch.nn.Module, "__init__", touched)
        cfg = config_from_options("fedavg", options | {"output": missing + "-out"})
    with pytest.raises(ConfigError) as refused:
        cfg.validate()
    assert message.format(missing=missing) in str(refused.value)


@pytest.mark.parametrize("options, message", BUILD_IO_CASES)
def test_the_driver_validates_a_config_built_without_it(options, message, missing, capsys):
    """A ``JobConfig`` handed to ``jobs.api.run`` / the driver unvalidated is refused before anything starts: exit 2,
    one line."""
    from jobs.options import config_from_options

    cfg = config_from_options("fedavg", {k: v.format(missing=missing) for k, v in options.items()})
    assert driver.run(cfg) == 2
    err = capsys.readouterr().err
    assert err == f"error: {err.removeprefix('error: ').strip()}\n" and message.format(missing=missing) in err
    assert not os.path.exists(cfg.output_dir)


def test_the_command_line_refuses_a_missing_trace_before_start(missing, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--capacity-file", missing + ".pkl"])
    assert exit_info.value.code == 2
    assert f"--capacity-file {missing}.pkl: no such file" in capsys.readouterr().err


def test_a_configuration_is_built_and_refused_without_importing_torch():
    """``jobs.config`` (and every part's class) imports no torch: a refused value exits before torch loads, and
    the driver loads it only when a run is about to start. In a fresh interpreter: this one has torch already."""

    code = (
        "import sys\n"
        "from common.choices import ConfigError\n"
        "from jobs.config import JobConfig\n"
        "from processors.training_config import TrainingConfig\n"
        "JobConfig(method='fedrevive')\n"
        "try:\n"
        "    TrainingConfig(model='no_such_model')\n"
        "except ConfigError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('a bad model name was not refused')\n"
        "from fedrevive.config import FedReviveConfig\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print(loaded[:3])\n"
        "raise SystemExit(1 if loaded else 0)\n"
    )
    done = fresh_python(code)
    assert done.returncode == 0, f"torch imported with the config: {done.stdout}{done.stderr}"


@pytest.mark.parametrize("flags, code", [(["--help"], 0), (["--local-lr", "-1"], 2), (["--method", "nope"], 2)])
def test_the_job_script_answers_help_and_refuses_a_flag_before_importing_torch_or_the_driver(flags, code):
    """The job script itself, in a fresh interpreter: ``--help`` and a refused flag exit (0 and 2) before torch and
    the driver (NVFlare's job API, our components) load, so the answer comes without their seconds of imports."""

    script = (
        "import runpy, sys\n"
        "sys.argv = ['jobs/pt_job_fedrevive.py', *sys.argv[1:]]\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as ex:\n"
        "    print('exit', ex.code, sorted(m for m in ('torch', 'jobs.run.driver') if m in sys.modules))\n"
    )
    done = fresh_python(script, *flags)
    assert done.stdout.splitlines()[-1:] == [f"exit {code} []"], done.stdout[-2000:] + done.stderr[-2000:]
    if code == 2:
        assert "error: " in done.stderr and len(done.stderr.strip().splitlines()) <= 3  # argparse's usage + one line
