"""The leaf keyed by run (``docs/packs.md``, step 1): a standalone job is run 0 and its messages keep their form key
for key; a pack's later runs travel in sections of their own, and the leaf keeps each run's versions, selection,
tasks, sums and groups apart, training each run's devices with that run's trainer."""

from __future__ import annotations

import numpy as np
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.edge.mud import PropKey, StateUpdateReport

from common.delays import DelayConfig, DeviceDelays
from common.packed_maps import unpacked_map
from common.packed_weights import pack, unpack
from common.protocol import (
    DEVICE_UPDATES,
    HELD_VERSIONS,
    LOCAL_REPORT,
    MODELS,
    RUN_SECTIONS,
    SELECTION_RELEASES,
    SELECTION_SUMS,
    SELECTION_VERSIONS,
    DeviceUpdate,
    SelectionSum,
    run_section,
    sections_of,
)
from simulation.fast_simulator import FastSimulator, make_groups
from simulation.leaf_channels import DeviceTask, GatewayChannel
from simulation.leaf_gateway import GatewayTask, LeafWork
from tests.simulation.test_fast_simulator import ScriptedGateway, WeightsTrainerFake
from tests.simulation.test_leaf_protocol import ctx, reply, started_updater

STANDALONE_UPDATE_KEYS = {"device", "selection_id", "base_version", "diff", "count"}


def with_run(r: Shareable, run: int, selection: dict, versions: dict, models: tuple = (), releases=None) -> Shareable:
    """``r`` with ``run``'s section: its selection (version 1), each selection id's version, the models it lacks."""
    section = run_section(r, run)
    section[PropKey.DEVICE_SELECTION_VERSION] = 1
    section[PropKey.DEVICE_SELECTION] = selection
    section[SELECTION_VERSIONS] = versions
    if releases:
        section[SELECTION_RELEASES] = releases
    if models:
        section[MODELS] = {v: pack({"w": np.full(2, 1000.0 + v, np.float32)}) for v in models}
    return r


def local(updates: list[DeviceUpdate]) -> Shareable:
    report = StateUpdateReport(0, 0, None, None).to_shareable()
    report.set_header(LOCAL_REPORT, True)
    report[DEVICE_UPDATES] = updates
    return report


def test_a_standalone_jobs_updates_and_sums_travel_as_they_always_did():
    u = DeviceUpdate("site-1#0", 3, 2, {"w": np.ones(2, np.float32)})
    assert set(u.to_dict()) == STANDALONE_UPDATE_KEYS and DeviceUpdate.from_dict(u.to_dict()).run == 0
    s = SelectionSum.of([u, DeviceUpdate("site-1#1", 3, 2, {"w": np.ones(2, np.float32)})])
    assert set(s.to_dict()) == {"selection_id", "base_version", "devices", "diff", "count"}
    assert sections_of({"a": 1}) == {0: {"a": 1}}
    message = {"a": 1}
    assert run_section(message, 0) is message and message == {"a": 1}  # run 0: the message itself, no section


def test_a_later_runs_updates_and_sums_name_their_run():
    u = DeviceUpdate("site-1#0", 3, 2, {"w": np.ones(2, np.float32)}, run=2)
    d = u.to_dict()
    assert d["run"] == 2 and DeviceUpdate.from_dict(d).run == 2
    s = SelectionSum.of([u, DeviceUpdate("site-1#1", 3, 2, {"w": np.ones(2, np.float32)}, run=2)])
    assert s.run == 2 and SelectionSum.from_dict(s.to_dict()).run == 2
    assert {x.run for x in SelectionSum.from_dict(s.to_dict()).device_updates()} == {2}
    message: dict = {}
    run_section(message, 2)["x"] = 1
    assert message == {RUN_SECTIONS: {2: {"x": 1}}} and sections_of(message) == {0: message, 2: {"x": 1}}


def test_a_standalone_leafs_report_and_its_reply_to_a_child_carry_no_run_section():
    updater = started_updater()
    updater.process_parent_update_reply(reply(5, {"site-1#0": 11}, {11: 5}), FLContext())
    updater.process_child_update(local([DeviceUpdate("site-1#0", 11, 5, {"w": np.ones(2, np.float32)})]), None)
    up = updater.prepare_update_for_parent(FLContext())
    assert RUN_SECTIONS not in up and set(up[DEVICE_UPDATES][0]) == STANDALONE_UPDATE_KEYS
    _, down = updater.process_child_update(StateUpdateReport(0, 0, None, None).to_shareable(), ctx("site-1"))
    assert RUN_SECTIONS not in down


