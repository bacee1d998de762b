"""Differential privacy's settings: every value or method that cannot offer the guarantee is refused in one line
with exit 2 before anything starts, naming the fix; a target epsilon becomes the noise multiplier for the planned
run (its versions, or the dry-run planner's schedule), checked against dp-accounting directly."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

import pytest

from common.choices import ConfigError
from jobs.api import make_config
from jobs.build import build_config, resolve
from jobs.methods import FedAvg
from jobs.privacy import planned_compositions
from jobs.pt_job_fedrevive import main
from jobs.run import driver
from jobs.run.schedule_plan import schedule_for
from scheduling.event_reference import reference_trace
from tests.conftest import REPO

dp_accounting = pytest.importorskip("dp_accounting")

SMALL = ["--num-leaf-nodes", "2", "--devices-per-leaf", "10", "--device-selection-size", "8"]
CENTRAL = ["--dp", "central", "--dp-noise-multiplier", "1.0"]


class WeightedFedAvg(FedAvg):
    weighting = "samples"


@pytest.fixture(autouse=True)
def no_nvflare(monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("NVFlare environment was created for an invalid config")

    monkeypatch.setattr(driver, "make_env", boom)
    monkeypatch.syspath_prepend(os.path.join(REPO, "examples"))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dp", "central", "--dp-clip-norm", "0", "--dp-noise-multiplier", "1"], "--dp-clip-norm 0.0: the L2 clip"),
        ([*CENTRAL, "--dp-delta", "1"], "--dp-delta 1.0: must be in (0, 1)"),
        ([*CENTRAL, "--dp-delta", "0"], "--dp-delta 0.0: must be in (0, 1)"),
        (["--dp-noise-multiplier", "1"], "--dp-noise-multiplier needs differential privacy: add --dp central"),
        (["--dp", "central"], "give --dp-noise-multiplier SIGMA, or --dp-target-epsilon"),
        (["--dp", "local", "--dp-noise-multiplier", "0"], "--dp-noise-multiplier 0.0: must be > 0"),
        ([*CENTRAL, "--method", "fedrevive"], "--dp central cannot hold for FedRevive: its server distils"),
        (
            ["--dp", "local", "--dp-noise-multiplier", "1", "--method", "fedrevive"],
            "give --fr-class-proportions estimate",
        ),
        ([*CENTRAL, "--method", "fedbuff", "--model", "resnet18_bn"], "its predictions use data statistics"),
        ([*CENTRAL, "--method", "fedavg", "--simulator", "stock"], "NVFlare's stock path clips and noises nothing"),
        ([*CENTRAL, "--method", "power_of_choice:PowerOfChoice"], "devices report loss beside their updates"),
        ([*CENTRAL, "--method", f"{__name__}:WeightedFedAvg"], "report data_size (it weights by samples)"),
        ([*CENTRAL, "--method", "fedasync:FedAsync"], "does not say how central DP's noise enters its versions"),
        ([*CENTRAL, "--method", "fedavg", "--dp-sampling", "poisson"], "claims amplification by sampling, but no"),
        (
            [*CENTRAL, "--method", "fedavg", "--dp-noise", "seeded", "--env", "poc"],
            "--dp-noise seeded with --env poc: seeded noise",
        ),
        ([*CENTRAL, "--dp-local-x", "1"], "unrecognized arguments"),
        (
            ["--dp", "local", "--dp-noise-multiplier", "1", "--dp-adaptive-clipping"],
            "leave it out (fixed --dp-clip-norm)",
        ),
        (
            [*CENTRAL, "--method", "fedbuff", "--dp-adaptive-clipping"],  # B = 2: the count's noise 0.1 < 1.0 / 2
            "raise --dp-count-noise above 0.25",
        ),
        (
            ["--dp", "central", "--dp-noise-multiplier", "0.3", "--dp-target-epsilon", "1", "--method", "fedavg"],
            "above --dp-target-epsilon 1.0",
        ),
        (
            ["--dp", "central", "--dp-target-epsilon", "1", "--method", "fedbuff", "--max-sim-time", "1e-9"],
            "the planned run makes no model version",
        ),
    ],
)
def test_what_cannot_offer_the_guarantee_is_refused_in_one_line_before_anything_starts(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main([*SMALL, *flags]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_user_method_without_add_noise_may_run_local_dp():
    cfg = make_config("fedasync:FedAsync", **options(dp="local", dp_noise_multiplier=1.0))
    assert cfg.privacy.local
    assert cfg.privacy.device_settings() == {"dp": "local", "noise_multiplier": 1.0, "noise": "secure"}


def library_epsilon(z: float, q: float, t: int, delta: float) -> float:
    event = dp_accounting.GaussianDpEvent(z)
    event = dp_accounting.PoissonSampledDpEvent(q, event) if q < 1 else event
    return dp_accounting.rdp.RdpAccountant().compose(event, t).get_epsilon(delta)


def options(**kw) -> dict:
    return dict(num_leaf_nodes=2, devices_per_leaf=10, device_selection_size=8, dp="central") | kw


def busiest(cfg) -> int:
    """The most versions one device goes into, from the planner's reference trace."""
    trace = [r for r in reference_trace(schedule_for(cfg)) if not r.get("failed")]
    last = max(r["version"] for r in trace)
    return max(Counter(d for d, v in {(r["device"], r["version"]) for r in trace} if v < last).values())


