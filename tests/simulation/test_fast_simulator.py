"""The device simulator's dispatch, grouping, failure handling and real-time holding, over both of its channels:
NVFlare's device protocol objects (edge requests) and the leaf's gateway.

A scripted leaf answers task requests and records result reports, and a scripted gateway hands out tasks and
records reported groups, so these tests run the simulator's real dispatch and task code without starting
NVFlare."""

import threading
import time

import numpy as np
import pytest
from nvflare.edge.constants import CookieKey, EdgeApiStatus
from nvflare.edge.simulation.simulated_device import DeviceFactory, SimulatedDevice
from nvflare.edge.web.models.job_response import JobResponse
from nvflare.edge.web.models.result_report import ResultReport
from nvflare.edge.web.models.result_response import ResultResponse
from nvflare.edge.web.models.task_request import TaskRequest
from nvflare.edge.web.models.task_response import TaskResponse

from common.delays import DelayConfig, DeviceDelays
from simulation.fast_simulator import MAX_ATTEMPTS, FastSimulator
from simulation.leaf_channels import EdgeRequestChannel, GatewayChannel
from simulation.leaf_gateway import DeviceResult, GatewayTask, LeafWork


class ScriptedDevice(SimulatedDevice):
    def __init__(self, device_id: str, script):
        super().__init__(device_id)
        self.script, self.calls = script, 0

    def do_task(self, task: TaskResponse) -> dict:
        self.calls += 1
        return self.script(self)


class ScriptedFactory(DeviceFactory):
    """Devices that run ``scripts[device_id]`` (default ``default``) when the simulator has no trainer."""

    def __init__(self, scripts: dict | None = None, default=lambda d: {"ok": 1}):
        self.scripts, self.default, self.devices = scripts or {}, default, {}

    def make_device(self, device_id: str) -> SimulatedDevice:
        device = self.devices.get(device_id) or ScriptedDevice(device_id, self.scripts.get(device_id, self.default))
        self.devices[device_id] = device
        return device


class ScriptedLeaf:
    """Answers every task request with a task for selection ``selection_of(device)`` and records the reports."""

    def __init__(self, selection_of=lambda device_id: 1):
        self.reports: list[ResultReport] = []
        self.selection_of = selection_of
        self.lock = threading.Lock()

    def __call__(self, req, device, **_):
        if isinstance(req, TaskRequest):
            sid = self.selection_of(req.get_device_id())
            cookie = {CookieKey.MODEL_VERSION: sid, CookieKey.DEVICE_SELECTION_ID: sid}
            return TaskResponse(EdgeApiStatus.OK, "job", 0, "task-1", "train", {}, cookie)
        with self.lock:
            self.reports.append(req)
        return ResultResponse(EdgeApiStatus.OK, task_id=req.task_id, task_name=req.task_name)


JOB = JobResponse(EdgeApiStatus.OK, job_id="job", job_name="job", method="edge", job_data={})


def make_simulator(leaf, num_workers: int, factory=None, delays=None, trainer=None, **kwargs) -> FastSimulator:
    delays = DeviceDelays(delays or DelayConfig(), seed=0)
    channel = EdgeRequestChannel("job", factory or ScriptedFactory(), "site-1", 100, trainer)
    channel.job = JOB
    sim = FastSimulator(channel, num_workers, 5.0, delays, **kwargs)
    sim.set_send_func(leaf)
    return sim


def dispatch(sim: FastSimulator, selection: dict[str, int]) -> None:
    """Request the new devices' tasks and hand them to the pool, as one turn of the control loop does."""
    channel = sim.channel
    tasks = [channel._dispatch(did, sid) for did, sid in sorted(channel._new_devices(selection).items())]
    sim.submit([t for t in tasks if not isinstance(t, str)])


def run_devices(scripts: dict, device_ids: list[str], num_workers: int = 4):
    factory, leaf = ScriptedFactory(scripts), ScriptedLeaf()
    sim = make_simulator(leaf, num_workers, factory)
    dispatch(sim, dict.fromkeys(device_ids, 1))
    assert sim.drain()
    assert len(leaf.reports) == len(device_ids), "every dispatched device reports exactly once"
    return sim, factory, {r.get_device_id(): r for r in leaf.reports}


