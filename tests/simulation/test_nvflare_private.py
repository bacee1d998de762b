"""The private NVFlare names this project uses (one ``nvflare_private.py`` per process: ``jobs.nvflare_guard``'s
``PRIVATE_MODULES``) still exist, with the shapes it
relies on.

If an NVFlare upgrade renamed an overridden handler, the override would silently stop being called and every
device request would again render whole models as text; if it reshaped ``FedJob``'s apps, ``use_fast_simulator``
could no longer replace a recipe's runner. These tests fail first, naming the name."""

import importlib
import inspect
import threading
import time

import pytest
from nvflare.apis.job_def import ALL_SITES
from nvflare.edge.aggregators.num_dxo_factory import NumDXOAggrFactory
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.tools.edge_job import EdgeJob
from nvflare.edge.widgets.tpo_runner import TPORunner

from common.nvflare_private import (
    ORIGINALS,
    SIMULATOR_GRACES,
    SIMULATOR_POLL,
    SIMULATOR_POLLS,
    SIMULATOR_SHUTDOWN_GRACE,
    SIMULATOR_WORKFLOW_GRACE,
    STREAM_CLEANUP,
    install_nvflare_fixes,
    load_drivers_on_demand,
    quick_simulator_polls,
    share_stream_cleanup_thread,
    short_simulator_shutdown_grace,
    short_workflow_grace,
    simulator_ports_outside_ephemeral_range,
)
from common.ports import ephemeral_range
from jobs.nvflare_guard import merged
from jobs.nvflare_private import client_app_config, recipe_job, server_app_config, set_sync_interval
from scheduling.nvflare_private import SIMULATOR_ENGINE_CHECK, quick_engine_checks
from simulation.leaf_executor import EdgeSimExecutor
from simulation.nvflare_private import QuietEdgeModelExecutor
from tests.fakes.processors import UsersProcessor

# every process's tables, merged: the names below are checked wherever they live
NVFLARE_PRIVATE_ATTRIBUTES = merged("NVFLARE_PRIVATE_ATTRIBUTES")
NVFLARE_PRIVATE_MODULE_FUNCTIONS = merged("NVFLARE_PRIVATE_MODULE_FUNCTIONS")
NVFLARE_PRIVATE_OVERRIDES = merged("NVFLARE_PRIVATE_OVERRIDES")
NVFLARE_PRIVATE_PATCHES = merged("NVFLARE_PRIVATE_PATCHES")


def _real(owner, name: str) -> str:
    """The dotted path of NVFlare's own member ``name`` of ``owner`` (a class or module, imported from NVFlare)."""
    module = owner.__name__ if inspect.ismodule(owner) else f"{owner.__module__}.{owner.__qualname__}"
    assert hasattr(owner, name), f"NVFlare's {module} has no {name} any more: review the nvflare_private.py modules"
    return f"{module}.{name}"


