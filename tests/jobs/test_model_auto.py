"""``--model auto`` (the default) picks the dataset's model by its name, and a model's preset fills the local
training flags not given: an explicit ``--model`` and the flags the user gives always win, the default run's
config is today's, the start lines say what was chosen, a run's config records the model's name, and a run
recorded with an explicit name resumes with its own command."""

from __future__ import annotations

import json

import pytest

from jobs.build import checked_config
from jobs.cli import build_parser, config_from_args
from processors.model_names import AUTO, MODELS, auto_model, model_preset
from processors.training_config import TrainingConfig


def parsed(argv: list[str], method_choice: bool = True):
    args = build_parser("test", method_choice=method_choice).parse_args([*argv, "--output", "/tmp/unused"])
    return config_from_args(args, args.method if method_choice else "fedavg", presets=method_choice)


@pytest.mark.parametrize(
    ("dataset", "model"),
    [
        ("synthetic", "cifar10_convnet"),
        ("cifar10", "cifar10_convnet"),
        ("synthetic-text", "char_lstm"),
        ("femnist", "femnist_cnn"),
        ("shakespeare", "char_lstm"),
        ("/data/fed_emnist_train.h5", "femnist_cnn"),
        ("/data/fed_emnist_digitsonly_train.h5", "femnist_cnn"),  # its 10 digits: 52 logits never a label
        ("/data/shakespeare_train.h5", "char_lstm"),
        ("/data/stackoverflow_train.h5", "word_lstm"),
        ("hf:flwrlabs/femnist?user=writer_id", "femnist_cnn"),
        ("/data/mine.npz", "cifar10_convnet"),  # a user's data: as before auto existed (give --model)
        ("my_pkg.data:load", "cifar10_convnet"),
    ],
)
def test_auto_picks_the_model_of_the_dataset_by_its_name(dataset, model):
    assert auto_model(dataset) == model
    partition = ["--partition", "natural"] if "stackoverflow" in dataset else []
    assert parsed(["--dataset", dataset, *partition]).training.model == model
    assert parsed(["--dataset", dataset, "--model", AUTO, *partition]).training.model == model


def test_an_explicit_model_always_wins_and_brings_its_own_preset():
    cfg = parsed(["--dataset", "femnist", "--model", "resnet18_bn"])
    assert cfg.training == TrainingConfig(model="resnet18_bn")  # no preset: the project's defaults
    cfg = parsed(["--dataset", "synthetic-text", "--model", "char_lstm"])
    assert (cfg.training.local_batch_size, cfg.training.local_lr) == (10, 1e-2)
    user = parsed(["--dataset", "femnist", "--model", "my_pkg.models:Net"])
    assert user.training.model == "my_pkg.models:Net" and user.training.local_batch_size == 32


def test_the_models_preset_fills_only_the_local_training_flags_not_given():
    cfg = parsed(["--dataset", "shakespeare", "--local-lr", "0.5", "--partition", "natural"], method_choice=False)
    assert cfg.training.model == "char_lstm"
    assert (cfg.training.local_batch_size, cfg.training.local_lr, cfg.training.optimizer) == (10, 0.5, "adam")
    cfg = parsed(["--dataset", "femnist", "--optimizer", "adam"])
    assert (cfg.training.optimizer, cfg.training.local_lr, cfg.training.local_batch_size) == ("adam", 0.004, 10)
    given = checked_config("fedavg", {"dataset": "femnist", "local_batch_size": 4, "output": "/tmp/unused"})
    assert (given.training.local_batch_size, given.training.optimizer, given.training.local_lr) == (4, "sgd", 0.004)
    # every preset is a TrainingConfig that builds, and names fields the flags fill
    for card in MODELS.values():
        TrainingConfig(model=card.name, **card.preset)
    # jobs.api: presets=False leaves the model's preset out too
    off = checked_config("fedavg", {"dataset": "shakespeare", "output": "/tmp/unused"}, model_presets=False)
    assert off.training == TrainingConfig(model="char_lstm")