def test_a_raising_task_is_retried_then_reported_failed_and_the_others_go_on(caplog):
    def broken(_device):
        raise RuntimeError("corrupt sample")

    sim, factory, reports = run_devices({"site-1#1": broken}, ["site-1#0", "site-1#1", "site-1#2"])
    assert reports["site-1#1"].status == EdgeApiStatus.ERROR
    assert factory.devices["site-1#1"].calls == MAX_ATTEMPTS
    assert reports["site-1#0"].status == reports["site-1#2"].status == EdgeApiStatus.OK
    assert sim.failed_tasks == 1
    assert "site-1#1" in caplog.text and "corrupt sample" in caplog.text
    assert not sim.channel._busy, "a failed device is released, not left busy"


def test_out_of_memory_halves_concurrency_and_the_task_succeeds_on_retry():
    def oom_once(device):
        if device.calls == 1:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"ok": 1}

    sim, factory, reports = run_devices({"site-1#0": oom_once}, ["site-1#0", "site-1#1"], num_workers=8)
    assert reports["site-1#0"].status == EdgeApiStatus.OK
    assert factory.devices["site-1#0"].calls == 2
    assert sim.limit.limit == 4
    assert sim.failed_tasks == 0


@pytest.mark.parametrize("workers", [1, 3])
def test_every_dispatched_device_reports_once_whatever_the_pool_size(workers):
    ids = [f"site-1#{i}" for i in range(10)]
    _, _, reports = run_devices({}, ids, num_workers=workers)
    assert sorted(reports) == sorted(ids)


def test_only_this_leafs_new_devices_are_dispatched():
    leaf = ScriptedLeaf()
    sim = make_simulator(leaf, 2)
    dispatch(sim, {"site-1#0": 1, "site-2#0": 1, "site-10#0": 1})  # another leaf's, and a prefix look-alike
    assert sim.drain(timeout=5)
    assert [r.get_device_id() for r in leaf.reports] == ["site-1#0"]
    channel = make_simulator(leaf, 2).channel
    channel._reported = {"site-1#0": 1}
    assert channel._new_devices({"site-1#0": 1, "site-1#1": 1}) == {"site-1#1": 1}  # reported for selection 1
    assert channel._new_devices({"site-1#0": 2}) == {"site-1#0": 2}  # selected again: a new selection


class GroupingTrainer:
    """Trains a group in one call, as TrainingTaskProcessor.process_group does; can run out of memory."""

    def __init__(self, calls: list, oom_above: int | None = None):
        self.calls, self.oom_above = calls, oom_above

    def process_group(self, device_ids, task):
        if self.oom_above is not None and len(device_ids) > self.oom_above:
            raise RuntimeError("CUDA out of memory")
        self.calls.append(list(device_ids))
        return [{"trained": d} for d in device_ids]

    def failed_result(self, device_id, task, error=""):
        return {"dict": {"w": [0.0]}, "count": 0, "error": error}


def run_grouped(selection: dict[str, int], group_size: int, oom_above: int | None = None):
    calls: list = []
    leaf = ScriptedLeaf(selection_of=selection.get)
    sim = make_simulator(leaf, 2, trainer=GroupingTrainer(calls, oom_above), group_size=group_size)
    dispatch(sim, selection)
    assert sim.drain()
    return sim, calls, leaf.reports


def test_devices_of_one_selection_are_trained_in_sorted_groups_whatever_the_request_order():
    selection = {f"site-1#{i}": 1 for i in (7, 3, 9, 1, 5)} | {f"site-1#{i}": 2 for i in (4, 2)}
    sim, calls, reports = run_grouped(selection, group_size=2)
    assert sorted(calls) == sorted(
        [["site-1#1", "site-1#3"], ["site-1#5", "site-1#7"], ["site-1#9"], ["site-1#2", "site-1#4"]]
    )
    assert len(reports) == 7
    for r in reports:
        assert r.status == EdgeApiStatus.OK and r.result == {"trained": r.get_device_id()}


def test_a_group_that_runs_out_of_memory_halves_the_group_size_and_its_devices_still_report():
    sim, calls, reports = run_grouped({f"site-1#{i}": 1 for i in range(8)}, group_size=8, oom_above=4)
    assert sim.group_size == 4
    assert len(reports) == 8 and all(r.status == EdgeApiStatus.OK for r in reports)


class BrokenTrainer(GroupingTrainer):
    def process_group(self, device_ids, task):
        raise RuntimeError("corrupt sample")


