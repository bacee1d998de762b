"""The leaf and relay side of exact time: a device gets the version it was selected for, each device's update goes
up on its own, a leaf keeps exactly the versions its selected devices train and hands each task out once, and
devices register once."""

from __future__ import annotations

import numpy as np
import pytest
from nvflare.apis.dxo import DXO, DataKind, from_dict
from nvflare.apis.fl_constant import ReservedKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.edge.constants import CookieKey, EdgeApiStatus, MsgKey
from nvflare.edge.mud import BaseState, PropKey, StateUpdateReply, StateUpdateReport
from nvflare.edge.web.models.device_info import DeviceInfo
from nvflare.edge.web.models.result_report import ResultReport
from nvflare.edge.web.models.task_request import TaskRequest
from nvflare.edge.web.models.user_info import UserInfo

from common.packed_maps import unpacked_map
from common.packed_weights import pack, unpack
from common.protocol import (
    DEVICE_RANGES,
    DEVICE_UPDATES,
    HELD_VERSIONS,
    MODELS,
    SELECTION_RELEASES,
    SELECTION_SUMS,
    SELECTION_VERSIONS,
    DeviceUpdate,
)
from simulation import versioned_updater
from simulation.leaf_executor import EdgeSimExecutor
from simulation.versioned_updater import DEFER_SYNC, VersionedUpdater


def model(version: int) -> DXO:
    return DXO(DataKind.WEIGHTS, {"w": np.full(2, float(version), np.float32)})


def reply(
    version: int,
    selection: dict[str, int],
    sid_versions: dict[int, int],
    extra: tuple[int, ...] = (),
    selection_version: int = 1,
) -> Shareable:
    r = StateUpdateReply(version, model(version), selection_version, selection).to_shareable()
    r[PropKey.DEVICE_SELECTION] = selection
    r[SELECTION_VERSIONS] = sid_versions
    if extra:
        r[MODELS] = {v: pack(model(v).data) for v in extra}
    return r


def started_updater() -> VersionedUpdater:
    updater = VersionedUpdater()
    updater.start_task(BaseState(0, None, 0, {}).to_shareable(), FLContext())
    return updater


def ctx(name: str = "site-1") -> FLContext:
    c = FLContext()
    c.set_prop(ReservedKey.IDENTITY_NAME, name, private=True, sticky=False)
    c.set_prop(ReservedKey.RUN_NUM, "job-1", private=True, sticky=False)
    return c


def test_a_leaf_keeps_the_versions_its_selected_devices_train_until_the_parent_has_their_updates():
    updater = started_updater()
    updater.process_parent_update_reply(
        reply(5, {"site-1#0": 11, "site-1#1": 12, "site-1#2": 13}, {11: 3, 12: 4, 13: 5}, extra=(3, 4)), FLContext()
    )
    state = updater.current_state
    assert (state.model_version, sorted(state.models)) == (5, [3, 4, 5])
    assert state.selection_versions == {11: 3, 12: 4, 13: 5}
    assert updater.prepare_update_for_parent(FLContext())[HELD_VERSIONS] == [3, 4, 5]  # the parent sends no other
    updater.mark_fetched("site-1#0", 11)  # handed out, still training: version 3 stays (it is never sent twice)
    updater.process_parent_update_reply(
        reply(6, {"site-1#0": 11, "site-1#1": 12, "site-1#2": 13}, {11: 3, 12: 4, 13: 5}, selection_version=2),
        FLContext(),
    )
    assert sorted(updater.current_state.models) == [3, 4, 5]  # version 6 trains no device here: not kept
    updater.process_parent_update_reply(  # the parent has site-1#0's update: it left the selection
        reply(6, {"site-1#1": 12, "site-1#2": 13}, {12: 4, 13: 5}, selection_version=3), FLContext()
    )
    assert sorted(updater.current_state.models) == [4, 5] and updater.current_state.model_version == 6


def test_a_leaf_hands_out_each_selected_devices_task_once_and_says_when_its_state_changed():
    updater = started_updater()
    stamp = updater.stamp
    changed = updater.process_parent_update_reply(
        reply(5, {"site-1#1": 12, "site-2#0": 12, "site-1#0": 11}, {11: 3, 12: 5}, extra=(3,)), FLContext()
    )
    assert changed and updater.wait_changed(stamp, timeout=0.0)[0] == stamp + 1
    tasks, models = updater.take_tasks("site-1#")
    assert tasks == [("site-1#0", 11, 3, None), ("site-1#1", 12, 5, None)] and sorted(models) == [3, 5]
    assert updater.take_tasks("site-1#") == ([], {})  # each task once