def test_the_default_run_keeps_todays_config():
    """Synthetic images: the convnet with the FedRevive references' client (no preset), in both jobs and in the API,
    so the default run keeps its bits (benchmarks/checks/same_bits.py)."""
    today = TrainingConfig(model="cifar10_convnet")
    assert today.local_batch_size == 32 and today.local_lr == 3e-4 and today.optimizer == "adam"
    assert model_preset("cifar10_convnet") == {} and model_preset("resnet18") == {}
    assert parsed([], method_choice=False).training == today
    assert parsed([]).training == today
    assert checked_config("fedavg", {"output": "/tmp/unused"}).training == today
    assert parsed([]).to_dict()["training"]["model"] == "cifar10_convnet"  # what metrics.json's config records


def test_the_start_lines_name_the_chosen_model_and_its_preset(tmp_path, monkeypatch, capsys):
    """The job prints which model auto picked and the preset it applied before the run; the driver's first line
    (here of a --dry-run, which trains nothing) names the model."""
    import jobs.run.driver
    from jobs.cli import job_main
    from tests.fakes.user_formats import write_leaf_femnist

    write_leaf_femnist(tmp_path / "data", users=6)
    argv = ["--dataset", "femnist", "--data-root", str(tmp_path / "data"), "--partition", "natural"]
    argv += ["--devices-per-leaf", "3", "--device-selection-size", "4", "--max-model-version", "3"]
    argv += ["--local-lr", "0.01", "--output", str(tmp_path / "out"), "--dry-run"]
    started = []
    real_run = jobs.run.driver.run
    monkeypatch.setattr(jobs.run.driver, "run", lambda cfg, verbose=False: started.append(cfg) or real_run(cfg))
    assert job_main("test", argv, method="fedavg") == 0
    out = capsys.readouterr().out
    assert "[edgesim] --model auto: femnist_cnn, LEAF's FEMNIST CNN, for --dataset femnist" in out
    # the preset's values the flags did not give; --local-lr was given
    assert "[edgesim] femnist_cnn presets (flags not given): --optimizer sgd, --local-batch-size 10 (" in out
    assert "[edgesim] fedavg on cpu, env sim, simulator fast, seed 0, model femnist_cnn" in out
    assert started[0].training.local_lr == 0.01 and started[0].training.model == "femnist_cnn"
    named = job_main("test", [*argv[:-3], "--model", "cifar10_convnet", "--output", str(tmp_path / "b")], "fedavg")
    assert named == 2  # an explicit model wins, even a wrong one: refused in one line, naming the shape
    assert "--model cifar10_convnet cannot take the data's samples of shape (1, 28, 28)" in capsys.readouterr().err


def test_a_run_recorded_with_an_explicit_model_name_resumes_with_its_command(tmp_path):
    """A char_lstm run recorded before models had presets (batch 32, lr 3e-4) resumes with its own command, with
    --model auto, or without --model: the saved configuration applies, the preset fills nothing."""
    from common.config_flags import given_flags
    from jobs.resume import resumed_config
    from processors.models import build_model
    from scheduling import checkpoint

    original = ["--dataset", "synthetic-text", "--model", "char_lstm", "--local-batch-size", "32"]
    original += ["--local-lr", "3e-4", "--devices-per-leaf", "4", "--device-selection-size", "4", "--method", "fedbuff"]
    saved = parsed(original)
    assert (saved.training.local_batch_size, saved.training.local_lr) == (32, 3e-4)
    (tmp_path / "metrics.json").write_text(json.dumps({"config": saved.to_dict(), "versions": []}))
    weights = {k: v.numpy() for k, v in build_model("char_lstm").state_dict().items()}
    checkpoint.write(
        str(tmp_path), {"meta": {"version": 1}, "model_manager": {"current_version": 1, "versions": {1: weights}}}
    )
    short = ["--dataset", "synthetic-text", "--devices-per-leaf", "4", "--device-selection-size", "4"]
    for argv in (original, [*short, "--model", "char_lstm"], [*short, "--model", AUTO], short):
        parser = build_parser("test", method_choice=True)
        argv = [*argv, "--method", "fedbuff", "--resume", str(tmp_path)]
        flags_cfg = config_from_args(parser.parse_args(argv), "fedbuff", presets=True)
        resumed = resumed_config(str(tmp_path), flags_cfg, given_flags(parser, argv))
        assert resumed.training == saved.training, argv