def test_a_device_that_fails_for_good_reports_a_zero_weight_update_so_its_slot_is_freed(tmp_path):
    leaf, lines = ScriptedLeaf(), []
    sim = make_simulator(leaf, 1, trainer=BrokenTrainer([]), on_report=lines.append)
    dispatch(sim, {"site-1#0": 1})
    assert sim.drain()
    (report,) = leaf.reports
    assert report.status == EdgeApiStatus.OK and report.result["count"] == 0
    assert report.result["error"] == "RuntimeError: corrupt sample"  # why, for a server whose devices all fail
    assert sim.failed_tasks == 1
    assert [line["ok"] for line in lines] == [False]


def test_real_time_mode_holds_results_without_holding_the_worker(tmp_path):
    """One worker, a group trained together: a result waits out its delay on a timer, so a later short task is
    trained and reported while the group's slow device is still waiting."""
    speed = DelayConfig(speed_means=(100.0, 5.0), speed_stds=(0.0, 0.0))
    classes = DeviceDelays(speed, seed=0)
    ids = [f"site-1#{i}" for i in range(50)]
    slow = next(d for d in ids if classes.device_traits(d)[0] == 0)
    fast = [d for d in ids if classes.device_traits(d)[0] == 1][:2]
    leaf, events = ScriptedLeaf(), []
    sim = make_simulator(
        leaf, 1, delays=speed, trainer=GroupingTrainer([]), time_scale=0.01, on_report=events.append, group_size=2
    )
    started = time.time()
    dispatch(sim, {slow: 1, fast[0]: 1})  # one group: due after 1.0 s and 0.05 s of wall time
    time.sleep(0.2)
    dispatch(sim, {fast[1]: 2})  # the only worker must be free for it
    assert sim.drain()
    assert [e["device"] for e in events] == [fast[0], fast[1], slow]
    wall = {e["device"]: e["wall"] for e in events}
    assert wall[fast[0]] < started + 1.0 and wall[fast[1]] < started + 1.0, "fast devices waited for the slow one"
    assert wall[slow] >= started + 1.0 - 0.01


class ScriptedGateway:
    """A leaf executor's gateway: hands out scripted work once, records registrations and reported groups."""

    def __init__(self, work: list[GatewayTask], weights: dict, by_version: dict | None = None):
        self.work, self.weights, self.by_version = work, weights, by_version or {}
        self.registered: list[tuple[str, int]] = []
        self.reports: list[list[DeviceResult]] = []
        self.stamps: list[int] = []
        self.lock = threading.Lock()

    def register_devices(self, prefix, count, timeout) -> bool:
        self.registered.append((prefix, count))
        return True

    def take_work(self, prefix, stamp, timeout) -> LeafWork:
        self.stamps.append(stamp)
        tasks, self.work = [t for t in self.work if t.device.startswith(prefix + "#")], []
        return LeafWork(stamp + 1, tasks, {t.version: self.by_version.get(t.version, self.weights) for t in tasks})

    def report(self, results) -> None:
        with self.lock:
            self.reports.append(list(results))


class WeightsTrainerFake:
    """Trains from weights (``WeightsTrainer``): each diff is the weights plus the device's index."""

    def __init__(self, fail: set[str] = frozenset()):
        self.calls: list[list[str]] = []
        self.versions: list[list[int]] = []
        self.fail = fail

    def train_devices(self, device_ids, weights, versions):
        self.calls.append(list(device_ids))
        self.versions.append(list(versions))
        if self.fail & set(device_ids):
            raise RuntimeError("corrupt sample")
        return [{"w": w["w"] + int(d.rpartition("#")[2])} for d, w in zip(device_ids, weights, strict=True)]


