"""A method's device hook (``processors.objective.DeviceObjective``): its loss term changes local training the
same way in both engines, and the server's extra state reaches it with the version's weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.packed_weights import unpack
from common.protocol import DEVICE_EXTRA_PREFIX
from processors.data.sources import make_synthetic
from processors.models import build_model
from processors.objective import DeviceObjective, make_objective
from processors.task_wire import device_extras
from processors.training import TrainingConfig, train_local, worker_model
from processors.training_vectorized import train_group

MODEL = "cifar10_convnet"
CPU = torch.device("cpu")
CFG = TrainingConfig(model=MODEL, local_iters=4, local_batch_size=16, local_lr=0.05, optimizer="sgd")


class Proximal(DeviceObjective):
    def __init__(self, mu: float):
        self.mu = mu

    def loss(self, params, received, extras):
        return 0.5 * self.mu * sum(((p - received[n]) ** 2).sum() for n, p in params.items())


class TowardsExtras(DeviceObjective):
    """A linear pull along a direction the server sends (as a control variate would be)."""

    def loss(self, params, received, extras):
        return sum((p * extras[n]).sum() for n, p in params.items() if n in extras)


@pytest.fixture(scope="module")
def setup():
    data = make_synthetic(200, 50, seed=5)
    torch.manual_seed(3)
    params = {k: v.detach().clone() for k, v in build_model(MODEL).state_dict().items()}
    devices = [(data.x_train[i * 40 : (i + 1) * 40], data.y_train[i * 40 : (i + 1) * 40]) for i in range(3)]
    return params, devices


def both_engines(params, devices, objective=None, extras=None):
    model = worker_model(MODEL, CPU)
    gens = [torch.Generator().manual_seed(i) for i in range(len(devices))]
    per_device = [
        train_local(model, params, x, y, CFG, g, objective=objective, extras=extras)
        for (x, y), g in zip(devices, gens, strict=True)
    ]
    gens = [torch.Generator().manual_seed(i) for i in range(len(devices))]
    vectorised = train_group(MODEL, params, devices, CFG, gens, CPU, objective=objective, extras=extras)
    return per_device, vectorised


PARAMETERS = [name for name, _ in build_model(MODEL).named_parameters()]  # the diff also holds data statistics


def norm(diff: dict) -> float:
    return float(np.sqrt(sum((diff[k].astype(np.float64) ** 2).sum() for k in PARAMETERS)))


def assert_engines_agree(per_device, vectorised):
    for a, b in zip(per_device, vectorised, strict=True):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], atol=2e-5, err_msg=k)


def test_a_proximal_term_keeps_devices_near_the_global_model_in_both_engines(setup):
    params, devices = setup
    plain, _ = both_engines(params, devices)
    per_device, vectorised = both_engines(params, devices, Proximal(mu=5.0))
    assert_engines_agree(per_device, vectorised)
    for free, held in zip(plain, per_device, strict=True):
        assert norm(held) < 0.9 * norm(free), (norm(held), norm(free))
    zero, _ = both_engines(params, devices, Proximal(mu=0.0))  # mu 0 is plain training
    for a, b in zip(plain, zero, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_the_servers_extra_state_steers_training_the_same_way_in_both_engines(setup):
    params, devices = setup
    direction = {n: torch.full_like(p, 0.01) for n, p in params.items() if n.endswith("weight")}
    plain, _ = both_engines(params, devices)
    per_device, vectorised = both_engines(params, devices, TowardsExtras(), direction)
    assert_engines_agree(per_device, vectorised)
    name = next(iter(direction))
    moved = np.mean([d[name].mean() - p[name].mean() for d, p in zip(per_device, plain, strict=True)])
    assert moved < -1e-3, moved  # the linear term pushed the weights against the direction


def test_extras_travel_with_a_version_and_stay_out_of_the_model():
    from aggregation.buffered_mean import BufferedMean
    from aggregation.global_model import GlobalModel
    from aggregation.strategy import ModelHistory, Update
    from tests.fakes.engine import EventEngine

    class WithExtras(BufferedMean):
        def device_extras(self, model: ModelHistory) -> dict:
            return {"c": np.full(2, float(model.current_version), np.float32)}

    gm = GlobalModel("aggregation.buffered_mean:BufferedMean", {"global_lr": 1.0})
    gm.server_strategy = WithExtras()
    fl_ctx = EventEngine({}).new_context()
    gm.start({"w": np.zeros(2, np.float32)}, 1, fl_ctx)
    gm.server_strategy.add_update(Update("a#0", 1, 1, {"w": np.ones(2, np.float32)}, 0, 0.0), gm)
    gm.make_version(2, 1.0, fl_ctx)
    sent = unpack(gm.model_packed(2))
    assert set(sent) == {"w", DEVICE_EXTRA_PREFIX + "c"} and sent[DEVICE_EXTRA_PREFIX + "c"].tolist() == [2.0, 2.0]
    assert set(gm.current_weights) == {"w"}  # evaluation, checkpoints of the model and global_model.pt: weights only
    assert device_extras({k: torch.as_tensor(v) for k, v in sent.items()})["c"].tolist() == [2.0, 2.0]
    again = GlobalModel("aggregation.buffered_mean:BufferedMean", {"global_lr": 1.0})
    again.server_strategy = WithExtras()
    again.load_state_dict(gm.state_dict(), fl_ctx)
    assert unpack(again.model_packed(2))[DEVICE_EXTRA_PREFIX + "c"].tolist() == [2.0, 2.0]


def test_what_is_not_an_objective_is_refused_naming_it():
    assert make_objective("") is None
    with pytest.raises(ValueError, match="is not a processors.objective.DeviceObjective"):
        make_objective("aggregation.buffered_mean:BufferedMean")


def test_a_devices_label_histogram_reaches_the_strategy_beside_its_diff():
    """FedRevive's true class proportions: the device reports its histogram in its diff's extra part, and the
    strategy gets it as ``Update.reports``, with a diff of the model only."""
    from aggregation.buffered_mean import BufferedMean
    from aggregation.global_model import GlobalModel
    from common.protocol import LABEL_COUNTS, DeviceUpdate
    from tests.conftest import make_processor
    from tests.fakes.engine import EventEngine

    proc = make_processor(synthetic_size=500, subset_size=30, local_iters=1, local_batch_size=8)
    proc.reports = [LABEL_COUNTS]
    weights = {k: v.numpy() for k, v in build_model(MODEL).state_dict().items()}
    alone = proc.train("site-1#3", weights, version=1)
    grouped = proc.train_group(["site-1#3", "site-1#4"], weights, version=1)
    counts = alone[DEVICE_EXTRA_PREFIX + LABEL_COUNTS]
    assert counts.sum() == 30 and np.array_equal(grouped[0][DEVICE_EXTRA_PREFIX + LABEL_COUNTS], counts)

    seen = []

    class Recording(BufferedMean):
        def add_update(self, update, model):
            seen.append(update)
            super().add_update(update, model)

    gm = GlobalModel("aggregation.buffered_mean:BufferedMean", {"global_lr": 1.0})
    gm.server_strategy = Recording()
    fl_ctx = EventEngine({}).new_context()
    gm.start(weights, 1, fl_ctx)
    gm.add_update(DeviceUpdate("site-1#3", 1, 1, alone), 0, fl_ctx)
    assert set(seen[0].diff) == set(weights) and np.array_equal(seen[0].reports[LABEL_COUNTS], counts)
    gm.make_version(2, 1.0, fl_ctx)
    assert set(gm.current_weights) == set(weights)


class ProximalTowardsExtras(DeviceObjective):
    """Both: held to the version the device received, pulled along its version's direction."""

    def loss(self, params, received, extras):
        return Proximal(5.0).loss(params, received, extras) + TowardsExtras().loss(params, received, extras)


