"""The server strategy interface: the global model drives any ``ServerStrategy`` (a user's own, named by an import
path), hands it each update with its staleness and simulated time, keeps the versions it asks for, checkpoints its
state, and refuses what is not a strategy."""

from __future__ import annotations

import time

import numpy as np
import pytest
from nvflare.apis.event_type import EventType

from aggregation.global_model import GlobalModel
from aggregation.strategy import ModelHistory, ServerStrategy, Update, Weights
from common.protocol import SERVER_WORK, DeviceUpdate, SelectionSum
from tests.fakes.engine import EventEngine


class StalenessWeightedMean(ServerStrategy):
    """A user's method: each update weighted by 1 / (1 + tau); it also reads the version before the current one."""

    def __init__(self, lr: float = 1.0):
        self.lr, self.seen, self._sum, self._weight = lr, [], None, 0.0

    def add_update(self, update: Update, model: ModelHistory) -> None:
        self.seen.append((update.device, update.base_version, update.count, update.tau, update.sim_time))
        w = 1.0 / (1 + update.tau)
        scaled = {k: np.float32(w) * v for k, v in update.diff.items()}
        self._sum = scaled if self._sum is None else {k: self._sum[k] + scaled[k] for k in scaled}
        self._weight += w * update.count

    def make_version(self, model: ModelHistory, sim_time: float) -> Weights:
        new = {k: v + np.float32(self.lr / self._weight) * self._sum[k] for k, v in model.current_weights.items()}
        self._sum, self._weight = None, 0.0
        return new

    def needed_versions(self) -> set[int]:
        return {1}

    def state_dict(self) -> dict:
        return {"sum": self._sum, "weight": self._weight}

    def load_state_dict(self, state: dict) -> None:
        self._sum, self._weight = state["sum"], state["weight"]

    def status(self, model: ModelHistory) -> str:
        return f"{len(self.seen)} updates at version {model.current_version}"


PATH = f"{__name__}:StalenessWeightedMean"


def _model(**kw) -> tuple[GlobalModel, object]:
    model = GlobalModel(PATH, {"lr": 0.5}, **kw)
    engine = EventEngine({"model": model})
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    return model, ctx


def _update(device: str, base: int, value: float) -> DeviceUpdate:
    return DeviceUpdate(device, 1, base, {"w": np.full(2, value, np.float32)})


def test_a_users_strategy_gets_each_update_with_its_staleness_and_time_and_makes_the_versions(tmp_path):
    model, ctx = _model(results_dir=str(tmp_path))
    assert (
        model.server_strategy.context.results_dir == str(tmp_path)
        and model.server_strategy.context.statistics == frozenset()
    )
    model.start({"w": np.zeros(2)}, 1, ctx)
    model.add_update(_update("a#0", 1, 2.0), 0, ctx, sim_time=1.5)
    model.add_update(_update("a#1", 1, 4.0), 0, ctx, sim_time=2.0)
    model.make_version(2, 2.0, ctx)
    np.testing.assert_array_equal(model.current_weights["w"], np.full(2, 1.5, np.float32))  # 0.5 x mean(2, 4)
    model.add_update(_update("a#2", 1, 3.0), 1, ctx, sim_time=3.0)  # stale by one version: weight 1/2
    model.make_version(3, 3.0, ctx)
    np.testing.assert_array_equal(model.current_weights["w"], np.full(2, 3.0, np.float32))  # 1.5 + 0.5 x 3
    assert model.server_strategy.seen == [("a#0", 1, 1, 0, 1.5), ("a#1", 1, 1, 0, 2.0), ("a#2", 1, 1, 1, 3.0)]
    assert model.status() == "3 updates at version 3"
    model.retain(set())
    assert sorted(model.state_dict()["versions"]) == [1, 3]  # its needed version 1, and the current one


