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
from jobs.run.plan import prepare
from jobs.run.recipe import EdgeSimRecipe
from tests.conftest import REPO

EXAMPLES = os.path.join(REPO, "examples")
OWN = "fedasync:FedAsync"
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
    cfg = make_config(OWN, fa_exponent=1.5, **SMALL)
    assert cfg.method == OWN and cfg.method_settings.exponent == 1.5 and cfg.method_settings.alpha == 0.6
    assert cfg.federation.num_updates_for_model == 1 and cfg.federation.min_hole_to_fill == 1  # its presets
    assert cfg.run.job_name == "edgesim_fedasync"
    assert cfg.method_spec.strategy_args(cfg) == {"alpha": 0.6, "exponent": 1.5}
    with pytest.raises(ConfigError, match="--fa-exponent -1"):
        make_config(OWN, fa_exponent=-1.0, **SMALL)
    again = JobConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))  # as metrics.json records it
    assert again.method_settings == cfg.method_settings and again.method == OWN


def test_a_method_class_or_instance_is_named_by_its_import_path_and_built_ins_by_name(examples_importable):
    from fedasync import FedAsync

    assert method_option(FedAsync) == OWN
    assert method_option(FedAsync()) == OWN
    assert method_option(FedRevive) == "fedrevive"
    assert make_config(FedAsync, **SMALL).method == OWN


def test_a_config_written_before_the_method_api_still_loads():
    d = make_config("fedrevive", fr_s_max=7, **SMALL).to_dict()
    d["fedrevive"] = d.pop("method_settings")  # the key metrics.json used before
    for field in ("warmup_blend", "class_proportions"):  # nor did it have these: the old behaviour stays
        del d["fedrevive"][field]
    old = JobConfig.from_dict(d).method_settings
    assert (old.s_max, old.warmup_blend, old.class_proportions) == (7, "pass", "estimate")
    assert make_config("fedrevive", **SMALL).method_settings.warmup_blend == "zero"  # a new run: today's default


def test_the_command_line_adds_a_users_method_flags_and_refuses_a_bad_method_in_one_line(examples_importable, capsys):
    with pytest.raises(SystemExit) as ended:
        job_main("test", ["--method", OWN, "--help"])
    assert ended.value.code == 0 and "--fa-exponent" in capsys.readouterr().out
    for bad, named in (("fedasync:Nope", "Nope"), ("fedprox", "fedprox")):
        with pytest.raises(SystemExit) as ended:
            job_main("test", ["--method", bad, "--devices-per-leaf", "3"])
        err = capsys.readouterr().err
        assert ended.value.code == 2 and named in err and len(err.strip().splitlines()) == 1, err


def test_the_exported_job_carries_the_users_strategy_and_ships_its_module(examples_importable, tmp_path):
    args = build_parser("test", method_choice=True).parse_args(["--method", OWN])
    assert args.method == OWN
    cfg = make_config(OWN, fa_exponent=2.0, **SMALL)
    EdgeSimRecipe(cfg, prepare(cfg), results_dir=str(tmp_path / "out")).export(job_dir=str(tmp_path / "job"))
    job = tmp_path / "job" / cfg.run.job_name
    server = json.loads((job / "app" / "config" / "config_fed_server.json").read_text())
    manager = {c["id"]: c for c in server["components"]}["model_manager"]
    assert manager["args"]["strategy"] == "fedasync:StalenessMixing"
    assert manager["args"]["strategy_args"] == {"alpha": 0.6, "exponent": 2.0}
    assert list(job.glob("**/custom/fedasync.py")), "the user's method module is not shipped with the job"


def test_a_device_hook_reaches_the_exported_jobs_task_processor(examples_importable, tmp_path):
    cfg = make_config("fedprox:FedProx", prox_mu=0.5, **SMALL)
    assert cfg.federation.synchronous  # FedAvg's, inherited
    EdgeSimRecipe(cfg, prepare(cfg), results_dir=str(tmp_path / "out")).export(job_dir=str(tmp_path / "job"))
    job = tmp_path / "job" / cfg.run.job_name
    client = json.loads(next(job.glob("**/config_fed_client.json")).read_text())
    processor = next(c for c in client["components"] if c["path"].endswith("TrainingTaskProcessor"))
    assert processor["args"]["objective"] == "fedprox:ProximalTerm"
    assert processor["args"]["objective_args"] == {"mu": 0.5}


class History:
    """The versions a strategy reads (``aggregation.strategy.ModelHistory``), from a dict."""

    def __init__(self, versions: dict, current: int):
        self.versions, self.current_version = versions, current

    @property
    def current_weights(self):
        return self.versions[self.current_version]

    def weights_of(self, version: int):
        return self.versions[version]


