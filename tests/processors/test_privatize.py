"""Differential privacy on the device: both engines clip each device's update exactly as a plain PyTorch clip of the
same diff does (``torch.nn.utils.clip_grad_norm_``), zero the statistics' diffs, and local DP's noise is seeded,
the same in either engine and of the stated standard deviation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.dp_noise import GaussianNoise
from common.privacy import CLIP_NORM, UNCLIPPED
from common.protocol import DEVICE_EXTRA_PREFIX
from processors.data.sources import make_synthetic
from processors.models import build_model, initial_model, statistic_names
from processors.privatize import clip_update, local_noise
from processors.task_processor import TrainingTaskProcessor
from processors.task_wire import device_extras
from processors.training import TrainingConfig, train_local, worker_model
from processors.training_vectorized import train_group

MODEL = "cifar10_convnet"
CPU = torch.device("cpu")
CFG = TrainingConfig(local_iters=2, local_batch_size=8, local_lr=0.05, optimizer="sgd")


@pytest.fixture(scope="module")
def data():
    ds = make_synthetic(100, 20, seed=4)
    sizes, out, start = [12, 20, 32], [], 0
    for n in sizes:
        out.append((ds.x_train[start : start + n], ds.y_train[start : start + n]))
        start += n
    return out


@pytest.fixture(scope="module")
def start():
    torch.manual_seed(3)
    return {k: v.detach().clone() for k, v in build_model(MODEL).state_dict().items()}


def generators(k: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(20 + i) for i in range(k)]


# PyTorch scales by clip / (norm + 1e-6), ours by clip / norm: for these updates' norms (of order 0.1) a relative
# difference of about 1e-5
RTOL = 1e-4


def torch_clip(diff: dict[str, np.ndarray], parameters: list[str], clip_norm: float) -> dict[str, np.ndarray]:
    """The reference: PyTorch's own gradient clipping, applied to the diff as if it were the gradients."""
    holders = []
    for name in parameters:
        p = torch.nn.Parameter(torch.zeros(diff[name].shape))
        p.grad = torch.from_numpy(diff[name].copy())
        holders.append(p)
    torch.nn.utils.clip_grad_norm_(holders, clip_norm)
    return {name: p.grad.numpy() for name, p in zip(parameters, holders, strict=True)}


def norms(diffs: list[dict], parameters: list[str]) -> list[float]:
    return [float(np.sqrt(sum(float((d[k].astype(np.float64) ** 2).sum()) for k in parameters))) for d in diffs]


def test_both_engines_clip_each_update_as_a_plain_pytorch_clip_of_the_same_diff(data, start):
    model = worker_model(MODEL, CPU)
    parameters = [n for n, _ in model.named_parameters()]
    statistics = statistic_names(model)
    plain = [train_local(model, start, x, y, CFG, g) for (x, y), g in zip(data, generators(3), strict=True)]
    lengths = norms(plain, parameters)
    clip = float(np.median(lengths))  # one device below the norm, one at it, one above: each case is checked
    assert min(lengths) < clip < max(lengths)

    measured: list[float] = []
    alone = [
        train_local(model, start, x, y, CFG, g, clip_norm=clip, update_norm=measured)
        for (x, y), g in zip(data, generators(3), strict=True)
    ]
    group_measured: list[float] = []
    grouped = train_group(
        MODEL, start, data, CFG, generators(3), CPU, clip_norms=[clip] * 3, update_norms=group_measured
    )
    plain_grouped = train_group(MODEL, start, data, CFG, generators(3), CPU)
    np.testing.assert_allclose(measured, lengths, rtol=1e-5)
    np.testing.assert_allclose(group_measured, norms(plain_grouped, parameters), rtol=1e-5)
    for engine, unclipped in ((alone, plain), (grouped, plain_grouped)):
        for got, raw in zip(engine, unclipped, strict=True):
            want = torch_clip(raw, parameters, clip)
            for name in parameters:
                np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=1e-9, err_msg=name)
            for name in statistics:  # never sent under DP: they would leave the device unclipped
                assert not got[name].any()
        assert max(norms(engine, parameters)) == pytest.approx(clip, rel=1e-5)