def test_a_group_of_several_versions_holds_each_device_to_its_own_version_and_extras(setup):
    """An asynchronous release trains devices of different versions together: the hook gets each device's own."""
    params, devices = setup
    g = torch.Generator().manual_seed(9)
    other = {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in params.items()}  # a later version
    direction = {n: torch.full_like(p, 0.01) for n, p in params.items() if n.endswith("weight")}
    towards = [direction, {n: -d for n, d in direction.items()}, direction]
    starts = [params, other, params]
    model, objective = worker_model(MODEL, CPU), ProximalTowardsExtras()
    alone = [
        train_local(model, s, x, y, CFG, torch.Generator().manual_seed(i), objective=objective, extras=e)
        for i, (s, (x, y), e) in enumerate(zip(starts, devices, towards, strict=True))
    ]
    gens = [torch.Generator().manual_seed(i) for i in range(len(devices))]
    grouped = train_group(MODEL, starts, devices, CFG, gens, CPU, objective=objective, extras=towards)
    assert_engines_agree(alone, grouped)
    gens = [torch.Generator().manual_seed(i) for i in range(len(devices))]
    one_version = train_group(MODEL, params, devices, CFG, gens, CPU, objective=objective, extras=direction)
    assert not np.allclose(grouped[1]["fc1.weight"], one_version[1]["fc1.weight"], atol=1e-4)
