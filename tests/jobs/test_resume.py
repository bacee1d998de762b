"""``--resume`` as users type it: the original command with ``--resume DIR`` appended is accepted; a flag given
with another value that would change the trajectory is refused with its name; harmless changes apply."""

from __future__ import annotations

import json
import shutil

import pytest

from common.choices import ConfigError
from common.config_flags import given_flags
from jobs.cli import build_parser, config_from_args
from jobs.resume import resumed_config
from processors.models import build_model
from scheduling import checkpoint

ORIGINAL = (
    "--method fedrevive --dataset synthetic --num-leaf-nodes 2 --devices-per-leaf 4 --device-selection-size 4 "
    "--max-model-version 3 --local-iters 3 --seed 1 --delays paper --fr-s-max 20"
).split()


def saved_run(tmp_path) -> str:
    """A results folder as a run leaves it: its config in metrics.json and a checkpoint of its model."""
    cfg = parsed(ORIGINAL)
    (tmp_path / "metrics.json").write_text(json.dumps({"config": cfg.to_dict(), "versions": []}))
    weights = {k: v.numpy() for k, v in build_model(cfg.training.model).state_dict().items()}
    state = {"meta": {"version": 1}, "model_manager": {"current_version": 1, "versions": {1: weights}}}
    checkpoint.write(str(tmp_path), state)
    return str(tmp_path)


def parsed(argv: list[str]):
    parser = build_parser("test", method_choice=True)
    return config_from_args(parser.parse_args(argv), "fedrevive", presets=True)


def resume(folder: str, argv: list[str]):
    parser = build_parser("test", method_choice=True)
    argv = [*argv, "--resume", folder]
    return resumed_config(
        folder, config_from_args(parser.parse_args(argv), "fedrevive", True), given_flags(parser, argv)
    )


def test_the_original_command_with_resume_appended_is_accepted(tmp_path):
    folder = saved_run(tmp_path)
    cfg = resume(folder, [*ORIGINAL, "-v"])
    assert cfg.data.dataset == "synthetic" and cfg.run.seed == 1 and cfg.run.resume == folder
    assert cfg.federation.max_model_version == 3 and cfg.method_settings.s_max == 20


def test_a_changed_value_that_would_change_the_trajectory_is_refused_with_its_name(tmp_path):
    folder = saved_run(tmp_path)
    with pytest.raises(ConfigError, match="--seed would change the result"):
        resume(folder, [*ORIGINAL, "--seed", "2"])
    with pytest.raises(ConfigError, match="--delays would change the result"):
        resume(folder, [*ORIGINAL, "--delays", "none"])
    with pytest.raises(ConfigError, match="--fr-s-max would change the result"):
        resume(folder, [*ORIGINAL, "--fr-s-max", "10"])


def test_harmless_changes_apply(tmp_path):
    folder = saved_run(tmp_path)
    cfg = resume(folder, [*ORIGINAL, "--max-model-version", "9", "--eval-backlog", "skip"])
    assert cfg.federation.max_model_version == 9 and cfg.run.eval_backlog == "skip"


def test_the_original_command_of_a_capacity_trace_run_resumes(tmp_path, monkeypatch):
    """The saved config is the validated one (validate() fills in the trace's task samples and model bytes), so
    the command's own config is validated before the two are compared."""
    import jobs.run.driver
    from jobs.cli import job_main

    trace = tmp_path / "capacity.json"
    trace.write_text(json.dumps({"1": {"computation": 3.0, "communication": 8000.0}}))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    argv = [*ORIGINAL[: ORIGINAL.index("--delays")], *ORIGINAL[ORIGINAL.index("--delays") + 2 :]]
    argv += ["--delays", "none", "--capacity-file", str(trace)]
    cfg = parsed(argv).validate()
    assert cfg.delays.task_samples and cfg.delays.model_bytes  # what building alone leaves out
    (run_dir / "metrics.json").write_text(json.dumps({"config": cfg.to_dict(), "versions": []}))
    weights = {k: v.numpy() for k, v in build_model(cfg.training.model).state_dict().items()}
    checkpoint.write(
        str(run_dir), {"meta": {"version": 1}, "model_manager": {"current_version": 1, "versions": {1: weights}}}
    )
    started = []
    monkeypatch.setattr(jobs.run.driver, "run", lambda c, verbose=False: started.append(c) or 0)
    assert job_main("test", [*argv, "--resume", str(run_dir)]) == 0
    assert started[0].delays == cfg.delays and started[0].run.resume == str(run_dir)


def test_a_run_without_a_checkpoint_is_refused_alone_and_starts_anew_in_a_packs_resume(tmp_path):
    """A run that wrote no checkpoint (a pack's run still waiting for its place when the pack was killed): ``--resume``
    of it alone is refused; a pack's resume (``restart``) starts it anew from its saved config, in its folder, with
    the harmless flags given, and still refuses one that would change its result."""
    folder = saved_run(tmp_path)
    shutil.rmtree(tmp_path / "checkpoint")  # what a run that never began leaves: its config, no state
    with pytest.raises(ConfigError, match="wrote no checkpoint"):
        resume(folder, ORIGINAL)
    parser = build_parser("test", method_choice=True)
    argv = [*ORIGINAL, "--num-workers", "3", "--resume", folder]
    flags = config_from_args(parser.parse_args(argv), "fedrevive", True)
    cfg = resumed_config(folder, flags, given_flags(parser, argv), restart=True)
    assert cfg.run.resume is None and cfg.run.output == folder  # a new run, into the same folder
    assert (cfg.run.seed, cfg.method_settings.s_max, cfg.engine.num_workers) == (1, 20, 3)
    argv = [*ORIGINAL, "--seed", "2", "--resume", folder]
    with pytest.raises(ConfigError, match="--seed would change the result"):
        resumed_config(folder, parsed(argv), given_flags(parser, argv), restart=True)
