"""The fast device simulator's failure handling, driven through NVFlare's device protocol objects.

A scripted leaf answers task requests and records result reports, so these tests run the simulator's real
dispatch and task code without starting NVFlare."""

import json
import threading
import time

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


class ScriptedDevice(SimulatedDevice):
    def __init__(self, device_id: str, script):
        super().__init__(device_id)
        self.script, self.calls = script, 0

    def do_task(self, task: TaskResponse) -> dict:
        self.calls += 1
        return self.script(self)


class ScriptedFactory(DeviceFactory):
    """Devices that run ``scripts[device_id]`` (default ``default``) when the simulator has no trainer."""

    def __init__(self, scripts: dict, default=lambda d: {"ok": 1}):
        self.scripts, self.default, self.devices = scripts, default, {}

    def make_device(self, device_id: str) -> SimulatedDevice:
        device = ScriptedDevice(device_id, self.scripts.get(device_id, self.default))
        self.devices[device_id] = device
        return device


class ScriptedLeaf:
    def __init__(self):
        self.reports: list[ResultReport] = []
        self.lock = threading.Lock()

    def __call__(self, req, device, **_):
        if isinstance(req, TaskRequest):
            cookie = {CookieKey.MODEL_VERSION: 1, CookieKey.DEVICE_SELECTION_ID: 1}
            return TaskResponse(EdgeApiStatus.OK, "job", 0, "task-1", "train", {}, cookie)
        with self.lock:
            self.reports.append(req)
        return ResultResponse(EdgeApiStatus.OK, task_id=req.task_id, task_name=req.task_name)


JOB = JobResponse(EdgeApiStatus.OK, job_id="job", job_name="job", method="edge", job_data={})


def make_simulator(factory, leaf, num_devices: int, num_workers: int, delays=None, **kwargs) -> FastSimulator:
    delays = DeviceDelays(delays or DelayConfig(), seed=0)
    sim = FastSimulator("job", factory, "site-1", num_devices, num_workers, 5.0, delays, **kwargs)
    sim.set_send_func(leaf)
    return sim


def dispatch(sim: FastSimulator, device_ids: list[str]) -> None:
    """Request the devices' tasks at once and hand them to the pool, as the control loop does."""
    sim._submit([sim._dispatch(JOB, did, 1) for did in device_ids])


def run_devices(scripts: dict, device_ids: list[str], num_workers: int = 4):
    factory, leaf = ScriptedFactory(scripts), ScriptedLeaf()
    sim = make_simulator(factory, leaf, len(device_ids), num_workers)
    dispatch(sim, device_ids)
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
    assert not sim.busy_devices, "a failed device is released, not left busy"


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


class GroupingProcessor:
    """Trains a group in one call, as TrainingTaskProcessor.process_group does; can run out of memory."""

    def __init__(self, calls: list, oom_above: int | None = None):
        self.calls, self.oom_above = calls, oom_above

    def process_group(self, device_ids, task):
        if self.oom_above is not None and len(device_ids) > self.oom_above:
            raise RuntimeError("CUDA out of memory")
        self.calls.append(list(device_ids))
        return [{"trained": d} for d in device_ids]

    def failed_result(self, device_id, task):
        return {"dict": {"w": [0.0]}, "count": 0}


def run_grouped(n: int, group_size: int, oom_above: int | None = None):
    calls: list = []
    leaf = ScriptedLeaf()
    sim = make_simulator(ScriptedFactory({}), leaf, n, 2, trainer=GroupingProcessor(calls, oom_above),
                         group_size=group_size)  # fmt: skip
    dispatch(sim, [f"site-1#{i}" for i in range(n)])
    assert sim.drain()
    return sim, calls, leaf.reports


def test_ready_tasks_of_one_version_are_trained_in_groups_and_each_device_reports_its_own_result():
    sim, calls, reports = run_grouped(10, group_size=4)
    assert sorted(len(c) for c in calls) == [2, 4, 4]
    assert len(reports) == 10
    for r in reports:
        assert r.status == EdgeApiStatus.OK and r.result == {"trained": r.get_device_id()}