def test_a_leaf_hands_out_the_release_of_each_task_and_a_relay_passes_the_releases_on():
    updater = started_updater()
    r = reply(5, {"site-1#0": 11, "site-1#1": 12, "site-1#2": 13}, {11: 3, 12: 4, 13: 5}, extra=(3, 4))
    r[SELECTION_RELEASES] = {11: 1, 12: 1, 13: 2}
    updater.process_parent_update_reply(r, FLContext())
    tasks, _ = updater.take_tasks("site-1#")
    # site-1#1 and site-1#0, of two versions, came in release 1: the leaf trains them together
    assert tasks == [("site-1#0", 11, 3, 1), ("site-1#1", 12, 4, 1), ("site-1#2", 13, 5, 2)]
    report = StateUpdateReport(0, 0, None, None).to_shareable()
    _, to_child = updater.process_child_update(report, ctx("site-1"))
    assert unpacked_map(to_child[SELECTION_RELEASES]) == {11: 1, 12: 1, 13: 2}


def test_a_release_goes_out_whole_once_every_model_of_it_is_here():
    # a reply whose version 4 could not be read yet (a shared-memory link not written yet: the parent sends it
    # again) must not split release 1: its devices trained in two groups would give other bits than in one
    updater = started_updater()
    r = reply(5, {"site-1#0": 11, "site-1#1": 12, "site-1#2": 13}, {11: 3, 12: 4, 13: 5}, extra=(3,))
    r[SELECTION_RELEASES] = {11: 1, 12: 1, 13: 2}
    updater.process_parent_update_reply(r, FLContext())
    tasks, _ = updater.take_tasks("site-1#")
    assert tasks == [("site-1#2", 13, 5, 2)]  # release 2 is whole; release 1 waits for version 4
    r = reply(5, {"site-1#0": 11, "site-1#1": 12, "site-1#2": 13}, {11: 3, 12: 4, 13: 5}, extra=(4,))
    r[SELECTION_RELEASES] = {11: 1, 12: 1, 13: 2}
    updater.process_parent_update_reply(r, FLContext())
    tasks, _ = updater.take_tasks("site-1#")
    assert tasks == [("site-1#0", 11, 3, 1), ("site-1#1", 12, 4, 1)]  # together, as one release


def test_each_device_update_and_device_range_goes_up_once_unsummed():
    updater = started_updater()
    local = StateUpdateReport(0, 0, None, None).to_shareable()
    local.set_header("edgesim_local_report", True)
    local[DEVICE_RANGES] = {"site-1": [100, "site-1"]}
    local[DEVICE_UPDATES] = [
        {"device": "site-1#0", "selection_id": 3, "base_version": 2, "diff": {}, "count": 1},
        {"device": "site-1#1", "selection_id": 3, "base_version": 2, "diff": {}, "count": 1},
    ]
    assert updater.process_child_update(local, FLContext()) == (True, None)
    first = updater.prepare_update_for_parent(FLContext())
    assert [u["device"] for u in first[DEVICE_UPDATES]] == ["site-1#0", "site-1#1"]
    assert first[DEVICE_RANGES] == {"site-1": [100, "site-1"]}
    updater.process_parent_update_reply(reply(2, {}, {}), FLContext())
    second = updater.prepare_update_for_parent(FLContext())
    assert DEVICE_UPDATES not in second and DEVICE_RANGES not in second  # sent once, confirmed by the reply


def test_a_sync_carries_at_most_max_sync_bytes_of_diffs_in_arrival_order(monkeypatch):
    monkeypatch.setattr(versioned_updater, "MAX_SYNC_BYTES", 20)  # two 8-byte diffs per sync
    woken = []
    updater = started_updater()
    updater.on_work = lambda: woken.append(1)
    local = StateUpdateReport(0, 0, None, None).to_shareable()
    local.set_header("edgesim_local_report", True)
    local.set_header(DEFER_SYNC, True)
    local[DEVICE_UPDATES] = [DeviceUpdate(f"site-1#{i}", 3, 1, {"w": np.full(2, i, np.float32)}) for i in range(5)]
    updater.process_child_update(local, FLContext())
    sent = []
    while not sent or woken:  # each sync that leaves updates behind asks for the next one at once
        woken.clear()
        sent.append([u["device"] for u in updater.prepare_update_for_parent(FLContext())[DEVICE_UPDATES]])
    assert sent == [["site-1#0", "site-1#1"], ["site-1#2", "site-1#3"], ["site-1#4"]]