def test_a_target_epsilon_becomes_the_smallest_noise_for_the_busiest_devices_rounds_unamplified():
    cfg = make_config("fedavg", **options(dp_target_epsilon=8.0, max_model_version=21))
    z, t = cfg.privacy.dp_noise_multiplier, cfg.privacy.dp_planned_compositions
    assert 1 < t <= 20 and t in (busiest(cfg), busiest(cfg) + 1)
    # replace-one: the accountant's multiplier is sigma / 2; no sampling amplification (q = 1)
    assert library_epsilon(z / 2, 1.0, t, 1e-5) <= 8.0 < library_epsilon(z / 2 - 1e-3, 1.0, t, 1e-5)
    zero_out = make_config("fedavg", **options(dp_target_epsilon=8.0, max_model_version=21, dp_neighbouring="zero-out"))
    assert zero_out.privacy.dp_noise_multiplier == pytest.approx(z / 2, abs=1e-5)
    # a copy (unresolved) planned again gets the same noise (a resumed run's saved config plans it again)
    assert resolve(dataclasses.replace(cfg)) == cfg and not dataclasses.replace(cfg).resolved


def test_with_a_time_budget_the_dry_run_planner_gives_the_compositions():
    cfg = make_config("fedbuff", **options(dp_target_epsilon=8.0, max_model_version=500, max_sim_time=3.0))
    trace = reference_trace(schedule_for(cfg))
    made = max(r["version"] for r in trace if not r.get("failed")) - 1  # the last update's version may be unmade
    assert 0 < planned_compositions(cfg) < made < 499  # the busiest device's versions, not every version made
    assert library_epsilon(cfg.privacy.dp_noise_multiplier / 2, 1.0, planned_compositions(cfg), 1e-5) <= 8.0


@pytest.mark.parametrize("mode", ["participation", "local"])
def test_participation_and_local_dp_plan_the_most_updates_one_device_sends(mode):
    kw = {} if mode == "participation" else {"dp": "local"}
    cfg = make_config("fedbuff", **options(dp_target_epsilon=8.0, max_model_version=40) | kw)
    trace = reference_trace(schedule_for(cfg))
    counted = [r for r in trace if not r.get("failed")]
    most = max(Counter(r["device"] for r in counted).values())
    # central DP: a device is held until its version is made, so its updates go into distinct versions
    assert len({(r["device"], r["version"]) for r in counted}) == len(counted) or mode == "local"
    assert planned_compositions(cfg) == most > 1


def test_refusals_raise_config_errors_through_the_python_api_too():
    with pytest.raises(ConfigError, match="cannot hold for FedRevive"):
        make_config("fedrevive", **options(dp_noise_multiplier=1.0))


def test_a_sweeps_table_shows_each_trials_epsilon_when_its_runs_have_one():
    import optuna

    from jobs.sweep.report import trial_table

    study = optuna.create_study(direction="maximize")
    for sigma, eps in ((0.5, 9.1), (2.0, 1.7)):
        trial = study.ask({"dp-noise-multiplier": optuna.distributions.FloatDistribution(sigma, sigma)})
        trial.set_user_attr("epsilon", eps)
        study.tell(trial, 0.2)
    table = trial_table(study).splitlines()
    assert "epsilon" in table[0].split() and "9.1" in table[1] and "1.7" in table[2]
    plain = optuna.create_study()
    plain.add_trial(optuna.trial.create_trial(value=0.1))
    assert "epsilon" not in trial_table(plain)


def test_a_dp_run_resumes_with_its_computed_noise_and_refuses_a_longer_budget_past_its_target(tmp_path):
    """The saved config holds the noise its target gave; the original command with --resume finds the same, and a
    longer run, which would spend more than the target with that noise, is refused naming why."""
    import json

    from common.config_flags import given_flags
    from jobs.cli import build_parser
    from processors.models import build_model
    from scheduling import checkpoint

    argv = [*SMALL, "--method", "fedavg", "--max-model-version", "5", "--dp", "central", "--dp-target-epsilon", "8"]
    parser = build_parser("test", method_choice=True)
    saved = build_config("fedavg", vars(parser.parse_args(argv)), presets=True)
    (tmp_path / "metrics.json").write_text(json.dumps({"config": saved.to_dict(), "versions": []}))
    weights = {k: v.numpy() for k, v in build_model("cifar10_convnet").state_dict().items()}
    checkpoint.write(
        str(tmp_path), {"meta": {"version": 1}, "model_manager": {"current_version": 1, "versions": {1: weights}}}
    )

    def resume(extra):
        args = [*argv, *extra, "--resume", str(tmp_path)]
        return build_config("fedavg", vars(parser.parse_args(args)), presets=True, given=given_flags(parser, args))

    assert resume([]).privacy == saved.privacy and saved.privacy.dp_noise_multiplier > 0
    with pytest.raises(ConfigError, match="a resumed run keeps its noise"):
        resume(["--max-model-version", "9"])