def test_a_group_that_runs_out_of_memory_halves_the_group_size_and_its_devices_still_report():
    sim, calls, reports = run_grouped(8, group_size=8, oom_above=4)
    assert sim.group_size == 4
    assert len(reports) == 8 and all(r.status == EdgeApiStatus.OK for r in reports)


def test_scaled_time_starts_a_later_task_at_its_simulated_dispatch_time(tmp_path):
    """--time-scale S: a task dispatched 0.3 wall-s after another starts 0.3/S simulated seconds later, so a short
    task dispatched late can still report before a long one (on the pure virtual clock it would start at the
    leaf's last reported finish time)."""
    speed = DelayConfig(speed_means=(100.0, 5.0), speed_stds=(0.0, 0.0))
    classes = DeviceDelays(speed, seed=0)
    ids = [f"site-1#{i}" for i in range(50)]
    slow = next(d for d in ids if classes.device_traits(d)[0] == 0)
    fast = next(d for d in ids if classes.device_traits(d)[0] == 1)
    leaf, log = ScriptedLeaf(), tmp_path / "clock.jsonl"
    sim = make_simulator(ScriptedFactory({}), leaf, 2, 2, speed, time_scale=0.01, clock_log=str(log))
    dispatch(sim, [slow])
    time.sleep(0.3)
    before = time.time()
    dispatch(sim, [fast])
    after = time.time()
    assert sim.drain()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["device"] for e in events] == [fast, slow]
    by_device = {e["device"]: e["sim"] for e in events}
    assert by_device[slow] == pytest.approx(100.0, abs=0.5)
    # started when it was dispatched (~0.3 wall-s / 0.01 = ~30 sim-s in), not at simulated time 0
    assert (before - sim._origin) / 0.01 + 5.0 <= by_device[fast] <= (after - sim._origin) / 0.01 + 5.0


class BrokenTrainer(GroupingProcessor):
    def process_group(self, device_ids, task):
        raise RuntimeError("corrupt sample")


def test_a_device_that_fails_for_good_reports_a_zero_weight_update_so_its_round_goes_on(tmp_path):
    leaf, log = ScriptedLeaf(), tmp_path / "clock.jsonl"
    sim = make_simulator(ScriptedFactory({}), leaf, 1, 1, trainer=BrokenTrainer([]), clock_log=str(log))
    dispatch(sim, ["site-1#0"])
    assert sim.drain()
    (report,) = leaf.reports
    assert report.status == EdgeApiStatus.OK and report.result["count"] == 0
    assert sim.failed_tasks == 1
    assert json.loads(log.read_text())["ok"] is False


def test_scaled_delays_do_not_hold_the_worker_and_results_leave_in_due_order(tmp_path):
    """One worker, a group trained together: with the delays held outside the worker, a later short task is
    trained and reported while the group's slow device is still waiting out its delay."""
    speed = DelayConfig(speed_means=(100.0, 5.0), speed_stds=(0.0, 0.0))
    classes = DeviceDelays(speed, seed=0)
    ids = [f"site-1#{i}" for i in range(50)]
    slow = next(d for d in ids if classes.device_traits(d)[0] == 0)
    fast = [d for d in ids if classes.device_traits(d)[0] == 1][:2]
    leaf = ScriptedLeaf()
    log = tmp_path / "clock.jsonl"
    sim = make_simulator(ScriptedFactory({}), leaf, 3, 1, speed, trainer=GroupingProcessor([]), time_scale=0.01,
                         clock_log=str(log), group_size=2)  # fmt: skip
    dispatch(sim, [slow, fast[0]])  # one group: due after 1.0 s and 0.05 s of wall time
    time.sleep(0.2)
    dispatch(sim, [fast[1]])  # the only worker must be free for it
    assert sim.drain()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["device"] for e in events] == [fast[0], fast[1], slow]
    wall = {e["device"]: e["wall"] for e in events}
    slow_due = sim._origin + 1.0
    assert wall[fast[0]] < slow_due and wall[fast[1]] < slow_due, "fast devices waited for the slow one's delay"
    assert wall[slow] >= slow_due - 0.01