def test_a_leaf_keeps_each_runs_versions_selection_and_tasks_apart():
    """The same device and selection id in two runs are two tasks, of two versions of two models."""
    updater = started_updater()
    r = with_run(reply(5, {"site-1#0": 11, "site-1#1": 11}, {11: 5}), 1, {"site-1#0": 11}, {11: 2}, (2,), {11: 1})
    assert updater.process_parent_update_reply(r, FLContext())
    tasks, models = updater.take_tasks("site-1#")
    assert tasks == [("site-1#0", 11, 5, None), ("site-1#1", 11, 5, None)] and models[5].data["w"][0] == 5.0
    later = updater.take_run_tasks("site-1#")
    assert list(later) == [1] and later[1][0] == [("site-1#0", 11, 2, 1)]
    assert later[1][1][2].data["w"][0] == 1002.0  # run 1's version 2, not run 0's
    assert updater.take_tasks("site-1#") == ([], {}) and updater.take_run_tasks("site-1#") == {}  # each once
    up = updater.prepare_update_for_parent(FLContext())
    assert up[HELD_VERSIONS] == [5] and up[RUN_SECTIONS][1][HELD_VERSIONS] == [2]
    assert up[RUN_SECTIONS][1][PropKey.DEVICE_SELECTION_VERSION] == 1
    # run 1's device reported: the parent leaves it out of run 1's selection, and run 1's version goes; run 0's stays
    r = with_run(reply(5, {"site-1#0": 11, "site-1#1": 11}, {11: 5}), 1, {}, {})
    run_section(r, 1)[PropKey.DEVICE_SELECTION_VERSION] = 2
    updater.process_parent_update_reply(r, FLContext())
    assert sorted(updater.current_state.models) == [5] and updater.runs[1].models == {}


def test_a_synchronous_leaf_sums_each_runs_selection_apart():
    """The same selection id in two runs, of other devices: each run's sum waits for its own devices only."""
    updater = started_updater()
    updater.sum_selections = True
    mine = {"site-1#0": 11, "site-1#1": 11, "site-1#2": 11}
    later = {"site-1#0": 11, "site-1#1": 11}
    updater.process_parent_update_reply(with_run(reply(5, mine, {11: 5}), 1, later, {11: 2}), FLContext())
    w = {"w": np.ones(2, np.float32)}
    updater.process_child_update(
        local([DeviceUpdate(d, 11, 5, w) for d in mine] + [DeviceUpdate("site-1#0", 11, 2, w, run=1)]), None
    )
    first = updater.prepare_update_for_parent(FLContext())[SELECTION_SUMS]
    assert [(s.get("run", 0), s["devices"]) for s in first] == [(0, dict.fromkeys(mine, 1))]
    updater.process_child_update(
        local([DeviceUpdate("site-1#1", 11, 2, {"w": np.full(2, 3, np.float32)}, run=1)]), None
    )
    second = updater.prepare_update_for_parent(FLContext())[SELECTION_SUMS]
    assert [(s["run"], s["devices"]) for s in second] == [(1, {"site-1#0": 1, "site-1#1": 1})]
    assert unpack(second[0]["diff"])["w"].tolist() == [4.0, 4.0]


def test_a_mixed_pack_leaf_sums_the_synchronous_runs_selection_and_forwards_the_buffered_runs_updates():
    """Run 0 synchronous (FedAvg), run 1 buffered (FedBuff): run 0's updates wait for their selection and go up as
    one sum; run 1's go up each on its own at once, as its standalone leaf's do, and ask for a sync."""
    synced = []
    updater = started_updater()
    updater.sum_selections, updater.on_work = [True, False], lambda: synced.append(1)
    mine = {"site-1#0": 11, "site-1#1": 11}
    later = {"site-1#0": 11, "site-1#1": 11}
    updater.process_parent_update_reply(with_run(reply(5, mine, {11: 5}), 1, later, {11: 2}), FLContext())
    w = {"w": np.ones(2, np.float32)}
    updater.process_child_update(
        local([DeviceUpdate("site-1#0", 11, 5, w), DeviceUpdate("site-1#1", 11, 2, w, run=1)]), None
    )
    assert synced and updater.sums(0) and not updater.sums(1)  # run 1's update is work to send now
    up = updater.prepare_update_for_parent(FLContext())
    assert SELECTION_SUMS not in up  # run 0's selection waits for site-1#1
    assert [(u["run"], u["device"]) for u in up[DEVICE_UPDATES]] == [(1, "site-1#1")]
    updater.process_child_update(local([DeviceUpdate("site-1#1", 11, 5, {"w": np.full(2, 3, np.float32)})]), None)
    up = updater.prepare_update_for_parent(FLContext())
    assert DEVICE_UPDATES not in up
    (total,) = up[SELECTION_SUMS]
    assert total.get("run", 0) == 0 and total["devices"] == dict.fromkeys(mine, 1)
    assert unpack(total["diff"])["w"].tolist() == [4.0, 4.0]