def test_the_private_names_we_touch_are_nvflares_real_ones():
    """Written with NVFlare's own classes and modules, not with our tables: an upgrade that moves or renames any
    of them fails here (at the import, or naming the member), and our tables must list exactly these."""
    from nvflare.edge.controllers.sage import ScatterAndGatherForEdge
    from nvflare.edge.executors.ete import EdgeTaskExecutor
    from nvflare.edge.executors.hug import HierarchicalUpdateGatherer
    from nvflare.fuel.f3 import communicator
    from nvflare.fuel.f3.drivers.tcp_driver import TcpDriver
    from nvflare.fuel.f3.mpm import MainProcessMonitor
    from nvflare.fuel.f3.streaming.byte_receiver import RxTask
    from nvflare.job_config.api import FedJob
    from nvflare.private.fed.app.deployer import simulator_deployer
    from nvflare.private.fed.app.simulator import simulator_runner
    from nvflare.recipe.spec import Recipe

    assert NVFLARE_PRIVATE_OVERRIDES == {
        _real(HierarchicalUpdateGatherer, "_do_task"): ("self", "fl_ctx", "abort_signal"),
        _real(EdgeTaskExecutor, "_handle_edge_request"): ("self", "event_type", "fl_ctx", "process_f", "no_task_reply"),
        _real(EdgeTaskExecutor, "_handle_edge_job_request"): ("self", "event_type", "fl_ctx"),
    }
    runner = simulator_runner.SimulatorRunner
    assert NVFLARE_PRIVATE_PATCHES == {
        _real(RxTask, "_schedule_remove_task"): ("self", "ttl"),
        _real(RxTask, "_remove_task"): ("self",),
        _real(MainProcessMonitor, "_start_shutdown"): ("shutdown_grace_time", "cleanup_grace_time"),
        _real(runner, "start_server_app"): ("self", "args"),
        _real(TcpDriver, "listen"): ("self", "connector"),
        _real(runner, "client_run"): ("self", "server_custom_folder", "clients", "gpu"),
    }
    assert NVFLARE_PRIVATE_MODULE_FUNCTIONS == {
        _real(simulator_runner, "get_open_ports"): ("number",),
        _real(simulator_deployer, "get_open_ports"): ("number",),
        _real(communicator, "load_comm_drivers"): (),
    }
    hug = ("_pending_task", "_task_done", "_process_error", "_parent_name", "_num_children", "_updater")
    hug += ("_make_update_report", "_pending_clients_status")
    assert NVFLARE_PRIVATE_ATTRIBUTES == {
        f"{FedJob.__module__}.FedJob": ("_deploy_map",),
        f"{Recipe.__module__}.Recipe": ("_job",),
        f"{ScatterAndGatherForEdge.__module__}.ScatterAndGatherForEdge": ("_update_interval", "_assess_interval"),
        f"{HierarchicalUpdateGatherer.__module__}.HierarchicalUpdateGatherer": hug,
    }
    # the methods' signatures, read from NVFlare's classes themselves (even where this process replaced them)
    assert tuple(inspect.signature(HierarchicalUpdateGatherer._do_task).parameters) == (
        "self",
        "fl_ctx",
        "abort_signal",
    )
    remove = ORIGINALS.get("RxTask._schedule_remove_task", RxTask._schedule_remove_task)
    assert tuple(inspect.signature(remove).parameters) == ("self", "ttl")
    ports = ORIGINALS.get(_real(simulator_runner, "get_open_ports"), simulator_runner.get_open_ports)
    assert tuple(inspect.signature(ports).parameters) == ("number",)


@pytest.mark.parametrize("path, parameters", sorted(NVFLARE_PRIVATE_OVERRIDES.items()))
def test_overridden_private_nvflare_method_is_unchanged(path, parameters):
    module_name, class_name, method = path.rsplit(".", 2)
    cls = getattr(importlib.import_module(module_name), class_name)
    assert hasattr(cls, method), f"NVFlare no longer has {path}: review the nvflare_private.py modules"
    assert tuple(inspect.signature(getattr(cls, method)).parameters) == parameters
    # our leaf executor overrides all three; the quiet stock executor only the payload-rendering handlers
    executors = [EdgeSimExecutor] + ([QuietEdgeModelExecutor] if method != "_do_task" else [])
    for executor in executors:
        assert getattr(executor, method) is not getattr(cls, method), f"the override is gone from {executor}"


@pytest.mark.parametrize("executor", [EdgeSimExecutor(), QuietEdgeModelExecutor("aggr_factory")])
def test_nvflare_registers_the_overridden_handlers_by_bound_method(executor):
    """EdgeTaskExecutor registers ``self._handle_edge_request`` in __init__: the subclass's method is what runs."""
    handlers = [h for entries in executor.get_event_handlers().values() for h, _ in entries]
    assert any(getattr(h, "__func__", None) is type(executor)._handle_edge_request for h in handlers)
    assert any(getattr(h, "__func__", None) is type(executor)._handle_edge_job_request for h in handlers)