def test_a_relay_replies_to_a_child_with_the_versions_it_lacks():
    relay = started_updater()
    relay.process_parent_update_reply(
        reply(7, {"site-3#0": 21, "site-3#1": 22}, {21: 4, 22: 6}, extra=(4, 6)), FLContext()
    )
    child_report = StateUpdateReport(5, 0, None, None).to_shareable()
    child_report[HELD_VERSIONS] = [4, 5]
    ok, answer = relay.process_child_update(child_report, FLContext())
    assert ok and answer.get_header(PropKey.MODEL_VERSION) == 7
    assert sorted(answer[MODELS]) == [6]  # not 4 (the child has it), not 7 (no device trains it)
    assert unpacked_map(answer[PropKey.DEVICE_SELECTION]) == {"site-3#0": 21, "site-3#1": 22}
    assert unpacked_map(answer[SELECTION_VERSIONS]) == {21: 4, 22: 6}


def executor_with_state(versions: dict[int, int], selection: dict[str, int]) -> tuple[EdgeSimExecutor, object]:
    """An executor whose updater holds ``versions`` (selection id -> version) and a task for ``selection``."""
    executor = EdgeSimExecutor()
    updater = executor.get_updater(FLContext())
    updater.start_task(BaseState(0, None, 0, {}).to_shareable(), FLContext())
    held = sorted(set(versions.values()))
    updater.process_parent_update_reply(reply(max(held), selection, versions, extra=tuple(held[:-1])), FLContext())
    executor.accept_update = lambda task_id, update, fl_ctx: updater.process_child_update(update, fl_ctx)[0]
    task = type("Task", (), {"task": updater.current_state, "id": "task-1", "name": "train"})()
    return executor, task


def request(device_id: str, cookie=None) -> TaskRequest:
    return TaskRequest(DeviceInfo(device_id, "app", "1"), UserInfo(device_id), "job-1", cookie)


def test_a_device_gets_the_model_version_of_its_selection_not_the_newest():
    executor, task = executor_with_state({31: 2, 32: 5}, {"site-1#0": 31, "site-1#1": 32})
    response = executor.process_edge_task_request(request("site-1#0"), task, ctx())
    assert response.status == EdgeApiStatus.OK
    assert response.cookie == {CookieKey.MODEL_VERSION: 2, CookieKey.DEVICE_SELECTION_ID: 31}
    sent = from_dict(response.task_data)
    assert sent.get_meta_prop(MsgKey.MODEL_VERSION) == 2 and sent.data["w"][0] == 2.0
    again = executor.process_edge_task_request(request("site-1#0", response.cookie), task, ctx())
    assert again.status == EdgeApiStatus.RETRY  # the same selection is not trained twice
    assert executor.process_edge_task_request(request("site-1#9"), task, ctx()).status == EdgeApiStatus.RETRY


def test_a_result_goes_up_as_that_devices_own_update_with_its_selection_and_base_version():
    executor, task = executor_with_state({31: 2}, {"site-1#0": 31})
    diff = DXO(DataKind.WEIGHT_DIFF, {"dict": {"w": np.ones(2, np.float32)}, "count": 1}).to_dict()
    cookie = {CookieKey.MODEL_VERSION: 2, CookieKey.DEVICE_SELECTION_ID: 31}
    report = ResultReport(
        DeviceInfo("site-1#0", "app", "1"),
        UserInfo("site-1#0"),
        "job-1",
        "task-1",
        "train",
        status=EdgeApiStatus.OK,
        result=diff,
        cookie=cookie,
    )
    executor.process_edge_result_report(report, task, ctx())
    (update,) = executor.updater.prepare_update_for_parent(FLContext())[DEVICE_UPDATES]
    assert (update["device"], update["selection_id"], update["base_version"], update["count"]) == ("site-1#0", 31, 2, 1)
    np.testing.assert_array_equal(unpack(update["diff"])["w"], np.ones(2))


