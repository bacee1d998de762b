"""``use_fast_simulator`` swaps an NVFlare edge recipe's device simulator for ours and keeps everything else; a bad
option or a job it cannot convert is refused at once; the runner protects a foreign processor at leaf start."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest
import torch
from nvflare.apis.fl_constant import FLContextKey, ReservedKey
from nvflare.apis.fl_context import FLContext
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.widgets.tpo_runner import TPORunner
from nvflare.recipe.sim_env import SimEnv
from torch import nn

from common.choices import ConfigError
from common.leaf_outbox import OUTBOX_PROP
from common.nvflare_private import LeafStartFixes
from jobs.drop_in import LEAF_START_FIXES_ID, use_fast_simulator
from jobs.nvflare_private import client_app_config, recipe_job, server_app_config
from simulation.leaf_channels import EdgeRequestChannel
from simulation.leaf_plan import PlanRequest
from simulation.leaf_runner import FastDeviceRunner
from simulation.nvflare_private import QuietEdgeModelExecutor
from simulation.planner import HardwareProfile
from simulation.process_watch import ChildProcessWatch
from tests.fakes.processors import UsersProcessor


class UsersModel(nn.Module):  # the user's own class (NVFlare would copy torch's sources for a bare nn.Linear)
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)


def fed_buff_recipe():
    """NVFlare's FedBuff edge recipe module, imported by the tests that use it: it imports torchvision (seconds of
    every worker's collection otherwise)."""
    import nvflare.edge.tools.edge_fed_buff_recipe as module

    return module


def users_recipe(simulation: bool = True):
    """A user's own ``EdgeFedBuffRecipe``, with or without its device simulation."""
    r = fed_buff_recipe()
    return r.EdgeFedBuffRecipe(
        job_name="users_job",
        model=UsersModel(),
        model_manager_config=r.ModelManagerConfig(num_updates_for_model=4, max_model_version=3),
        device_manager_config=r.DeviceManagerConfig(device_selection_size=4),
        simulation_config=r.SimulationConfig(UsersProcessor(), job_timeout=33.0, num_devices=7) if simulation else None,
    )


def sage(recipe):
    return next(w.controller for w in server_app_config(recipe_job(recipe)).workflows)


def test_the_runner_and_executor_are_replaced_and_everything_else_is_kept():
    recipe = users_recipe()
    clients = client_app_config(recipe_job(recipe))
    before = dict(clients.components)
    servers = server_app_config(recipe_job(recipe))
    server_before = dict(servers.components)
    assert isinstance(before["tpo_runner"], TPORunner) and type(clients.executors[0].executor) is EdgeModelExecutor
    assert use_fast_simulator(recipe, update_interval=0.3, num_workers=2) is recipe
    runner = clients.components["tpo_runner"]
    assert isinstance(runner, FastDeviceRunner)
    assert (runner.task_processor_id, runner.job_timeout, runner.num_devices) == ("task_processor", 33.0, 7)
    assert PlanRequest.from_dict(runner.plan_request).num_workers == 2 and runner.send_up is False
    assert runner in clients.handlers and before["tpo_runner"] not in clients.handlers
    assert {k: v for k, v in clients.components.items() if k != "tpo_runner"} == {
        k: v for k, v in before.items() if k != "tpo_runner"
    }  # the user's processor (the same object) and every other component
    executor = clients.executors[0].executor
    assert type(executor) is QuietEdgeModelExecutor and executor.aggr_factory_id == "aggr_factory"
    assert sage(recipe)._update_interval == 0.3 and sage(recipe)._assess_interval <= 0.3  # noqa: SLF001
    added = servers.components.pop(LEAF_START_FIXES_ID)  # fix 19, installed as the server app is built
    assert type(added) is LeafStartFixes and servers.components == server_before


def test_the_converted_job_exports_our_runner_and_ships_our_packages(tmp_path):
    recipe = use_fast_simulator(users_recipe())
    recipe_job(recipe).export_job(str(tmp_path))
    app = tmp_path / "users_job" / "app"
    client_config = (app / "config" / "config_fed_client.json").read_text()
    assert "simulation.leaf_runner.FastDeviceRunner" in client_config
    assert "simulation.nvflare_private.QuietEdgeModelExecutor" in client_config
    assert (app / "custom" / "simulation" / "leaf_runner.py").is_file()
    server_config = (app / "config" / "config_fed_server.json").read_text()
    assert "common.nvflare_private.LeafStartFixes" in server_config
    assert (app / "custom" / "common" / "nvflare_private.py").is_file()


