"""The next-character task: token-id data passes the data path untouched, LEAF's char-LSTM learns generated text
above the frequency baseline, both engines train it to the same diffs, ``auto`` picks the engine the benchmark
measured, and FedRevive (image synthesis) refuses the task before anything starts.

Windows of 8 characters instead of LEAF's 80 keep the training real and fast: the model is the same (its
parameters do not depend on the window), the generated text's next character depends on the last one only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from processors.data.sources import DatasetSpec, from_arrays, load_dataset
from processors.data.text import ALL_LETTERS, VOCAB_SIZE, make_synthetic_text, windows
from processors.models import build_model, initial_model
from processors.models.char_lstm import CharLSTM
from processors.training import TrainingConfig, evaluate_accuracy, train_local
from tests.conftest import assert_both_engines_agree
from tests.text_baseline import frequency_baseline

SHORT = 8  # characters per sample in these tests


def short_text() -> dict[str, np.ndarray]:
    """A user's text task by import path (``--dataset tests.processors.test_char_lstm:short_text``): 8-character
    windows of the generated text, as int32 token ids (the loader converts them)."""
    x_train, y_train, x_test, y_test = make_synthetic_text(1500, 300, seed=5, window=SHORT)
    return {"x_train": x_train.numpy().astype(np.int32), "y_train": y_train.numpy(), "x_test": x_test.numpy(),
            "y_test": y_test.numpy()}  # fmt: skip


def test_generated_text_is_seeded_token_ids_that_the_data_path_leaves_as_they_are():
    data = load_dataset(DatasetSpec(name="synthetic-text", synthetic_size=300, seed=1))
    assert len(ALL_LETTERS) == VOCAB_SIZE == 80 and data.num_classes == 80
    assert data.is_text and data.x_train.dtype == torch.int64 and data.input_shape == (80,)
    assert data.mean is None and data.prepare(data.x_test) is data.x_test  # no standardisation, no float
    # a label is the character after its window: the next window's last id
    assert torch.equal(data.y_train[:-1], data.x_train[1:, -1])
    again = load_dataset(DatasetSpec(name="synthetic-text", synthetic_size=300, seed=1, data_root="/elsewhere"))
    other = load_dataset(DatasetSpec(name="synthetic-text", synthetic_size=300, seed=2))
    assert torch.equal(again.x_train, data.x_train) and not torch.equal(other.x_train, data.x_train)
    with pytest.raises(ValueError, match="no 80-character window"):
        windows(np.arange(80))

    user = from_arrays(short_text(), "--dataset short_text")  # int32 ids from a user: token ids, as int64
    assert user.is_text and user.x_train.dtype == torch.int64 and user.input_shape == (SHORT,)
    assert user.prepare(user.x_train) is user.x_train and user.mean is None
    bad = short_text() | {"x_train": np.zeros((4, 2, 3), dtype=np.int64)}
    with pytest.raises(ValueError, match="integer inputs are token ids, N x L"):
        from_arrays(bad, "--dataset bad")


def test_the_char_lstm_is_leafs_shape_and_scores_the_80_symbols():
    model = build_model("char_lstm")
    assert isinstance(model, CharLSTM) and model.embedding.weight.shape == (80, 8)
    assert (model.lstm.num_layers, model.lstm.hidden_size) == (2, 256)
    assert model(torch.zeros(3, 80, dtype=torch.int64)).shape == (3, 80)
    a, b = initial_model("char_lstm", 4), initial_model("char_lstm", 4)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.slow  # real training of an 820k-parameter LSTM: seconds, not milliseconds
def test_the_char_lstm_learns_generated_text_above_the_frequency_baseline():
    data = from_arrays(short_text(), "short_text")
    baseline = frequency_baseline(data.y_train, data.y_test)
    model = initial_model("char_lstm", 0)
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    before = evaluate_accuracy(model, data.x_test, data.y_test, prepare=data.prepare)
    cfg = TrainingConfig(model="char_lstm", local_iters=25, local_batch_size=16, local_lr=1e-2)
    train_local(model, start, data.x_train, data.y_train, cfg, torch.Generator().manual_seed(0), prepare=data.prepare)
    after = evaluate_accuracy(model, data.x_test, data.y_test, prepare=data.prepare)
    # seen: baseline 0.13, 0.29 after 20 steps, 0.46 after 40; the chain's best possible is about 0.6
    assert after > baseline + 0.1 and after > before + 0.1, (before, after, baseline)


@pytest.mark.slow  # real training of an 820k-parameter LSTM: seconds, not milliseconds
def test_both_engines_train_a_text_group_to_each_devices_own_diff():
    """The task processor's two paths on token ids: a group (vectorised engine: the LSTM unrolled under vmap) and
    each device alone (per-device engine: torch's fused LSTM) give the same diffs, up to summation order."""
    from processors.data.config import DataConfig

    data = DataConfig(dataset="tests.processors.test_char_lstm:short_text", subset_size=24)
    training = TrainingConfig(model="char_lstm", local_iters=3, local_batch_size=8, compute_device="cpu")
    assert_both_engines_agree(data, training, ["site-1#0", "site-2#3"])


def test_auto_trains_the_lstm_one_device_at_a_time_on_the_cpu_and_grouped_on_a_gpu():
    """FlopCounterMode misses torch's fused LSTM kernel; the planner counts it (381 MFLOP per 80-character sample),
    so on the CPU ``auto`` trains it as benchmarks/perf/bench_engine.py --model char_lstm measured faster."""
    from simulation.planner import CPU_GROUP_MAX_MFLOPS, WorkerPlan, plan_engine, training_mflops

    mflops = training_mflops(build_model("char_lstm"), (80,))
    assert mflops == pytest.approx(381.5, abs=1) and mflops > CPU_GROUP_MAX_MFLOPS
    cpu = WorkerPlan(2, "cpu", 16, 10**8, {}, "cpu", None)
    assert plan_engine(cpu, "auto", mflops_per_sample=mflops).engine == "per-device"
    gpu = WorkerPlan(2, "gpu_memory", 16, 10**8, {}, "1 GPU(s)", 40 * 10**9)
    assert plan_engine(gpu, "auto", mflops_per_sample=None).engine == "vectorized"
    assert plan_engine(cpu, "vectorized", mflops_per_sample=mflops).engine == "vectorized"  # still allowed


def test_fedrevive_refuses_a_text_task_in_one_line_before_anything_starts(monkeypatch, capsys):
    from jobs.cli import job_main
    from jobs.run import driver

    def boom(*_a, **_k):
        raise AssertionError("an NVFlare environment was made for a refused config")

    monkeypatch.setattr(driver, "make_env", boom)
    flags = [
        "--dataset",
        "synthetic-text",
        "--synthetic-size",
        "300",
        "--model",
        "char_lstm",
        "--devices-per-leaf",
        "4",
        "--device-selection-size",
        "4",
    ]
    code = job_main("test", ["--method", "fedrevive", *flags])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "FedRevive synthesizes images; this is a text task" in err and "use --method fedbuff or fedavg" in err
