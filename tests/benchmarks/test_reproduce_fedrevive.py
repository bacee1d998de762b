"""The reproduction harness's arithmetic: time to an accuracy, mean +- std over seeds, curves on a common grid."""

import json
import os

import pytest

from benchmarks.lib.scales import SCALES, resolved_config
from benchmarks.repro.reproduce_fedrevive import METHODS, job_command, method_labels, on_grid, summary_row, time_to
from jobs.sweep.spec import LIFTED_VERSION_CAP
from tests.conftest import REPO

RUN_A = [
    {"version": 1, "sim_seconds": 0.0, "accuracy": 0.1},
    {"version": 11, "sim_seconds": 5.0, "accuracy": 0.55},
    {"version": 21, "sim_seconds": 9.0, "accuracy": 0.65},
]
RUN_B = [{"version": 1, "sim_seconds": 0.0, "accuracy": 0.1}, {"version": 11, "sim_seconds": 7.0, "accuracy": 0.45}]


def test_time_to_is_the_first_evaluated_version_at_or_above_the_threshold():
    assert time_to(RUN_A, 0.5) == 5.0 and time_to(RUN_A, 0.65) == 9.0
    assert time_to(RUN_B, 0.5) is None


def test_a_summary_row_averages_over_seeds_and_counts_who_reached_each_threshold():
    row = summary_row("fedrevive", [RUN_A, RUN_B])
    assert row["final accuracy"] == "0.550 +- 0.141"  # mean and sample std of 0.65 and 0.45
    assert row["best accuracy"] == "0.550 +- 0.141"
    assert row["time to 0.5"] == "5.000 (1/2)" and row["time to 0.7"] == "- (0/2)"


def test_a_summary_row_counts_the_runs_that_reached_the_budget_and_marks_the_others():
    assert summary_row("fedbuff", [RUN_A, RUN_B])["reached the budget"] == "2/2"
    assert summary_row("fedbuff", [RUN_A, RUN_B], early=1)["reached the budget"] == "1/2 !"


def test_curves_are_read_on_a_common_grid_as_the_last_evaluation_so_far():
    assert on_grid(RUN_A, [-1.0, 0.0, 4.9, 5.0, 100.0]) == [None, 0.1, 0.1, 0.55, 0.65]


def test_each_run_gets_the_budget_the_seed_and_its_own_folders_and_extra_flags_win(tmp_path):
    cmd = job_command("fedbuff", 2, "cpu", 40.0, str(tmp_path / "out"), ["--local-iters", "3"])
    assert cmd[cmd.index("--max-sim-time") + 1] == "40.0" and cmd[cmd.index("--seed") + 1] == "2"
    assert cmd[cmd.index("--max-model-version") + 1] == str(LIFTED_VERSION_CAP)  # the budget ends it, as in a sweep
    assert cmd[-2:] == ["--local-iters", "3"]  # after the scale's own --local-iters: argparse keeps the last
    assert "--synthetic-difficulty" in SCALES["cpu"]["flags"] and "resnet18" in SCALES["paper"]["flags"]