def test_a_selection_sum_reaches_the_strategy_once_as_one_update_of_its_devices(tmp_path):
    model, ctx = _model(results_dir=str(tmp_path))
    model.start({"w": np.zeros(2)}, 1, ctx)
    group = SelectionSum(7, 1, {f"a#{i}": 1 for i in range(3)}, {"w": np.full(2, 6.0, np.float32)}, 3)
    for i in range(3):
        model.add_update(DeviceUpdate(f"a#{i}", 7, 1, None, group=group), 0, ctx)
    assert [(device, count) for device, _, count, _, _ in model.server_strategy.seen] == [("a#0", 3)]
    model.make_version(2, 1.0, ctx)
    np.testing.assert_array_equal(model.current_weights["w"], np.full(2, 1.0, np.float32))  # 0.5 x 6 / 3


def test_a_checkpoint_carries_the_strategys_state_mid_buffer(tmp_path):
    model, ctx = _model(results_dir=str(tmp_path))
    model.start({"w": np.zeros(2)}, 1, ctx)
    model.add_update(_update("a#0", 1, 2.0), 0, ctx)
    state = model.state_dict()
    again, ctx2 = _model(results_dir=str(tmp_path))
    again.load_state_dict(state, ctx2)
    for m, c in ((model, ctx), (again, ctx2)):
        m.add_update(_update("a#1", 1, 4.0), 0, c)
        m.make_version(2, 1.0, c)
    np.testing.assert_array_equal(again.current_weights["w"], model.current_weights["w"])


class NotAStrategy:
    pass


@pytest.mark.parametrize(
    "path, named",
    [(f"{__name__}:NotAStrategy", "not an aggregation.strategy.ServerStrategy"), ("no_such.module:X", "no_such")],
)
def test_what_is_not_a_strategy_is_refused_naming_it(path, named):
    with pytest.raises(ValueError, match=named):
        GlobalModel(path)


def test_the_global_model_takes_its_version_numbers_from_the_schedule_and_refuses_one_out_of_step(tmp_path):
    model, ctx = _model(results_dir=str(tmp_path))
    model.start({"w": np.zeros(2)}, 1, ctx)
    model.add_update(_update("a#0", 1, 2.0), 0, ctx)
    with pytest.raises(ValueError, match="the schedule made version 3, but the global model holds 1"):
        model.make_version(3, 1.0, ctx)
    assert model.current_version == 1
    model.make_version(2, 1.0, ctx)
    assert model.current_version == 2 and sorted(model.state_dict()["versions"]) == [1, 2]


class SlowMean(StalenessWeightedMean):
    """The same mean, each call taking a known wall time, to check what the global model counts."""

    def add_update(self, update: Update, model: ModelHistory) -> None:
        time.sleep(0.02)
        super().add_update(update, model)

    def make_version(self, model: ModelHistory, sim_time: float) -> Weights:
        time.sleep(0.05)
        return super().make_version(model, sim_time)


def test_each_announced_version_carries_the_strategys_wall_seconds_so_far_and_when_it_was_made(tmp_path):
    model = GlobalModel(f"{__name__}:SlowMean", {"lr": 0.5}, results_dir=str(tmp_path))
    engine = EventEngine({"model": model})
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    model.start({"w": np.zeros(2)}, 1, ctx)
    first = ctx.get_prop(SERVER_WORK)
    assert first["updates"] == first["versions"] == 0 and first["update_seconds"] == first["version_seconds"] == 0
    before = time.time()
    model.add_update(_update("a#0", 1, 2.0), 0, ctx)
    model.add_update(_update("a#1", 1, 4.0), 0, ctx)
    model.make_version(2, 1.0, ctx)
    work = ctx.get_prop(SERVER_WORK)
    assert work["updates"] == 2 and work["versions"] == 1
    assert work["update_seconds"] >= 0.04 and work["version_seconds"] >= 0.05  # at least the sleeps
    assert before <= work["made_epoch"] <= time.time()
    np.testing.assert_array_equal(model.current_weights["w"], np.full(2, 1.5, np.float32))  # timing changes nothing
