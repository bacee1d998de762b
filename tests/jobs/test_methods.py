"""A method is one class: the built-in ones by name, a user's by import path or class; its settings become flags,
options and ``JobConfig.method_settings``; its strategy and module reach the exported job; a bad method is refused
before anything starts, in one line."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from aggregation.strategy import ServerContext, Update
from common.choices import ConfigError
from jobs.api import make_config, method_option
from jobs.cli import build_parser, job_main
from jobs.config import JobConfig
from jobs.methods import BUILT_IN, FedRevive, method_of
from jobs.plan import prepare
from jobs.recipe import EdgeSimRecipe
from tests.conftest import REPO

EXAMPLES = os.path.join(REPO, "examples")
OWN = "own_method:StalenessWeightedFedBuff"
SMALL = dict(device_selection_size=4, devices_per_leaf=3, synthetic_size=500)


@pytest.fixture
def examples_importable(monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)


def test_built_in_methods_are_found_by_name_and_unknown_ones_are_refused_naming_the_choices():
    assert [method_of(name).name for name in ("fedavg", "fedbuff", "fedrevive")] == list(BUILT_IN)
    with pytest.raises(ConfigError, match="fedavg, fedbuff, fedrevive, or an import path"):
        method_of("fedprox")
    with pytest.raises(ConfigError, match="no_such_module"):
        method_of("no_such_module:Method")
    with pytest.raises(ConfigError, match="is not a jobs.methods.Method subclass"):
        method_of("aggregation.buffered_mean:BufferedMean")


def test_a_users_method_by_import_path_gets_its_presets_settings_and_checks(examples_importable):
    cfg = make_config(OWN, sw_exponent=1.5, **SMALL)
    assert cfg.method == OWN and cfg.method_settings.exponent == 1.5
    assert cfg.federation.num_updates_for_model == 2 and cfg.federation.global_lr == 0.05  # its presets
    assert cfg.run.job_name == "edgesim_stalenessweightedfedbuff"
    assert cfg.method_spec.strategy_args(cfg) == {"global_lr": 0.05, "exponent": 1.5}
    with pytest.raises(ConfigError, match="--sw-exponent -1"):
        make_config(OWN, sw_exponent=-1.0, **SMALL)
    again = JobConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))  # as metrics.json records it
    assert again.method_settings == cfg.method_settings and again.method == OWN


def test_a_method_class_or_instance_is_named_by_its_import_path_and_built_ins_by_name(examples_importable):
    from own_method import StalenessWeightedFedBuff

    assert method_option(StalenessWeightedFedBuff) == OWN
    assert method_option(StalenessWeightedFedBuff()) == OWN
    assert method_option(FedRevive) == "fedrevive"
    assert make_config(StalenessWeightedFedBuff, **SMALL).method == OWN


def test_a_config_written_before_the_method_api_still_loads():
    d = make_config("fedrevive", fr_s_max=7, **SMALL).to_dict()
    d["fedrevive"] = d.pop("method_settings")  # the key metrics.json used before
    assert JobConfig.from_dict(d).method_settings.s_max == 7


def test_the_command_line_adds_a_users_method_flags_and_refuses_a_bad_method_in_one_line(examples_importable, capsys):
    with pytest.raises(SystemExit) as ended:
        job_main("test", ["--method", OWN, "--help"])
    assert ended.value.code == 0 and "--sw-exponent" in capsys.readouterr().out
    for bad, named in (("own_method:Nope", "Nope"), ("fedprox", "fedprox")):
        with pytest.raises(SystemExit) as ended:
            job_main("test", ["--method", bad, "--devices-per-leaf", "3"])
        err = capsys.readouterr().err
        assert ended.value.code == 2 and named in err and len(err.strip().splitlines()) == 1, err


def test_the_exported_job_carries_the_users_strategy_and_ships_its_module(examples_importable, tmp_path):
    args = build_parser("test", method_choice=True).parse_args(["--method", OWN])
    assert args.method == OWN
    cfg = make_config(OWN, sw_exponent=2.0, **SMALL)
    EdgeSimRecipe(cfg, prepare(cfg), results_dir=str(tmp_path / "out")).export(job_dir=str(tmp_path / "job"))
    job = tmp_path / "job" / cfg.run.job_name
    server = json.loads((job / "app" / "config" / "config_fed_server.json").read_text())
    manager = {c["id"]: c for c in server["components"]}["model_manager"]
    assert manager["args"]["strategy"] == "own_method:StalenessWeightedMean"
    assert manager["args"]["strategy_args"] == {"global_lr": 0.05, "exponent": 2.0}
    assert list(job.glob("**/custom/own_method.py")), "the user's method module is not shipped with the job"


def test_the_examples_strategy_weights_updates_by_their_staleness(examples_importable, tmp_path):
    from own_method import StalenessWeightedMean

    class History:
        current_version = 3
        current_weights = {"w": np.zeros(2, np.float32)}

    strategy = StalenessWeightedMean(global_lr=1.0, exponent=1.0)
    strategy.setup(ServerContext("m", frozenset(), 0, "cpu", str(tmp_path)))
    strategy.add_update(Update("a#0", 3, 1, {"w": np.full(2, 3.0, np.float32)}, 0, 1.0), History())
    strategy.add_update(Update("a#1", 1, 1, {"w": np.full(2, 6.0, np.float32)}, 2, 2.0), History())  # weight 1/3
    np.testing.assert_allclose(strategy.make_version(History(), 2.0)["w"], (3.0 + 2.0) / (1 + 1 / 3), rtol=1e-6)