def test_the_gateway_channel_registers_once_takes_work_at_once_and_reports_each_group_in_one_call():
    work = [GatewayTask(f"site-1#{i}", 7, 3) for i in (4, 1, 3, 2, 0)] + [GatewayTask("site-2#0", 7, 3)]
    gateway = ScriptedGateway(work, {"w": np.zeros(2, np.float32)})
    trainer = WeightsTrainerFake(fail={"site-1#4"})
    lines = []
    sim = FastSimulator(
        GatewayChannel(gateway, trainer, "site-1", 5),
        1,
        5.0,
        DeviceDelays(DelayConfig(), 0),
        on_report=lines.append,
        group_size=2,
    )
    assert sim.channel.open(1.0) and gateway.registered == [("site-1", 5)]
    sim.submit(sim.channel.next_tasks(0.1))
    assert sim.drain()
    assert sim.channel.next_tasks(0.1) == [] and gateway.stamps == [-1, 0]  # it waits from the stamp it saw
    assert trainer.calls[:2] == [["site-1#0", "site-1#1"], ["site-1#2", "site-1#3"]]  # sorted groups of 2
    assert [[r.device for r in group] for group in gateway.reports] == [
        ["site-1#0", "site-1#1"],
        ["site-1#2", "site-1#3"],
        ["site-1#4"],
    ]
    first = gateway.reports[0][1]
    assert (first.selection_id, first.version, first.count) == (7, 3, 1) and first.diff["w"][0] == 1.0
    failed = gateway.reports[2][0]
    assert failed.count == 0 and not failed.diff["w"].any()  # a zero-weight update frees its slot
    assert failed.error == "RuntimeError: corrupt sample"
    assert all(not r.error for group in gateway.reports for r in group if r.count)
    assert sim.failed_tasks == 1 and [line["ok"] for line in lines].count(False) == 1


def test_a_release_of_several_versions_trains_together_each_device_from_its_own_version_in_fixed_groups():
    """An asynchronous release: devices of three selections (three versions) arrive in any order, with a device of
    another release; they train in groups of the release alone, sorted by (selection, device), at least one group
    per worker, each device from the weights of its own version."""
    versions = {3: np.zeros(2, np.float32), 4: np.full(2, 10, np.float32), 5: np.full(2, 100, np.float32)}
    work = [
        GatewayTask("site-1#6", 13, 5, release=2),
        GatewayTask("site-1#2", 11, 3, release=2),
        GatewayTask("site-1#9", 12, 4, release=3),  # a later release: a group of its own
        GatewayTask("site-1#1", 12, 4, release=2),
        GatewayTask("site-1#0", 13, 5, release=2),
        GatewayTask("site-1#5", 11, 3, release=2),
    ]
    orders = []
    for ordered in (work, work[::-1]):
        gateway = ScriptedGateway(list(ordered), {}, {v: {"w": w} for v, w in versions.items()})
        trainer = WeightsTrainerFake()
        sim = FastSimulator(GatewayChannel(gateway, trainer, "site-1", 10), 2, 5.0, DeviceDelays(DelayConfig(), 0))
        sim.group_size = 100  # one group would hold the release: the two workers still get a group each
        sim.submit(sim.channel.next_tasks(0.1))
        assert sim.drain()
        orders.append(sorted(zip(map(tuple, trainer.calls), map(tuple, trainer.versions), strict=True)))
        diffs = {r.device: (r.version, float(r.diff["w"][0])) for group in gateway.reports for r in group}
        # each device's diff is built on its own version's weights (the fake adds the device's index)
        assert diffs == {
            "site-1#2": (3, 2.0),
            "site-1#5": (3, 5.0),
            "site-1#1": (4, 11.0),
            "site-1#9": (4, 19.0),
            "site-1#0": (5, 100.0),
            "site-1#6": (5, 106.0),
        }
    assert orders[0] == orders[1]  # the same groups whatever order the tasks came in
    assert orders[0] == sorted(
        [
            (("site-1#2", "site-1#5", "site-1#1"), (3, 3, 4)),
            (("site-1#0", "site-1#6"), (5, 5)),
            (("site-1#9",), (4,)),
        ]
    )


class SlowTrainer(GroupingTrainer):
    """Each training call takes 0.05 s."""

    def process_group(self, device_ids, task):
        time.sleep(0.05)
        return super().process_group(device_ids, task)


def test_each_report_line_carries_the_wall_seconds_of_the_training_call_its_device_was_in():
    leaf, lines = ScriptedLeaf(), []
    sim = make_simulator(leaf, 1, trainer=SlowTrainer([]), on_report=lines.append, group_size=3)
    dispatch(sim, {f"site-1#{i}": 1 for i in range(4)})  # a group of 3, then one alone
    assert sim.drain()
    assert sorted(line["group"] for line in lines) == [1, 3, 3, 3]
    grouped = {line["train_seconds"] for line in lines if line["group"] == 3}
    assert len(grouped) == 1 and 0.05 <= grouped.pop() < 1.0  # one call: one figure for its devices
    assert all(0.05 <= line["train_seconds"] < 1.0 for line in lines)
