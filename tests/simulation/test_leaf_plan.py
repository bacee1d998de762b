"""A leaf plans for itself: from its own machine and the leaves sharing it, with the user's overrides winning; on a
deployment it counts this job's client processes on its machine; the runner applies its plan to the trainer."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from nvflare.apis.fl_constant import FLContextKey, ReservedKey
from nvflare.apis.fl_context import FLContext

from common.leaf_outbox import OUTBOX_PROP
from simulation.leaf_plan import PlanRequest, count_leaf_processes, plan_leaf
from simulation.leaf_runner import FastDeviceRunner
from simulation.nvflare_private import NVFLARE_CLIENT_JOB_MODULE, NVFLARE_SIMULATOR_WORKER_MODULE
from simulation.planner import GpuInfo, HardwareProfile
from tests.conftest import make_processor

GB = 2**30
REQUEST = PlanRequest(model="cifar10_convnet", batch_size=32, optimizer="adam", devices_per_round=50)


def test_a_leaf_splits_its_machines_cores_with_the_leaves_beside_it():
    alone = plan_leaf(REQUEST, HardwareProfile(16), leaves_on_host=1)
    shared = plan_leaf(REQUEST, HardwareProfile(16), leaves_on_host=4)
    assert (alone.num_workers, alone.cores_per_leaf) == (16, 16)
    assert (shared.num_workers, shared.cores_per_leaf) == (4, 4)
    assert shared.engine == "vectorized" and shared.group_size == 13  # ceil(50 devices / 4 workers)


def test_the_users_workers_and_group_size_win_over_the_plan():
    request = PlanRequest(**(REQUEST.to_dict() | {"num_workers": 3, "group_size": 5}))
    plan = plan_leaf(request, HardwareProfile(16), leaves_on_host=1)
    assert (plan.num_workers, plan.limited_by, plan.group_size) == (3, "--num-workers", 5)


def test_a_gpu_leaf_plans_from_its_own_gpu_memory(monkeypatch):
    import simulation.leaf_plan as leaf_plan

    monkeypatch.setattr(leaf_plan, "resolve_device", lambda name: __import__("torch").device("cuda"))
    hardware = HardwareProfile(16, (GpuInfo("fake", 8 * GB, 8 * GB),))
    request = PlanRequest(**(REQUEST.to_dict() | {"compute_device": "cuda"}))
    one, two = (plan_leaf(request, hardware, leaves_on_host=n) for n in (1, 2))
    assert one.gpu_bytes_per_leaf > 1.9 * two.gpu_bytes_per_leaf and two.leaves_per_gpu == 2


def _sleeper(*marker: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *marker])


def _count_settles(own: list[str], expected: int) -> int:
    deadline = time.time() + 10
    while count_leaf_processes(own) < expected and time.time() < deadline:
        time.sleep(0.1)
    return count_leaf_processes(own)


def test_a_deployed_leaf_counts_this_jobs_client_processes_on_its_machine():
    job = "job-7d2f"
    own = [sys.executable, "-m", NVFLARE_CLIENT_JOB_MODULE, "-n", job]
    fakes = [_sleeper(NVFLARE_CLIENT_JOB_MODULE, "-n", job) for _ in range(3)]
    other = _sleeper(NVFLARE_CLIENT_JOB_MODULE, "-n", "another-job")
    try:
        assert _count_settles(own, 3) == 3
        assert count_leaf_processes([*own[:-1], "no-such-job"]) == 1  # at least the caller itself
        assert count_leaf_processes(["python", "some_script.py"]) == 1  # not an NVFlare client process
    finally:
        for p in [*fakes, other]:
            p.kill()
            p.wait()


def test_a_simenv_leaf_counts_the_simulator_workers_of_its_own_workspace(tmp_path):
    def worker(run: str, site: str) -> list[str]:
        return [NVFLARE_SIMULATOR_WORKER_MODULE, "-o", str(tmp_path / run / site), "--client", site]

    fakes = [_sleeper(*worker("run-a", f"site-{i}")) for i in (1, 2)]
    other = _sleeper(*worker("run-b", "site-1"))  # a run beside it, in its own workspace
    try:
        assert _count_settles([sys.executable, "-m", *worker("run-a", "site-1")], 2) == 2
    finally:
        for p in [*fakes, other]:
            p.kill()
            p.wait()


@pytest.mark.parametrize("leaves_on_host", [2, 0])
def test_the_runner_plans_at_start_applies_it_and_puts_it_in_the_outbox(monkeypatch, leaves_on_host):
    import simulation.leaf_runner as leaf_runner

    monkeypatch.setattr(leaf_runner, "probe_hardware", lambda: HardwareProfile(8))
    monkeypatch.setattr(leaf_runner, "count_leaf_processes", lambda: 4)
    request = PlanRequest(**(REQUEST.to_dict() | {"devices_per_round": 8, "leaves_on_host": leaves_on_host}))
    runner = FastDeviceRunner("task_processor", plan_request=request.to_dict(), num_devices=10)
    runner.tpo = make_processor()
    fl_ctx = FLContext()
    fl_ctx.set_prop(ReservedKey.IDENTITY_NAME, "C11", private=True, sticky=False)
    fl_ctx.set_prop(FLContextKey.JOB_META, {"name": "job"}, private=True, sticky=False)
    simulator = runner.create_simulator(fl_ctx)
    expected = {2: 4, 0: 2}[leaves_on_host]  # 8 cores over 2 leaves (SimEnv), or over the 4 it counted
    assert runner.plan.num_workers == expected and simulator.limit.limit == expected
    assert runner.tpo.torch_threads == runner.plan.torch_threads
    plans, _ = fl_ctx.get_prop(OUTBOX_PROP).take()
    assert plans["C11"]["num_workers"] == expected
    assert plans["C11"]["leaves_on_host"] == (leaves_on_host or 4) and plans["C11"]["hardware"]["cpu_cores"] == 8
    simulator.worker_pool.shutdown()