def test_the_vectorised_engine_clips_each_device_to_its_own_versions_norm(data, start):
    parameters = [n for n, _ in worker_model(MODEL, CPU).named_parameters()]
    plain = train_group(MODEL, start, data, CFG, generators(3), CPU)
    bounds = [1e-3, 1e3, 0.5 * norms(plain, parameters)[2]]
    clipped = train_group(MODEL, start, data, CFG, generators(3), CPU, clip_norms=bounds)
    for got, raw, bound in zip(clipped, plain, bounds, strict=True):
        want = torch_clip(raw, parameters, bound)
        for name in parameters:
            np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=1e-9, err_msg=name)


def test_clip_update_leaves_a_short_update_alone_and_scales_a_long_one_to_the_norm():
    short = {"a": torch.tensor([0.3, 0.4])}
    same, norm = clip_update(short, torch.tensor(1.0))
    assert torch.equal(same["a"], short["a"]) and float(norm) == pytest.approx(0.5)
    long, norm = clip_update({"a": torch.tensor([3.0, 4.0]), "b": torch.zeros(3)}, torch.tensor(1.0))
    assert float(norm) == pytest.approx(5.0)
    assert torch.allclose(long["a"], torch.tensor([0.6, 0.8]))


KEY = "a-runs-noise-key"


def dp_processor(mode: str, noise: float | None = None, source: str = "seeded") -> TrainingTaskProcessor:
    from processors.data.config import DataConfig

    privacy = {"dp": mode}
    if noise is not None:
        privacy |= {"noise_multiplier": noise, "noise": source} | ({"noise_key": KEY} if source == "seeded" else {})
    return TrainingTaskProcessor(
        data=DataConfig(synthetic_size=500, subset_size=16).to_dict(),
        training=TrainingConfig(
            compute_device="cpu", local_iters=1, local_batch_size=8, local_lr=0.05, optimizer="sgd"
        ).to_dict(),
        seed=5,
        privacy=privacy,
    )


def weights_with_clip(clip: float) -> dict[str, np.ndarray]:
    weights = {k: v.numpy() for k, v in initial_model(MODEL, 0).state_dict().items()}
    return weights | {DEVICE_EXTRA_PREFIX + CLIP_NORM: np.array([clip], dtype=np.float32)}


def test_central_dp_devices_report_whether_they_were_clipped_and_hide_the_clip_norm_from_the_method():
    proc = dp_processor("central")
    devices = ["site-1#0", "site-1#1"]
    for version, clip, expected in ((1, 1e-4, 0.0), (2, 1e4, 1.0)):
        weights = weights_with_clip(clip)
        for diff in [proc.train(devices[0], weights, version), *proc.train_group(devices, weights, version)]:
            assert float(diff[DEVICE_EXTRA_PREFIX + UNCLIPPED]) == expected
            assert norms([diff], [n for n, _ in worker_model(MODEL, CPU).named_parameters()])[0] <= clip * (1 + 1e-5)
    assert CLIP_NORM not in device_extras({k: torch.as_tensor(v) for k, v in weights_with_clip(1.0).items()})
    with pytest.raises(ValueError, match="carries no clip norm"):
        proc.train(devices[0], {k: v.numpy() for k, v in initial_model(MODEL, 0).state_dict().items()}, 3)