def test_a_simulated_leaf_registers_its_range_once_and_its_devices_are_known_by_it():
    executor, _ = executor_with_state({31: 2}, {"site-1#0": 31})
    executor.accept_alive_device("site-1?1000", ctx())
    executor.accept_alive_device("site-1?1000", ctx())
    executor.accept_alive_device("site-1#999", ctx())  # inside the range: nothing new
    report = executor.updater.prepare_update_for_parent(FLContext())
    assert report[DEVICE_RANGES] == {"site-1": [1000, "site-1"]}
    assert not StateUpdateReport.from_shareable(report).available_devices


@pytest.mark.parametrize("missing", [CookieKey.MODEL_VERSION, CookieKey.DEVICE_SELECTION_ID])
def test_a_result_without_its_cookie_is_refused(missing):
    executor, task = executor_with_state({31: 2}, {"site-1#0": 31})
    cookie = {CookieKey.MODEL_VERSION: 2, CookieKey.DEVICE_SELECTION_ID: 31}
    del cookie[missing]
    report = ResultReport(
        DeviceInfo("site-1#0", "app", "1"),
        UserInfo("site-1#0"),
        "job-1",
        "task-1",
        "train",
        status=EdgeApiStatus.OK,
        result=DXO(DataKind.WEIGHT_DIFF, {"dict": {"w": np.ones(1)}}).to_dict(),
        cookie=cookie,
    )
    assert executor.process_edge_result_report(report, task, ctx()).status == EdgeApiStatus.ERROR


def test_a_synchronous_leaf_sends_one_sum_per_selection_once_all_its_devices_reported():
    updater = VersionedUpdater(sum_selections=True)
    updater.start_task(BaseState(0, None, 0, {}).to_shareable(), FLContext())
    updater.process_parent_update_reply(
        reply(3, {"site-1#2": 7, "site-1#0": 7, "site-1#5": 8}, {7: 3, 8: 3}), FLContext()
    )

    def report(device: str, sid: int, value: float) -> None:
        local = StateUpdateReport(0, 0, None, None).to_shareable()
        local.set_header("edgesim_local_report", True)
        local[DEVICE_UPDATES] = [
            {
                "device": device,
                "selection_id": sid,
                "base_version": 3,
                "diff": {"w": np.full(2, value, np.float32)},
                "count": 1,
            }
        ]
        updater.process_child_update(local, FLContext())

    report("site-1#2", 7, 2.0)
    assert SELECTION_SUMS not in updater.prepare_update_for_parent(FLContext())  # site-1#0 of selection 7 missing
    report("site-1#0", 7, 0.5)
    (total,) = updater.prepare_update_for_parent(FLContext())[SELECTION_SUMS]
    assert total["devices"] == {"site-1#0": 1, "site-1#2": 1} and total["count"] == 2
    np.testing.assert_array_equal(unpack(total["diff"])["w"], [2.5, 2.5])
    assert DEVICE_UPDATES not in updater.prepare_update_for_parent(FLContext())  # nothing sent per device


def test_a_leaf_sends_its_outbox_once_and_a_relay_forwards_its_childrens_leaf_information():
    from common.leaf_outbox import OUTBOX_PROP, LeafOutbox
    from common.protocol import LEAF_PLANS, LEAF_REPORTS

    leaf = started_updater()
    outbox = LeafOutbox("C11")
    outbox.set_plan({"num_workers": 3})
    outbox.add_report({"device": "C11#0", "version": 1})
    leaf_ctx = FLContext()
    leaf_ctx.set_prop(OUTBOX_PROP, outbox, private=True, sticky=False)
    first = leaf.prepare_update_for_parent(leaf_ctx)
    assert first[LEAF_PLANS] == {"C11": {"num_workers": 3}}
    assert first[LEAF_REPORTS] == {"C11": [{"device": "C11#0", "version": 1}]}
    outbox.add_report({"device": "C11#1", "version": 1})
    second = leaf.prepare_update_for_parent(leaf_ctx)
    assert LEAF_PLANS not in second and second[LEAF_REPORTS] == {"C11": [{"device": "C11#1", "version": 1}]}

    relay = started_updater()
    relay.process_child_update(first, ctx("C11"))
    relay.process_child_update(second, ctx("C11"))
    up = relay.prepare_update_for_parent(FLContext())
    assert up[LEAF_PLANS] == {"C11": {"num_workers": 3}}
    assert [r["device"] for r in up[LEAF_REPORTS]["C11"]] == ["C11#0", "C11#1"]  # in the leaf's order
    assert LEAF_REPORTS not in relay.prepare_update_for_parent(FLContext())
