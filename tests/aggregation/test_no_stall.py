"""Late device updates are never lost: the leaf updater, the server model manager and the device manager."""

import numpy as np
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.fl_context import FLContext
from nvflare.edge.aggregators.model_update_dxo import ModelUpdateDXOAggregator
from nvflare.edge.mud import BaseState, ModelUpdate, StateUpdateReply
from nvflare.edge.updaters.emd import AggregatorFactory, ModelAggrState

from aggregation.device_manager import FreshSelectionDeviceManager
from aggregation.numpy_model_manager import NumpyBuffModelManager
from aggregation.retaining_updater import RetainingEdgeModelUpdater


def diff(value: float, count: int = 1):
    return DXO(DataKind.WEIGHT_DIFF, {"dict": {"w": np.full(2, value, np.float32)}, "count": count}).to_shareable()


class SumFactory(AggregatorFactory):
    def get_aggregator(self):
        return ModelUpdateDXOAggregator()


MODEL = DXO(DataKind.WEIGHTS, {"w": np.zeros(2, np.float32)})


def reply(model_version: int, selection: dict[str, int], selection_version: int = 2):
    return StateUpdateReply(model_version, MODEL, selection_version, selection).to_shareable()


def test_leaf_keeps_unsent_updates_of_a_version_the_server_no_longer_lists():
    ctx = FLContext()
    updater = RetainingEdgeModelUpdater(SumFactory(), max_model_versions=3)
    updater.current_state = BaseState(3, MODEL, 1, {"a": 2, "b": 3})
    pending = ModelAggrState(ModelUpdateDXOAggregator(), 3)
    pending.accept(diff(1.0), {"b": 1.0}, ctx)
    updater.aggr_states = {2: ModelAggrState(ModelUpdateDXOAggregator(), 2), 3: pending}

    updater.process_parent_update_reply(reply(4, {"c": 4}), ctx)  # neither 2 nor 3 is selected any more

    assert set(updater.aggr_states) == {3}, "the empty aggregator goes, the one holding device b's result stays"
    assert updater.current_state.model_version == 4 and updater.current_state.device_selection == {"c": 4}


def test_leaf_still_drops_empty_aggregators_that_are_too_old():
    updater = RetainingEdgeModelUpdater(SumFactory(), max_model_versions=2)
    updater.current_state = BaseState(5, MODEL, 1, {"a": 2})
    updater.aggr_states = {2: ModelAggrState(ModelUpdateDXOAggregator(), 2)}
    updater.process_parent_update_reply(reply(6, {"a": 2}), FLContext())
    assert updater.aggr_states == {}


def make_manager(num_updates: int) -> NumpyBuffModelManager:
    manager = NumpyBuffModelManager(num_updates_for_model=num_updates)
    manager.initialize_model(DXO(DataKind.WEIGHTS, {"w": np.zeros(2, np.float32)}), FLContext())
    manager.generate_new_model(FLContext())  # version 1
    return manager


def test_server_pruning_keeps_buffered_updates_until_they_are_in_a_model():
    ctx = FLContext()
    manager = make_manager(num_updates=2)
    manager.process_updates({1: ModelUpdate(1, diff(2.0), {"a": 1.0})}, ctx)
    manager.process_updates({1: ModelUpdate(1, diff(4.0), {"b": 1.0})}, ctx)  # -> version 2 from both
    manager.process_updates({1: ModelUpdate(1, diff(6.0), {"c": 1.0})}, ctx)  # late, buffered in version 1
    manager.prune_model_versions({2}, ctx)  # no selected device holds version 1 any more
    manager.process_updates({2: ModelUpdate(2, diff(8.0), {"d": 1.0})}, ctx)  # -> version 3
    assert manager.current_model_version == 3
    # version 2 = 0 + mean(2, 4) = 3; version 3 = 3 + mean(6, 8) = 10: device c's update was not lost
    np.testing.assert_allclose(manager.current_model.data["w"], [10.0, 10.0])


def test_server_buffers_an_update_for_an_already_pruned_version_into_the_next_model():
    ctx = FLContext()
    manager = make_manager(num_updates=1)
    manager.process_updates({1: ModelUpdate(1, diff(1.0), {"a": 1.0})}, ctx)  # -> version 2
    manager.prune_model_versions({2}, ctx)
    assert 1 not in manager.updates
    manager.process_updates({1: ModelUpdate(1, diff(3.0), {"b": 1.0})}, ctx)  # -> version 3
    assert manager.current_model_version == 3
    np.testing.assert_allclose(manager.current_model.data["w"], [4.0, 4.0])


class FakeDevice:
    def __init__(self, client: str):
        self.client = client

    def to_dict(self):
        return {"client_name": self.client}


def test_a_device_is_not_reselected_for_the_model_version_it_just_trained():
    ctx = FLContext()
    manager = FreshSelectionDeviceManager(device_selection_size=2, min_hole_to_fill=1)
    manager.update_available_devices({d: FakeDevice("site-1") for d in ("a", "b", "c")}, ctx)
    manager.fill_selection(5, ctx)
    first = set(manager.current_selection)
    done = first.pop()
    manager.remove_devices_from_selection({done}, ctx)
    manager.remove_devices_from_used({done}, ctx)  # device reuse
    for _ in range(20):  # sampling is random: any reselection of `done` at version 5 would show up
        manager.fill_selection(5, ctx)
        assert done not in manager.current_selection
        manager.remove_devices_from_selection(set(manager.current_selection) - first, ctx)
    manager.fill_selection(6, ctx)  # the model moved on: the device is selectable again
    assert done in manager.current_selection or len(manager.current_selection) == 2


def test_device_selection_depends_on_the_seed_and_is_balanced_over_leaves():
    def selections(seed: int, order: list[str]) -> list[list[str]]:
        ctx = FLContext()
        manager = FreshSelectionDeviceManager(device_selection_size=6, min_hole_to_fill=6, seed=seed)
        manager.update_available_devices({d: FakeDevice(d.split("#")[0]) for d in order}, ctx)
        picked = []
        for version in (1, 2, 3):
            manager.fill_selection(version, ctx)
            picked.append(sorted(manager.current_selection))
            manager.remove_devices_from_selection(set(manager.current_selection), ctx)
            manager.remove_devices_from_used(set(manager.used_devices), ctx)
        return picked

    devices = [f"site-{leaf}#{i}" for leaf in (1, 2) for i in range(10)]
    first = selections(0, devices)
    assert selections(0, list(reversed(devices))) == first  # not the order the devices were reported in
    assert selections(1, devices) != first
    for chosen in first:
        assert sum(d.startswith("site-1#") for d in chosen) == 3  # 6 devices over 2 leaves: 3 each