def test_fedasync_mixes_each_trained_model_in_by_its_staleness(examples_importable, tmp_path):
    from fedasync import StalenessMixing

    history = History({1: {"w": np.zeros(2, np.float32)}, 2: {"w": np.full(2, 1.0, np.float32)}}, 2)
    strategy = StalenessMixing(alpha=0.5, exponent=1.0)
    strategy.setup(ServerContext("m", frozenset(), 0, "cpu", str(tmp_path)))
    strategy.add_update(Update("a#0", 1, 1, {"w": np.full(2, 4.0, np.float32)}, 1, 1.0), history)  # x_new 4, a 1/4
    state = strategy.state_dict()
    strategy.load_state_dict(state)  # a checkpoint between two updates of one version
    strategy.add_update(Update("a#1", 2, 1, {"w": np.full(2, 2.0, np.float32)}, 0, 2.0), history)  # x_new 3, a 1/2
    np.testing.assert_allclose(strategy.make_version(history, 2.0)["w"], 0.5 * (0.75 * 1 + 0.25 * 4) + 0.5 * 3)


def test_the_nvflare_weighting_example_makes_the_versions_nvflares_buff_model_manager_makes(examples_importable):
    """The same stale and fresh updates, through NVFlare's own BuffModelManager(staleness_weight=True) and through
    the example's strategy, give the same next version."""
    from fedbuff_nvflare_weighting import NVFlareStalenessWeighting
    from nvflare.apis.dxo import DXO, DataKind
    from nvflare.edge.assessors.buff_model_manager import BuffModelManager
    from nvflare.edge.mud import ModelUpdate

    from tests.fakes.engine import EventEngine

    rng = np.random.default_rng(0)
    initial = {"w": rng.normal(size=3).astype(np.float32)}
    rounds = [{1: 2}, {1: 1, 2: 1}, {1: 1, 3: 1}]  # per new version: {base version: devices}, stale ones too
    diffs = [{v: [rng.normal(size=3).astype(np.float32) for _ in range(n)] for v, n in r.items()} for r in rounds]

    stock = BuffModelManager(num_updates_for_model=2, global_lr=0.5, staleness_weight=True)
    fl_ctx = EventEngine({}).new_context()
    stock.initialize_model(DXO(DataKind.WEIGHTS, data=dict(initial)), fl_ctx)
    stock.generate_new_model(fl_ctx)  # version 1: the initial model; then one version per 2 updates
    ours = NVFlareStalenessWeighting(global_lr=0.5)
    ours.setup(ServerContext("m", frozenset(), 0, "cpu", ""))
    history = History({1: initial}, 1)
    for made in diffs:
        for v, ds in made.items():
            for i, d in enumerate(ds):
                update = DXO(DataKind.WEIGHT_DIFF, data={"dict": {"w": d.copy()}, "count": 1}).to_shareable()
                stock.process_updates({v: ModelUpdate(v, update, {f"site-1#{v}{i}": 0.0})}, fl_ctx)
                ours.add_update(Update(f"site-1#{v}{i}", v, 1, {"w": d}, history.current_version - v, 0.0), history)
        history.versions[history.current_version + 1] = ours.make_version(history, 0.0)
        history.current_version += 1
        np.testing.assert_allclose(history.current_weights["w"], np.asarray(stock.current_model.data["w"]), 1e-6)
    assert history.current_version == stock.current_model_version == 4


def test_the_asynchronous_methods_take_the_papers_delays_unless_a_delay_flag_is_given(tmp_path, capsys):
    """Without delays an asynchronous run is a serial chain (every update at time 0): FedBuff's and FedRevive's
    presets bring the paper's; ``--delays none`` (or any delay flag) still wins, and the presets are printed."""
    from common.delays import DELAY_PRESETS
    from jobs.cli import build_parser, config_from_args, job_main

    parser = build_parser("job", method_choice=True)

    def delays(*argv: str):
        args = parser.parse_args(list(argv))
        return config_from_args(args, args.method, presets=True).delays

    assert delays("--method", "fedbuff") == delays("--method", "fedrevive") == DELAY_PRESETS["paper"]
    assert delays("--method", "fedavg") == DELAY_PRESETS["none"]
    assert delays("--method", "fedbuff", "--delays", "none") == DELAY_PRESETS["none"]
    alone = delays("--method", "fedbuff", "--speed-means", "10,40", "--speed-stds", "1,1")
    assert alone.speed_means == (10.0, 40.0) and alone.download_delay == 0.0  # on the plain model, as before
    assert make_config("fedbuff", **SMALL).delays == DELAY_PRESETS["paper"]
    assert make_config("fedbuff", presets=False, **SMALL).delays == DELAY_PRESETS["none"]
    job_main("job", ["--method", "fedbuff", "--dry-run", "--max-model-version", "2", "--workspace", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "fedbuff presets (flags not given):" in printed and "--delays paper" in printed