def test_a_built_jobs_apps_hold_its_components_where_they_are_replaced():
    from nvflare.edge.controllers.sage import ScatterAndGatherForEdge
    from nvflare.edge.tools.edge_fed_buff_recipe import DeviceManagerConfig, EdgeFedBuffRecipe, ModelManagerConfig
    from torch import nn

    recipe = EdgeFedBuffRecipe("probe", nn.Linear(2, 2), ModelManagerConfig(), DeviceManagerConfig())
    sage = ScatterAndGatherForEdge(assess_interval=0.7, update_interval=0.9)
    instances = {
        "nvflare.job_config.api.FedJob": EdgeJob(name="probe", edge_method="edge"),
        "nvflare.recipe.spec.Recipe": recipe,
        "nvflare.edge.controllers.sage.ScatterAndGatherForEdge": sage,
        "nvflare.edge.executors.hug.HierarchicalUpdateGatherer": EdgeSimExecutor(),
    }
    assert set(instances) == set(NVFLARE_PRIVATE_ATTRIBUTES)
    for path, attributes in NVFLARE_PRIVATE_ATTRIBUTES.items():
        module_name, class_name = path.rsplit(".", 1)
        assert isinstance(instances[path], getattr(importlib.import_module(module_name), class_name))
        for attribute in attributes:
            assert hasattr(instances[path], attribute), f"{path}.{attribute} is gone"
    assert isinstance(recipe_job(recipe), EdgeJob)
    assert (sage._assess_interval, sage._update_interval) == (0.7, 0.9)  # noqa: SLF001 - what set_sync_interval sets
    set_sync_interval(sage, 0.25)
    assert (sage._assess_interval, sage._update_interval) == (0.25, 0.25)  # noqa: SLF001

    job = EdgeJob(name="probe", edge_method="edge")
    job.configure_simulation(UsersProcessor(), num_devices=3, num_workers=2)
    job.configure_client(NumDXOAggrFactory())
    clients = client_app_config(job)
    assert isinstance(clients.components["tpo_runner"], TPORunner)
    assert [type(e.executor) for e in clients.executors] == [EdgeModelExecutor]
    assert job._deploy_map[ALL_SITES].app_config is clients  # noqa: SLF001
    with pytest.raises(ValueError, match="no server app"):
        server_app_config(job)


@pytest.mark.parametrize("path, parameters", sorted(NVFLARE_PRIVATE_PATCHES.items()))
def test_patched_private_nvflare_methods_are_unchanged(path, parameters):
    module_name, class_name, method = path.rsplit(".", 2)
    cls = getattr(importlib.import_module(module_name), class_name)
    assert hasattr(cls, method), f"NVFlare no longer has {path}: review the nvflare_private.py modules"
    original = ORIGINALS.get(f"{class_name}.{method}", getattr(cls, method))  # NVFlare's, even once replaced
    assert original.__module__ == module_name
    assert tuple(inspect.signature(original).parameters) == parameters


@pytest.mark.parametrize("path, parameters", sorted(NVFLARE_PRIVATE_MODULE_FUNCTIONS.items()))
def test_replaced_private_nvflare_functions_are_unchanged(path, parameters):
    module_name, name = path.rsplit(".", 1)
    module = importlib.import_module(module_name)
    assert hasattr(module, name), f"NVFlare no longer has {path}: review the nvflare_private.py modules"
    original = ORIGINALS.get(path, getattr(module, name))
    assert tuple(inspect.signature(original).parameters) == parameters


def test_simulator_processes_sleep_a_short_grace_before_their_cleanup(monkeypatch):
    """Fix 8: MPM's sleep before the cleanup callbacks is capped; the callbacks still run; idempotent."""
    from nvflare.fuel.f3 import mpm

    slept = []
    monkeypatch.setattr(mpm.time, "sleep", slept.append)
    monkeypatch.setattr(mpm.MainProcessMonitor, "_cleanup_cbs", [])
    short_simulator_shutdown_grace()
    short_simulator_shutdown_grace()
    assert ORIGINALS["MainProcessMonitor._start_shutdown"].__func__.__module__ == "nvflare.fuel.f3.mpm"
    called = []
    mpm.MainProcessMonitor.add_cleanup_cb(called.append, "cleaned")
    mpm.MainProcessMonitor._start_shutdown(3, 6)  # noqa: SLF001 - what SimulatorRunner.run_process asks for
    assert slept == [SIMULATOR_SHUTDOWN_GRACE] and called == ["cleaned"]


def test_the_simulator_server_checks_for_a_finished_run_often(monkeypatch):
    """Fix 9: the simulator's server polls its engine every SIMULATOR_ENGINE_CHECK s; a deployed server keeps 3 s."""
    import inspect as _inspect

    from nvflare.private.fed.server.fed_server import FederatedServer

    from scheduling import nvflare_private

    assert "check_engine_frequency=3.0" in str(_inspect.signature(FederatedServer.__init__))
    assert "time.sleep(self.check_engine_frequency)" in _inspect.getsource(FederatedServer.start_run)

    class Engine:
        server = type("Server", (), {"check_engine_frequency": 3.0})()

    engine = Engine()
    monkeypatch.setattr(nvflare_private, "in_simulator", lambda: False)
    quick_engine_checks(engine)
    assert engine.server.check_engine_frequency == 3.0
    monkeypatch.setattr(nvflare_private, "in_simulator", lambda: True)
    quick_engine_checks(engine)
    assert engine.server.check_engine_frequency == SIMULATOR_ENGINE_CHECK
    quick_engine_checks(object())  # no server: nothing to do


