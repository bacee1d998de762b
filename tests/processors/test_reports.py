"""A device's reports (``processors.reports``): both engines report the same last loss, squared loss, steps,
samples and label histogram; asking for them changes no trained bit; an unknown report is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.protocol import DEVICE_EXTRA_PREFIX, DEVICE_REPORTS, LABEL_COUNTS, LOSS, LOSS_SQUARED, SAMPLES, STEPS
from processors.models import build_model
from processors.reports import check_reports
from tests.conftest import make_processor

MODEL = "cifar10_convnet"
DEVICES = ["site-1#3", "site-1#4", "site-2#0"]


def reports(diff: dict) -> dict:
    n = len(DEVICE_EXTRA_PREFIX)
    return {k[n:]: v for k, v in diff.items() if k.startswith(DEVICE_EXTRA_PREFIX)}


def model_part(diff: dict) -> dict:
    return {k: v for k, v in diff.items() if not k.startswith(DEVICE_EXTRA_PREFIX)}


@pytest.mark.parametrize("subset_size", [30, 12])  # 12 < the batch: the vectorised engine pads another device
def test_both_engines_report_the_same_and_train_the_same_bits(subset_size):
    plain = make_processor(synthetic_size=500, subset_size=subset_size, local_iters=3, local_batch_size=16)
    asking = make_processor(synthetic_size=500, subset_size=subset_size, local_iters=3, local_batch_size=16)
    asking.reports = list(DEVICE_REPORTS)
    weights = {k: v.numpy() for k, v in build_model(MODEL).state_dict().items()}
    alone = [asking.train(d, weights, version=1) for d in DEVICES]
    grouped = asking.train_group(DEVICES, weights, version=1)
    for one, group in zip(alone, grouped, strict=True):
        got, want = reports(group), reports(one)
        assert set(got) == set(want) == set(DEVICE_REPORTS)
        for name in (LOSS, LOSS_SQUARED):
            assert want[name].shape == () and np.isfinite(want[name])
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4)
        batch = min(16, subset_size)
        assert want[STEPS] == got[STEPS] == 3 and want[SAMPLES] == got[SAMPLES] == 3 * batch
        assert want[LABEL_COUNTS].sum() == subset_size
        np.testing.assert_array_equal(got[LABEL_COUNTS], want[LABEL_COUNTS])
        assert want[LOSS_SQUARED] >= want[LOSS] ** 2 * 0.999  # E[l^2] >= E[l]^2 (no device term here)
    # asking for reports changes no trained bit, in either engine
    for d, one in zip(DEVICES, alone, strict=True):
        base = plain.train(d, weights, version=1)
        assert all(np.array_equal(base[k], v) for k, v in model_part(one).items()) and set(base) == set(model_part(one))
    for base, group in zip(plain.train_group(DEVICES, weights, version=1), grouped, strict=True):
        assert all(np.array_equal(base[k], v) for k, v in model_part(group).items())
        assert not reports(base)


def test_the_loss_reported_is_the_last_steps_loss():
    """With one step on the whole subset, the reported loss is the received model's cross-entropy on it,
    recomputed by hand, in both engines."""
    # a version no other test trains: a process converts each version's weights once (``global_params_on``)
    version = 7919
    proc = make_processor(synthetic_size=500, subset_size=20, local_iters=1, local_batch_size=20)
    proc.reports = [LOSS, LOSS_SQUARED]
    weights = {k: v.numpy() for k, v in build_model(MODEL).state_dict().items()}
    got = reports(proc.train("site-1#0", weights, version=version))
    grouped = reports(proc.train_group(["site-1#0", "site-1#1"], weights, version=version)[0])
    _, x, y, _ = proc._prepare("site-1#0", version)
    net = build_model(MODEL)
    net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
    net.train()
    with torch.no_grad():
        per_sample = torch.nn.functional.cross_entropy(net(proc.input_prep()(x)), y, reduction="none")
    for r in (got, grouped):
        np.testing.assert_allclose(r[LOSS], per_sample.mean().numpy(), rtol=1e-5)
        np.testing.assert_allclose(r[LOSS_SQUARED], (per_sample**2).mean().numpy(), rtol=1e-5)


def test_an_unknown_report_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="loss_squared"):
        check_reports(["loss", "gradient_norm"])
    assert check_reports(["steps", "loss", "loss"]) == ("loss", "steps")


def test_a_real_device_sends_the_reports_its_job_asks_for():
    """The leaf hands a real device the job's settings (``device_settings``); the device trains with them and
    sends the same reports as a simulated device, through the JSON wire, and the leaf accepts its diff."""
    import json

    from common.device_wire import diff_problem, from_wire, to_wire
    from processors.device_processor import _trainer
    from simulation.leaf_executor import device_settings

    simulated = make_processor(synthetic_size=500, subset_size=20, local_iters=2, local_batch_size=8)
    simulated.reports = [LOSS, LABEL_COUNTS]
    settings = json.loads(json.dumps(device_settings(simulated)))  # what travels in the task's metadata
    assert settings["reports"] == [LOSS, LABEL_COUNTS]
    weights = {k: v.numpy() for k, v in build_model(MODEL).state_dict().items()}
    real = _trainer(json.dumps(settings, sort_keys=True), "cpu", "")
    sent = from_wire(json.loads(json.dumps(to_wire(real.train("site-1#2", weights, version=1)))))
    want = simulated.train("site-1#2", weights, version=1)
    assert set(reports(sent)) == {LOSS, LABEL_COUNTS} and diff_problem(sent, weights) == ""
    for name in (LOSS, LABEL_COUNTS):
        np.testing.assert_array_equal(reports(sent)[name], reports(want)[name])