def test_local_dp_noise_is_seeded_the_same_in_both_engines_and_has_the_stated_deviation():
    sigma, clip = 0.8, 0.05
    central, local = dp_processor("central"), dp_processor("local", sigma)
    weights = weights_with_clip(clip)
    devices = ["site-1#0", "site-2#3"]
    parameters = [n for n, _ in worker_model(MODEL, CPU).named_parameters()]
    clipped = central.train_group(devices, weights, 2)
    alone = [local.train(d, weights, 2) for d in devices]
    grouped = local.train_group(devices, weights, 2)
    for noised, again, base, device in zip(alone, grouped, clipped, devices, strict=True):
        assert DEVICE_EXTRA_PREFIX + UNCLIPPED not in noised  # local DP sends nothing un-noised beside the update
        noise = np.concatenate([(noised[k] - base[k]).ravel() for k in parameters])
        assert abs(noise.std() / (sigma * clip) - 1) < 0.02 and abs(noise.mean()) < 0.02 * sigma * clip
        # the same seeded draws in either engine: the noised updates differ by the engines' float order only
        for k in parameters:
            np.testing.assert_allclose(again[k], noised[k], rtol=0, atol=1e-5, err_msg=k)
        zero = {k: np.zeros_like(v) for k, v in base.items()}
        seeded = GaussianNoise("seeded", KEY)
        first = local_noise(zero, parameters, sigma * clip, seeded, device, 2)
        assert all(
            np.array_equal(first[k], local_noise(zero, parameters, sigma * clip, seeded, device, 2)[k])
            for k in parameters
        )
    zero = {k: np.zeros_like(v) for k, v in clipped[0].items()}
    seeded = GaussianNoise("seeded", KEY)
    by_version = [local_noise(zero, parameters, 1.0, seeded, devices[0], v)["fc1.weight"] for v in (2, 3)]
    assert not np.array_equal(*by_version)  # each version's task draws its own noise


def test_a_real_devices_local_noise_is_its_own_entropy_never_a_function_of_what_its_task_carries():
    """The leaf hands a real device the job's privacy settings (``device_settings``) with its task. Even when the
    task says ``seeded`` and carries a key (a server that wants to subtract the noise later), the device draws its
    noise from its own entropy: the same task twice gives two different noises, neither the simulator's seeded one,
    each of the stated deviation, and the update is still clipped to the version's norm."""
    import json

    from common.device_wire import diff_problem, from_wire, to_wire
    from processors.device_processor import _trainer
    from simulation.leaf_executor import device_settings

    sigma, clip = 0.5, 0.05
    simulated = dp_processor("local", sigma)  # seeded, with the run's key: what an adversarial task would carry
    settings = json.loads(json.dumps(device_settings(simulated)))  # what travels in the task's metadata
    assert settings["privacy"] == {"dp": "local", "noise_multiplier": sigma, "noise": "seeded", "noise_key": KEY}
    weights = weights_with_clip(clip)
    central = dp_processor("central")
    base = central.train("site-1#2", weights, version=4)  # the clipped update alone
    parameters = [n for n, _ in worker_model(MODEL, CPU).named_parameters()]
    sent = []
    for state_dir in ("a", "b"):  # two processes' worth of trainers (the cache is per settings)
        _trainer.cache_clear()
        real = _trainer(json.dumps(settings, sort_keys=True), "cpu", "", state_dir)
        sent.append(from_wire(json.loads(json.dumps(to_wire(real.train("site-1#2", weights, version=4))))))
    seeded = simulated.train("site-1#2", weights, version=4)
    for got in sent:
        assert diff_problem(got, weights) == "" and got.keys() == seeded.keys()
        noise = np.concatenate([(got[k] - base[k]).ravel() for k in parameters])
        assert abs(noise.std() / (sigma * clip) - 1) < 0.05
    apart = np.concatenate([(sent[0][k] - sent[1][k]).ravel() for k in parameters])
    assert apart.std() > sigma * clip  # two independent draws: sqrt(2) sigma C apart, not equal
    for got in sent:
        gap = np.concatenate([(got[k] - seeded[k]).ravel() for k in parameters])
        assert gap.std() > sigma * clip  # nothing of the key the task carried: not the simulator's seeded noise