def test_simulator_workers_get_ports_below_the_ephemeral_range():
    """Fix 7: the port NVFlare's simulator gives a client worker comes from ``listen_ports``, outside the range
    outgoing connections draw from, and two workers never get the same one."""
    from nvflare.private.fed.app.simulator import simulator_runner

    assert "get_open_ports(1)" in inspect.getsource(simulator_runner.SimulatorClientRunner.do_one_task)
    simulator_ports_outside_ephemeral_range()
    simulator_ports_outside_ephemeral_range()  # idempotent: NVFlare's original stays recorded
    assert ORIGINALS[f"{simulator_runner.__name__}.get_open_ports"].__module__ == "nvflare.fuel.utils.network_utils"
    low, _ = ephemeral_range()
    ports = [simulator_runner.get_open_ports(1)[0] for _ in range(50)]
    assert len(set(ports)) == 50 and all(port < low for port in ports)


def test_finished_streams_are_removed_by_one_shared_thread_after_the_same_delay():
    """A real ``RxTask`` (NVFlare's receiving side of a stream): its delayed removal takes no thread of its own,
    happens after its delay, and a removal done earlier cancels it."""
    from nvflare.fuel.f3.streaming.byte_receiver import RxTask

    share_stream_cleanup_thread()
    assert RxTask._schedule_remove_task.__module__ == "common.nvflare_private"  # noqa: SLF001
    tasks = []
    for sid in (1, 2):
        task = RxTask.__new__(RxTask)
        task.origin, task.sid = "probe-origin", sid
        task.stop_lock, task.cleanup_timer, task.completed_task_ttl = threading.RLock(), None, 0.3
        RxTask.rx_task_map[(task.origin, sid)] = task
        tasks.append(task)
    threads = threading.active_count()
    for task in tasks:
        task._schedule_remove_task()  # noqa: SLF001 - what NVFlare calls when a stream is done
    tasks[1]._remove_task()  # noqa: SLF001 - removed at once (e.g. a failed stream): its scheduled removal is void
    assert threading.active_count() <= threads + 1  # at most the shared thread, started once
    assert ("probe-origin", 1) in RxTask.rx_task_map and ("probe-origin", 2) not in RxTask.rx_task_map
    time.sleep(0.6)
    assert ("probe-origin", 1) not in RxTask.rx_task_map
    assert STREAM_CLEANUP.wait_idle(1.0)


def test_a_received_payload_renders_as_its_size_not_its_bytes():
    """NVFlare's cell renders every received payload in a debug f-string (fix 5): it must cost nothing."""
    from nvflare.fuel.f3.cellnet.cell import Adapter
    from nvflare.fuel.utils.buffer_list import ConsumableBufferList

    assert "incoming data={result}" in inspect.getsource(Adapter.call)  # the f-string the fix is for
    install_nvflare_fixes()
    payload = ConsumableBufferList([bytes(1 << 20), bytes(1 << 19)])
    assert repr(payload) == f"{payload!s}" == "<payload of 2 chunk(s), 1572864 bytes>"