def test_a_simulation_given_by_the_environment_is_converted_when_the_recipe_processes_it():
    recipe = use_fast_simulator(users_recipe(simulation=False))
    r = fed_buff_recipe()
    env = SimEnv(
        num_clients=2, extra={r.DEVICE_SIMULATION_ENV_KEY: r.SimulationConfig(UsersProcessor(), num_devices=5)}
    )
    recipe.process_env(env)
    runner = client_app_config(recipe_job(recipe)).components["tpo_runner"]
    assert isinstance(runner, FastDeviceRunner) and runner.num_devices == 5


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"engine": "vectorized"}, ConfigError, "GroupTrainer"),
        ({"num_workers": 0}, ConfigError, "num-workers"),
        ({"delays": "paper"}, ConfigError, "time_scale"),
        ({"time_scale": -1}, ConfigError, "time-scale"),
        ({"no_such_option": 1}, TypeError, "no_such_option"),
    ],
)
def test_a_bad_option_is_refused_before_anything_runs(options, error, match):
    with pytest.raises(error, match=match):
        use_fast_simulator(users_recipe(), **options)


def test_a_job_without_simulation_or_converted_twice_is_refused():
    from nvflare.edge.aggregators.num_dxo_factory import NumDXOAggrFactory
    from nvflare.edge.tools.edge_job import EdgeJob

    with pytest.raises(ValueError, match="configure_simulation"):  # no clients at all
        use_fast_simulator(EdgeJob(name="bare", edge_method="edge"))
    clients_only = EdgeJob(name="clients_only", edge_method="edge")
    clients_only.configure_client(NumDXOAggrFactory())
    with pytest.raises(ValueError, match="configure_simulation"):
        use_fast_simulator(clients_only)
    recipe = use_fast_simulator(users_recipe())
    with pytest.raises(ValueError, match="already applied"):
        use_fast_simulator(recipe)
    with pytest.raises(ValueError, match="NVFlare recipe or job"):
        use_fast_simulator("users_job")


def test_the_runner_gives_a_foreign_processor_the_leafs_share_of_threads_and_logs_locally(monkeypatch, tmp_path):
    import simulation.leaf_runner as leaf_runner

    torch.set_num_threads(2)  # not the plan's one thread already (conftest.one_torch_thread): the runner sets it

    monkeypatch.setattr(leaf_runner, "probe_hardware", lambda: HardwareProfile(8))
    monkeypatch.setattr(leaf_runner, "count_leaf_processes", lambda: 2)
    request = PlanRequest(model=None, batch_size=0, optimizer="", devices_per_round=3)
    runner = FastDeviceRunner(
        "task_processor", plan_request=request.to_dict(), num_devices=3, send_up=False, leaf_log_dir=str(tmp_path)
    )
    runner.tpo = UsersProcessor()
    fl_ctx = FLContext()
    fl_ctx.set_prop(ReservedKey.IDENTITY_NAME, "site-1", private=True, sticky=False)
    fl_ctx.set_prop(FLContextKey.JOB_META, {"name": "job"}, private=True, sticky=False)
    (tmp_path / "leaf_site-1.jsonl").write_text('{"device": "site-1#0"}\n')  # an earlier run's line
    threads = torch.get_num_threads()
    try:
        simulator = runner.create_simulator(fl_ctx)
        # 8 cores over 2 leaves: 4 each, bounded by the 3 devices -> 3 workers of 1 thread
        assert (runner.plan.num_workers, runner.plan.engine) == (3, "per-device")
        assert torch.get_num_threads() == runner.plan.torch_threads == 1
        assert isinstance(simulator.channel, EdgeRequestChannel) and simulator.channel.trainer is None
        assert simulator.limit.limit == 3 and simulator.group_size == 1
        assert fl_ctx.get_prop(OUTBOX_PROP) is None  # nobody would send it up
        assert (tmp_path / "leaf_site-1_plan.json").is_file()
        simulator._on_report({"device": "site-1#0", "ok": True})  # noqa: SLF001
        runner._close("", fl_ctx)  # noqa: SLF001
        assert (tmp_path / "leaf_site-1.jsonl").read_text().count("site-1#0") == 1
        simulator.worker_pool.shutdown()
    finally:
        torch.set_num_threads(threads)


def test_child_processes_started_while_devices_train_are_reported_once(caplog):
    logger = logging.getLogger("watch-test")
    watch = ChildProcessWatch(logger, interval=0.05).start()
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"]) for _ in range(2)]
    try:
        with caplog.at_level(logging.WARNING, logger="watch-test"):
            deadline = time.time() + 5
            while len(watch.seen) < 2 and time.time() < deadline:
                time.sleep(0.05)
        assert len(watch.seen) == 2
        warnings = [r for r in caplog.records if "num_workers=0" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        watch.stop()
        for c in children:
            c.kill()
            c.wait()


def test_a_process_without_new_children_is_not_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        watch = ChildProcessWatch(logging.getLogger("quiet-test")).start()
        assert watch.sample() == 0
        watch.stop()
    assert not watch.warned and not caplog.records