def test_a_relay_answers_each_child_with_its_part_of_each_run():
    relay = started_updater()
    r = with_run(reply(5, {"site-1#0": 11}, {11: 5}), 1, {"site-1#0": 12}, {12: 2}, (2,), {12: 3})
    relay.process_parent_update_reply(r, FLContext())
    child = StateUpdateReport(0, 0, None, None).to_shareable()
    run_section(child, 1)[HELD_VERSIONS] = []
    _, down = relay.process_child_update(child, ctx("site-1"))
    part = down[RUN_SECTIONS][1]
    assert unpacked_map(part[PropKey.DEVICE_SELECTION]) == {"site-1#0": 12}
    assert unpacked_map(part[SELECTION_VERSIONS]) == {12: 2} and unpacked_map(part[SELECTION_RELEASES]) == {12: 3}
    assert unpack(part[MODELS][2])["w"][0] == 1002.0
    run_section(child, 1)[HELD_VERSIONS] = [2]  # a child that holds it is not sent it again
    run_section(child, 1)[PropKey.DEVICE_SELECTION_VERSION] = 1
    _, down = relay.process_child_update(child, ctx("site-1"))
    assert MODELS not in down[RUN_SECTIONS][1] and PropKey.DEVICE_SELECTION not in down[RUN_SECTIONS][1]


def test_groups_hold_one_runs_devices_and_run_0s_groups_are_unchanged():
    def tasks(run: int) -> list[DeviceTask]:
        return [DeviceTask(f"site-1#{i}", 10 + i % 3, 1, None, release=1, run=run) for i in range(9)]

    alone = make_groups(tasks(0), group_size=4, workers=2)
    packed = make_groups(tasks(1)[::-1] + tasks(0), group_size=4, workers=2)
    assert all(len({t.run for t in g}) == 1 for g in packed)
    key = [[(t.device, t.selection_id) for t in g] for g in alone]
    assert [[(t.device, t.selection_id) for t in g] for g in packed if g[0].run == 0] == key
    assert [[(t.device, t.selection_id) for t in g] for g in packed if g[0].run == 1] == key


def test_the_gateway_channel_trains_each_runs_devices_from_its_versions_with_its_trainer():
    gateway = ScriptedGateway([], {})
    weights = {3: {"w": np.zeros(2, np.float32)}}
    later = {3: {"w": np.full(2, 100, np.float32)}}
    gateway.take_work = lambda prefix, stamp, timeout: LeafWork(
        stamp + 1,
        [GatewayTask("site-1#1", 7, 3, 1), GatewayTask("site-1#1", 7, 3, 1, run=1)],
        weights,
        {1: later},
    )
    first, second = WeightsTrainerFake(), WeightsTrainerFake()
    channel = GatewayChannel(gateway, first, "site-1", 2, run_trainers={1: second})
    sim = FastSimulator(channel, 1, 5.0, DeviceDelays(DelayConfig(), 0), group_size=4)
    sim.submit(channel.next_tasks(0.1))
    assert sim.drain()
    assert first.calls == [["site-1#1"]] and second.calls == [["site-1#1"]]
    results = {r.run: r for group in gateway.reports for r in group}
    assert results[0].diff["w"][0] == 1.0 and results[1].diff["w"][0] == 101.0


def test_each_runs_processor_trains_from_its_own_runs_weights_of_a_version_number():
    """Two runs' processors in one leaf process (a pack): run 1's version 2 is not run 0's version 2, though the
    process converts each version's weights once (``processors.compute_context.global_params_on``). Run 1's devices
    trained after run 0's (one version number, two models) equal run 1's devices trained in a process of their own,
    with either engine (one device: the per-device engine; two: the vectorised one)."""
    import torch

    from processors import compute_context
    from processors.models import initial_model
    from tests.conftest import make_processor

    small = {"subset_size": 40, "local_iters": 2, "local_batch_size": 16}
    run0, run1 = make_processor(600, seed=3, **small), make_processor(600, seed=4, **small)

    def weights_of(seed: int) -> dict[str, np.ndarray]:
        return {k: v.numpy().copy() for k, v in initial_model(run0.resolved_training.model, seed).state_dict().items()}

    mine, theirs = weights_of(4), weights_of(3)
    for devices in (["site-1#0"], ["site-1#0", "site-1#1"]):
        compute_context._global_params.clear()  # run 1 alone: a process of its own
        alone = run1.train_devices(devices, [mine] * len(devices), [2] * len(devices))
        compute_context._global_params.clear()
        run0.train_devices(devices, [theirs] * len(devices), [2] * len(devices))  # run 0 converts version 2 first
        packed = run1.train_devices(devices, [mine] * len(devices), [2] * len(devices))
        for a, p in zip(alone, packed, strict=True):
            assert a.keys() == p.keys() and any(np.any(v != 0) for v in a.values())  # it trained
            assert all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(p[k])) for k in a), devices