def test_user_methods_are_named_by_their_class_and_only_fedrevive_gets_its_own_flags(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(os.path.join(REPO, "examples"))
    assert method_labels(["fedavg", "fedasync:FedAsync"]) == {"fedavg": "fedavg", "fedasync:FedAsync": "fedasync"}
    with pytest.raises(ValueError, match="Nope"):
        method_labels(["fedasync:Nope"])
    fedrevive = job_command("fedrevive", 0, "cpu", 40.0, str(tmp_path), [])
    user = job_command("fedasync:FedAsync", 0, "cpu", 40.0, str(tmp_path), [])
    assert (
        "--fr-s-max" in fedrevive
        and "--fr-s-max" not in user
        and user[user.index("--method") + 1] == "fedasync:FedAsync"
    )


def test_synchronous_methods_are_evaluated_every_version_and_asynchronous_ones_every_ten(tmp_path):
    def eval_frequency(cmd: list[str]) -> str:
        return cmd[len(cmd) - 1 - cmd[::-1].index("--eval-frequency") + 1]  # the last one given wins

    assert eval_frequency(job_command("fedavg", 0, "cpu", 40.0, str(tmp_path), [])) == "1"
    assert eval_frequency(job_command("fedbuff", 0, "cpu", 40.0, str(tmp_path), [])) == "10"
    assert eval_frequency(job_command("fedrevive", 0, "paper", 200.0, str(tmp_path), [])) == "10"
    assert "--augment" in SCALES["paper"]["flags"] and "--augment" not in SCALES["cpu"]["flags"]  # see its docstring


# -- the paper scale is R2's table run ----------------------------------------------------------------------------
# Written from R2 (NVIDIA/NVFlare research/fedrevive): README "CIFAR-10 configuration" table, its run commands
# (--class-proportion-source true-histogram --generation-interval 1 for FedRevive), the method presets table, and
# dfkd.DFKDConfig / data.py for what the README leaves out. (our field, R2's value, where R2 says it)
R2_PAPER_TABLE = [
    ("data.dataset", "cifar10", "README scope: CIFAR-10"),
    ("federation.num_leaf_nodes * federation.devices_per_leaf", 1000, "Logical clients 1,000"),
    ("data.subset_size", 350, "Samples per logical client 350"),
    ("data.dirichlet_alpha", 0.5, "Dirichlet alpha 0.5"),
    ("data.partition", "references", "data._split_dirichlet: rounded counts, class pools dealt in order"),
    ("data.train_split", "references", "Train/validation/KD split 37,500 / 7,500 / 5,000"),
    ("data.normalisation", "references", "data.CIFAR10_STD (0.2023, 0.1994, 0.2010)"),
    ("training.model", "resnet18", "CIFAR ResNet-18 with feature-statistic trackers"),
    ("training.optimizer", "adam", "Client optimizer Adam"),
    ("training.local_lr", 3e-4, "Client learning rate 3e-4"),
    ("training.local_batch_size", 32, "Client batch size 32"),
    ("training.local_iters", 25, "Local iterations 25"),
    ("training.augment", True, "data.train_transform: RandomCrop(32, padding=4), RandomHorizontalFlip"),
    ("delays", "paper", "train means 1.0/1.3/1.6 p 0.25/0.5/0.25, download 0.1, upload 0.15/0.25 +- 0.02"),
    ("federation.max_sim_time", 200.0, "Simulated-time budget 200"),
    ("federation.device_selection_size", 100, "FedRevive K = 100"),
    ("federation.num_updates_for_model", 1, "FedRevive B = 1"),
    ("federation.min_hole_to_fill", 1, "FedRevive O = 1"),
    ("federation.global_lr", 0.10, "FedRevive server learning rate 0.10"),
    ("fr.teacher_buffer_size", 8, "Teacher buffer 8 models"),
    ("fr.synth_batch_size", 64, "Synthesis batch 64"),
    ("fr.gen_adapt_steps", 2, "Synthesis steps 2"),
    ("fr.synth_every_versions", 1, "Generator interval 1 (the table's run: --generation-interval 1)"),
    ("fr.class_proportions", "true", "--class-proportion-source true-histogram"),
    ("fr.gen_lr", 0.003, "Generator learning rate 0.003"),
    ("fr.gen_meta_lr", 0.003, "DFKDReviver meta-Adam lr = generator_lr 0.003"),
    ("fr.gen_z_lr", 0.001, "Latent learning rate 0.001"),
    ("fr.synth_per_teacher", 32, "KD batch 32 per teacher"),
    ("fr.kd_iters", 10, "KD iterations 10"),
    ("fr.kd_lr", 1e-4, "KD learning rate 1e-4"),
    ("fr.kd_weight_decay", 1e-5, "DFKDReviver student Adam weight_decay 1e-5"),
    ("fr.kd_temperature", 1.0, "DFKDConfig.temperature 1.0"),
    ("fr.adv_weight", 0.1, "DFKD weights: adversarial 0.1"),
    ("fr.bn_weight", 0.003, "DFKD weights: feature 0.003"),
    ("fr.pool_size", 16000, "bounded 16,000-image pool"),
    ("fr.s_max", 75.0, "s_max = 75"),
    ("fr.distill_from_version", 50, "DFKD starts after model version 50"),
    ("fr.kd_train_from_version", 100, "the version-100 warmup"),
    ("fr.gen_noise_dim", 256, "DFKDConfig.latent_size 256"),
    ("fr.gen_width", 128, "DFKDConfig.generator_features 128"),
    ("fr.gen_class_weight", 0.2, "DFKDConfig.class_embedding_weight 0.2"),
    ("fr.stabilize_losses", True, "DFKDReviver._stabilize on the four losses"),
]


def paper_config(method: str = "fedrevive", variant: str = ""):
    return resolved_config(job_command(method, 10, "paper", 200.0, "/tmp/out", [], variant))


def value_of(cfg, field: str):
    if field == "delays":
        from common.delays import DELAY_PRESETS

        return "paper" if cfg.delays == DELAY_PRESETS["paper"] else cfg.delays
    if "*" in field:
        a, b = (value_of(cfg, f.strip()) for f in field.split("*"))
        return a * b
    part, name = field.split(".")
    return getattr({"fr": cfg.method_settings}.get(part) or getattr(cfg, part), name)


@pytest.mark.parametrize("field,r2_value,r2_says", R2_PAPER_TABLE, ids=[r[0] for r in R2_PAPER_TABLE])
def test_the_paper_scale_is_r2s_table_run_field_by_field(field, r2_value, r2_says):
    expected = pytest.approx(r2_value) if isinstance(r2_value, float) else r2_value
    assert value_of(paper_config(), field) == expected, r2_says


def test_the_paper_scale_runs_the_generator_with_the_references_std():
    from jobs.methods import method_of

    args = method_of("fedrevive").strategy_args(paper_config())
    assert args["image_std"] == [0.2023, 0.1994, 0.2010]
    # and the other methods see the same data and budget as FedRevive
    for method in ("fedavg", "fedbuff"):
        cfg = paper_config(method)
        assert cfg.data == paper_config().data and cfg.federation.max_sim_time == 200.0


def test_the_paper_aligned_variant_is_r2s_other_mode():
    s = paper_config(variant="paper-aligned").method_settings
    assert (s.synth_every_versions, s.class_proportions, s.probe_samples) == (10, "estimate", 64)
    assert (s.probe_temperature, s.kd_iters) == (0.8, 10)  # the rest as the continuous mode


def test_the_cpu_scale_keeps_its_settings():
    s = resolved_config_cpu().method_settings
    assert (s.synth_every_versions, s.class_proportions, s.s_max) == (10, "true", 15.0)


def resolved_config_cpu():
    return resolved_config(job_command("fedrevive", 0, "cpu", 40.0, "/tmp/out", []))


def test_the_paper_results_sit_beside_r2s_numbers():
    from benchmarks.repro.reproduce_fedrevive import beside_r2

    rows = beside_r2([summary_row("fedrevive", [RUN_A, RUN_B]), summary_row("fedasync", [RUN_A])])
    assert [r["method"] for r in rows] == ["fedrevive"]
    assert rows[0]["final accuracy (R2, seed 10)"] == "0.761" and rows[0]["versions (R2, seed 10)"] == "12687"


def test_trace_counts_count_fedrevives_server_work_within_the_budget(tmp_path):
    from benchmarks.repro.reproduce_fedrevive import trace_counts

    events = [
        {"version": 49, "arrival": 1.0, "tau": 3},  # before synthesis
        {"version": 60, "arrival": 2.0, "tau": 2},  # synthesis only
        {"version": 100, "arrival": 3.0, "tau": 0},  # fresh: nothing
        {"version": 101, "arrival": 4.0, "tau": 5},  # synthesis and distillation
        {"version": 102, "arrival": 9.0, "tau": 5},  # past the budget
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(f"{json.dumps(e)}\n" for e in events))
    counts = trace_counts(str(path), 5.0)
    assert counts == {"updates": 4, "versions": 101, "synthesis rounds (interval 1)": 2, "distillations": 1}


@pytest.mark.parametrize("scale, variant", [("cpu", ""), ("paper", "paper-aligned")])
def test_the_grid_as_a_sweep_spec_runs_the_same_jobs(scale, variant):
    """``--sweep``: every (method, seed) trial of the spec resolves to the config of the job ``job_command`` runs
    (extra flags winning in both), so the sweep's table is the same table."""
    from benchmarks.repro.reproduce_fedrevive import sweep_spec
    from common.config_flags import flag_args
    from jobs.sweep.spec import check_flags, parse_spec

    extra = ["--local-iters", "3"]
    spec = parse_spec(sweep_spec(scale, list(METHODS), [0, 4], 30.0, extra, variant, "/tmp/ws"), "reproduce")
    check_flags(spec)
    assert len(spec.cells()) == 6 and spec.objective.metric == "accuracy_at" and spec.objective.budget == 30.0
    for cell in spec.cells():
        words = ["python", "job.py", *flag_args(spec.trial_flags(cell)), "--output", "/tmp/out"]
        job = job_command(cell["method"], cell["seed"], scale, 30.0, "/tmp/out", extra, variant)
        swept, alone = resolved_config(words).to_dict(), resolved_config(job).to_dict()
        assert swept["run"].pop("workspace") != alone["run"].pop("workspace")  # each its own folder
        assert swept == alone, cell
        assert swept["training"]["local_iters"] == 3