def test_a_simulator_connection_uses_the_tcp_driver_alone_and_another_scheme_loads_every_driver(monkeypatch, caplog):
    """Fix 17, on a fresh driver manager: a real listener and a connector to it (NVFlare's ``Communicator``, the
    two calls that load drivers), connected, register NVFlare's TCP driver and nothing else; a scheme it does not
    serve then loads every driver as NVFlare does (the TCP driver once: NVFlare logs an error for a second
    registration)."""
    from nvflare.fuel.f3 import communicator
    from nvflare.fuel.f3.communicator import Communicator
    from nvflare.fuel.f3.drivers.aio_http_driver import AioHttpDriver
    from nvflare.fuel.f3.drivers.driver_manager import DriverManager
    from nvflare.fuel.f3.drivers.driver_params import DriverParams
    from nvflare.fuel.f3.drivers.tcp_driver import TcpDriver
    from nvflare.fuel.f3.endpoint import Endpoint
    from nvflare.fuel.f3.sfm.conn_manager import Mode

    from common.ports import listen_ports

    key = "nvflare.fuel.f3.communicator.load_comm_drivers"
    monkeypatch.setattr(communicator, "driver_mgr", DriverManager())
    monkeypatch.setattr(communicator, "load_comm_drivers", ORIGINALS.get(key, communicator.load_comm_drivers))
    monkeypatch.delitem(ORIGINALS, key, raising=False)
    monkeypatch.delitem(ORIGINALS, "every driver loaded", raising=False)
    load_drivers_on_demand()
    load_drivers_on_demand()  # idempotent
    assert ORIGINALS[key].__module__ == "nvflare.fuel.f3.communicator"
    names = [f"fix17-{role}-{time.time_ns()}" for role in ("server", "leaf")]
    passive, active = Communicator(Endpoint(names[0])), Communicator(Endpoint(names[1]))
    resources = {DriverParams.HOST.value: "127.0.0.1", DriverParams.PORTS.value: str(listen_ports(1)[0])}
    _, url, _ = passive.start_listener("tcp", resources)
    active.add_connector(url, Mode.ACTIVE)
    passive.start()
    active.start()
    try:
        deadline = time.time() + 10
        while passive.find_endpoint(names[1]) is None and time.time() < deadline:
            time.sleep(0.02)
        assert passive.find_endpoint(names[1]) is not None, "the connector never reached the listener"
    finally:
        active.stop()
        passive.stop()
    manager = communicator.driver_mgr
    assert manager.drivers == {"tcp": TcpDriver, "stcp": TcpDriver}
    with caplog.at_level("ERROR"):
        assert manager.find_driver_class("http://127.0.0.1:1") is AioHttpDriver
    assert manager.drivers["tcp"] is TcpDriver and len(manager.drivers) > 2
    assert not [r for r in caplog.records if "already registered" in r.getMessage()]


def test_the_event_driven_sync_waits_for_a_request_batches_within_its_window_and_keeps_a_heartbeat():
    import math

    from simulation.nvflare_private import EventDrivenSync

    class Node(EventDrivenSync):
        def __init__(self):
            self.sync_cond, self.sync_due = threading.Condition(), math.inf

    node = Node()
    started = time.monotonic()
    node._wait_for_sync(0.2)  # nothing asked: the heartbeat
    assert 0.19 <= time.monotonic() - started < 1.0
    threading.Timer(0.05, node.sync_now).start()
    started = time.monotonic()
    node._wait_for_sync(5.0)  # woken at once by the request
    assert time.monotonic() - started < 1.0
    node.sync_soon(0.15)  # a result with more to come: it waits for them, within its window
    node.sync_soon(0.5)  # a later request does not push the sync back
    started = time.monotonic()
    node._wait_for_sync(5.0)
    assert 0.1 <= time.monotonic() - started < 0.45
    node.sync_soon(0.3)
    node.sync_now()  # and one that cannot wait brings it forward
    started = time.monotonic()
    node._wait_for_sync(5.0)
    assert time.monotonic() - started < 0.2


CAPPED_SLEEPS = [(name, callers, SIMULATOR_POLL, quick_simulator_polls) for name, callers in SIMULATOR_POLLS.items()]
CAPPED_SLEEPS += [
    (name, callers, SIMULATOR_WORKFLOW_GRACE, short_workflow_grace) for name, callers in SIMULATOR_GRACES.items()
]


@pytest.mark.parametrize("module_name, callers, cap, install", sorted(CAPPED_SLEEPS, key=lambda c: c[0]))
def test_the_simulators_capped_sleeps_are_short_and_nothing_else_changes(
    monkeypatch, module_name, callers, cap, install
):
    """Fixes 10 and 11: each named NVFlare function still sleeps through its module's ``time``; once capped, a
    sleep from one of them lasts at most its cap, any other sleep of the module what it asked for; idempotent."""
    import ast
    import textwrap

    module = importlib.import_module(module_name)
    sleepers = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(module)))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "time.sleep(" in ast.unparse(node):
            sleepers.add(node.name)
    assert set(callers) <= sleepers, f"{module_name}: review fixes 10 and 11 of common/nvflare_private.py"
    for name in (*SIMULATOR_POLLS, *SIMULATOR_GRACES):  # NVFlare's own, restored after the test
        monkeypatch.setattr(importlib.import_module(name), "time", time)
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    install()
    capped = module.time
    install()
    assert module.time is capped and capped.monotonic is time.monotonic

    def call_as(name: str) -> None:  # a function of that name asking the module's time for 1 s
        code = compile("capped.sleep(1.0)", module_name, "exec").replace(co_name=name)
        exec(code, {"capped": capped})

    for name in callers:
        call_as(name)
    call_as("some_other_function")
    assert slept == [min(1.0, cap)] * len(callers) + [1.0]
