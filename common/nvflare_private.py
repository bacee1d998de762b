"""The fixes to NVFlare 2.9 that every NVFlare process installs (``install_nvflare_fixes``, called by the server's
assessor, the leaf's executor and ``common.early_start``): fixes 4 and 5 everywhere, and 7, 8, 10 to 13, 17, 19 in
NVFlare's simulator processes only; and the console filter of fix 18. What each fix does and why, by number, and
what NVFlare would need upstream so that it can go: ``docs/nvflare-upstream.md``.

Each process's own fixes live beside it, in the same name (``simulation``, ``scheduling``, ``jobs``:
``nvflare_private.py``); private NVFlare names live only in those four modules.
``tests/simulation/test_nvflare_private.py`` fails, naming the name, if an NVFlare upgrade renames or reshapes any
of them; every body a fix copies (``NVFLARE_COPIES``) or relies on (``NVFLARE_RELIED_ON``) has a digest of its
source in ``TESTED_NVFLARE``, which ``jobs.nvflare_guard`` compares with the installed NVFlare.

Over 400 lines: every process's fixes, each a short function beside the tables the guard reads; private NVFlare
names live in one ``nvflare_private.py`` per package (``jobs.nvflare_guard.PRIVATE_MODULES``), so they stay here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from nvflare.apis.fl_component import FLComponent

from common.due_timer import DueTimer

TESTED_NVFLARE = "2.9.0"  # the NVFlare these fixes were written and tested against (pyproject.toml pins it)

# module.Class.function -> digest of its source in TESTED_NVFLARE (``jobs.nvflare_guard.source_digest``)
NVFLARE_COPIES = {  # bodies a fix copies, with its one change (each copy names its original)
    "nvflare.fuel.f3.drivers.tcp_driver.TcpDriver.listen": "fde878dbc2546e72",
    "nvflare.fuel.f3.streaming.byte_receiver.RxTask._schedule_remove_task": "53ba0fe8e9554ef0",
}
_RUNNER = "nvflare.private.fed.app.simulator.simulator_runner"
_CLIENT_RUNNER = "nvflare.private.fed.client.client_runner.ClientRunner"
_WORKER = "nvflare.private.fed.app.simulator.simulator_worker"
NVFLARE_RELIED_ON = {  # bodies whose behaviour a fix depends on (the fix's number)
    f"{_RUNNER}.SimulatorRunner.setup": "8152f8675112ea51",  # 15
    f"{_RUNNER}.SimulatorRunner.simulator_run_main": "fa7e3a54048f6aed",  # 10, 12
    f"{_RUNNER}.SimulatorRunner.start_server_app": "8e76d39ef6ef8cf1",  # 12
    f"{_RUNNER}.SimulatorRunner.client_run": "81a615e0e20e677e",  # 12
    f"{_RUNNER}.SimulatorClientRunner.run_client_thread": "9bc66407f7717d78",  # 10
    f"{_RUNNER}.SimulatorClientRunner._create_connection": "8f524e5aebaf4004",  # 10
    f"{_RUNNER}.SimulatorClientRunner.__init__": "d263b7fc56dd0175",  # 19
    f"{_RUNNER}.SimulatorClientRunner.do_one_task": "e2d56068a07ad7d9",  # 7, 16, 19
    f"{_CLIENT_RUNNER}.init_run": "978a344d246ec91b",  # 10
    f"{_CLIENT_RUNNER}._send_task_result": "5c4591509679bedf",  # 10
    f"{_CLIENT_RUNNER}._try_send_result_once": "907b82638989d9e4",  # 10
    f"{_WORKER}.ClientTaskWorker.run": "2405414767da983e",  # 10
    f"{_WORKER}.ClientTaskWorker.do_one_task": "42a9f55d5a0b1cd0",  # 10
    f"{_WORKER}.main": "c451c07d5f6a1ca7",  # 15
    "nvflare.fuel.f3.cellnet.connector_manager.ConnectorManager._get_connector": "f6ad95d18f315789",  # 10
    "nvflare.edge.controllers.sage.ScatterAndGatherForEdge.control_flow": "00183ad9cc5148e7",  # 11
    "nvflare.fuel.f3.mpm.MainProcessMonitor._start_shutdown": "53a427bd4ebea262",  # 8
    "nvflare.fuel.f3.cellnet.cell.Adapter.call": "3209a3399e733866",  # 5
    "nvflare.fuel.f3.communicator.load_comm_drivers": "b8a9557c78c24eed",  # 17
    "nvflare.fuel.f3.communicator.Communicator.add_connector": "fdae41af3af15e6b",  # 17
    "nvflare.fuel.f3.communicator.Communicator.start_listener": "61f6d7bb757aa688",  # 17
    "nvflare.fuel.f3.drivers.driver_manager.DriverManager.search_folder": "d39768130c7b6013",  # 17
    "nvflare.private.aux_runner.AuxRunner._process_request": "88113aac2d20a961",  # 18
    "nvflare.private.fed.server.server_runner.ServerRunner._register_aux_message_handler": "c1aa0cab2f5328f5",  # 18
}
NVFLARE_PRIVATE_PATCHES = {
    "nvflare.fuel.f3.streaming.byte_receiver.RxTask._schedule_remove_task": ("self", "ttl"),
    "nvflare.fuel.f3.streaming.byte_receiver.RxTask._remove_task": ("self",),
    "nvflare.fuel.f3.mpm.MainProcessMonitor._start_shutdown": ("shutdown_grace_time", "cleanup_grace_time"),
    "nvflare.private.fed.app.simulator.simulator_runner.SimulatorRunner.start_server_app": ("self", "args"),
    "nvflare.fuel.f3.drivers.tcp_driver.TcpDriver.listen": ("self", "connector"),
    "nvflare.private.fed.app.simulator.simulator_runner.SimulatorRunner.client_run": (
        "self",
        "server_custom_folder",
        "clients",
        "gpu",
    ),
}
NVFLARE_PRIVATE_MODULE_FUNCTIONS = {  # a private module's function, replaced in that module only
    "nvflare.private.fed.app.simulator.simulator_runner.get_open_ports": ("number",),
    "nvflare.private.fed.app.deployer.simulator_deployer.get_open_ports": ("number",),
    "nvflare.fuel.f3.communicator.load_comm_drivers": (),
}
SIMULATOR_POLLS = {  # fix 10: module -> the functions whose sleeps are capped there
    "nvflare.private.fed.app.simulator.simulator_runner": (
        "simulator_run_main",
        "run_client_thread",
        "_create_connection",
    ),
    "nvflare.private.fed.client.client_runner": ("init_run", "_send_task_result", "_try_send_result_once"),
    "nvflare.private.fed.app.simulator.simulator_worker": ("run", "do_one_task"),  # __main__ in a worker
    "nvflare.fuel.f3.cellnet.connector_manager": ("_get_connector",),  # the listener's "kludge" (its docstring)
}
SIMULATOR_GRACES = {  # fix 11: module -> the functions whose sleeps are capped at SIMULATOR_WORKFLOW_GRACE
    "nvflare.edge.controllers.sage": ("control_flow",),
}


class _Scheduled:
    """A delayed removal on ``STREAM_CLEANUP``; what ``RxTask`` keeps as its ``cleanup_timer`` (``cancel()``)."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def run(self, fn: Callable[[], None]) -> None:
        if not self.cancelled:
            try:
                fn()
            except Exception:  # a stream already gone: nothing left to remove
                pass


STREAM_CLEANUP = DueTimer()  # every finished stream's delayed removal, on one thread per process
ORIGINALS: dict[str, Callable] = {}  # NVFlare's own methods this process replaced, by name


SIMULATOR_SHUTDOWN_GRACE = 0.1  # seconds a simulator process sleeps before its cleanup callbacks (NVFlare: 3)


SIMULATOR_POLL = 0.05  # seconds at most between the simulator's start-up checks (NVFlare: 0.5 to 1; fix 10)
SIMULATOR_WORKFLOW_GRACE = 0.25  # seconds the workflow waits for its leaves after its last task (NVFlare: 1.25; fix 11)


def install_nvflare_fixes() -> None:
    """Fixes 4 and 5, and 7, 8, 10 to 13, 17 and 19 in the simulator's processes; once per process.
    On an NVFlare other than ``TESTED_NVFLARE`` it logs a warning once (a deployment's site may run another
    NVFlare than the machine that submitted the job, whose driver checked its own: ``jobs.nvflare_guard``)."""
    warn_untested_nvflare()
    share_stream_cleanup_thread()
    render_payloads_by_size()
    if in_simulator():
        simulator_ports_outside_ephemeral_range()
        short_simulator_shutdown_grace()
        quick_simulator_polls()
        short_workflow_grace()
        leaves_start_with_server_app()
        distinct_leaf_names()
        quick_listener_stops()
        load_drivers_on_demand()


def warn_untested_nvflare() -> None:
    """One warning per process when the installed NVFlare is not ``TESTED_NVFLARE`` (versions only: cheap)."""
    import importlib.metadata
    import logging

    version = importlib.metadata.version("nvflare")
    if version != TESTED_NVFLARE and "untested NVFlare" not in ORIGINALS:
        ORIGINALS["untested NVFlare"] = warn_untested_nvflare  # once per process, as every fix here
        logging.getLogger(__name__).warning(
            "NVFlare %s is installed; edgesim-flare's fixes to it (the nvflare_private.py modules) were written "
            "against NVFlare %s",
            version,
            TESTED_NVFLARE,
        )


EARLY_SYNC_LINE = "received unknown aux message topic __sync_runner__"  # fix 18: NVFlare's words


class EarlySyncNotice(logging.Filter):
    """Drops NVFlare's ERROR line on a leaf's sync that reached the server before its runner was built (fix 18)
    from the handler it filters (the console); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return EARLY_SYNC_LINE not in record.getMessage()


class _EarlyLeaves:
    """The leaves a simulator run started with its server app (fix 12): the thread that started them (NVFlare's
    ``client_run``, which returns once they have all ended)."""

    def __init__(self, runner, client_run: Callable) -> None:
        # not a daemon (nor, then, the threads NVFlare's client_run starts): were the server app to fail, NVFlare's
        # MPM would find it still running and end the process at once (os._exit), and each worker its own within a
        # second (NVFlare's check_parent_alive); a daemon's threads would be joined at exit, for as long as the
        # workers take to time out (seconds, and their errors on the console)
        self.thread = threading.Thread(target=self._start, args=(runner, client_run), name="leaves-with-server-app")

    @staticmethod
    def _start(runner, client_run: Callable) -> None:
        # NVFlare's order gave the leaves the server app's folder (set first in start_server_app) and its job cell
        while runner.server_custom_folder is None or getattr(runner.server, "job_cell", None) is None:
            time.sleep(0.01)
        client_run(runner, runner.server_custom_folder, runner.federated_clients, None)


def leaves_start_with_server_app() -> None:
    """The simulator starts its leaves' workers while its server app starts, not after (fix 12); idempotent, and
    only where NVFlare's simulator runner is loaded (the simulator's server process)."""
    import sys

    module = sys.modules.get("nvflare.private.fed.app.simulator.simulator_runner")
    if module is None or "SimulatorRunner.start_server_app" in ORIGINALS:
        return
    runner_class = module.SimulatorRunner
    start_server_app = ORIGINALS["SimulatorRunner.start_server_app"] = runner_class.start_server_app
    client_run = ORIGINALS["SimulatorRunner.client_run"] = runner_class.client_run

    def start_server_app_with_leaves(self, args) -> None:
        if not self.args.gpu:  # with GPU groups NVFlare splits the leaves between them: its own order
            self._edgesim_early_leaves = _EarlyLeaves(self, client_run)
            self._edgesim_early_leaves.thread.start()
        start_server_app(self, args)

    def client_run_or_wait(self, server_custom_folder, clients, gpu) -> None:
        early = getattr(self, "_edgesim_early_leaves", None)
        if early is None:
            client_run(self, server_custom_folder, clients, gpu)
        else:  # started with the server app: simulator_run_main waits here for them, as for its own
            early.thread.join()

    runner_class.start_server_app = start_server_app_with_leaves
    runner_class.client_run = client_run_or_wait


class PerThreadBuildContext:
    """``SimulatorClientRunner.build_ctx`` under fix 19: the context the runner was given, as a copy of its own for
    each thread that reads it (shallow, made at its first read: ``do_one_task`` sets only its ``client_name``)."""

    def __get__(self, runner: object, owner: type | None = None) -> dict | PerThreadBuildContext:
        if runner is None:
            return self
        # a runner built before the fix holds the context as its own attribute: copied from now on
        given, threads = runner.__dict__.setdefault(_PER_THREAD, (runner.__dict__.get("build_ctx"), threading.local()))
        if not hasattr(threads, "build_ctx"):
            threads.build_ctx = dict(given)
        return threads.build_ctx

    def __set__(self, runner: object, build_ctx: dict) -> None:
        runner.__dict__[_PER_THREAD] = (build_ctx, threading.local())


_PER_THREAD = "_edgesim_build_ctx"  # where a runner keeps the context it was given and its threads' copies


def distinct_leaf_names() -> None:
    """Each thread of NVFlare's simulator that starts leaves' workers names them in a build context of its own (fix
    19); idempotent, and only where NVFlare's simulator runner is loaded (the simulator's server process).

    Why: ``SimulatorClientRunner.do_one_task`` runs on one thread per leaf; each names its leaf in ``self.build_ctx``,
    one dict for all of them, copies the deploy arguments, then sends that dict to the leaf's new worker, whose
    identity it becomes. Two threads there at once (their polls share NVFlare's 1 s tick) can both send the later
    name: two workers come up as one leaf, the server evicts one of them and the other leaf's updates fail."""
    import sys

    module = sys.modules.get("nvflare.private.fed.app.simulator.simulator_runner")
    if module is None or isinstance(module.SimulatorClientRunner.__dict__.get("build_ctx"), PerThreadBuildContext):
        return
    module.SimulatorClientRunner.build_ctx = PerThreadBuildContext()


class LeafStartFixes(FLComponent):
    """A server component that installs, as it is built, the fixes to how NVFlare's simulator starts its leaves'
    workers: fix 7 (their ports outside the ephemeral range) and fix 19 (each its own name), for a job whose server
    has no component of ours that installs our fixes (a recipe after ``jobs.drop_in.use_fast_simulator``). In a
    SimEnv run NVFlare builds the server app's components before it starts the leaves' workers
    (``SimulatorRunner.simulator_run_main`` waits for the app to have started); elsewhere it does nothing."""

    def __init__(self) -> None:
        super().__init__()
        if in_simulator():
            simulator_ports_outside_ephemeral_range()
            distinct_leaf_names()


def quick_listener_stops() -> None:
    """NVFlare's TCP listeners look for a shutdown every ``SIMULATOR_POLL`` seconds (fix 13); idempotent. Only in
    NVFlare's simulator processes (``install_nvflare_fixes``): a deployed site keeps NVFlare's 0.5 s."""
    from nvflare.fuel.f3.drivers import tcp_driver

    if "TcpDriver.listen" in ORIGINALS:
        return
    ORIGINALS["TcpDriver.listen"] = tcp_driver.TcpDriver.listen

    def listen(self, connector) -> None:  # a copy of TcpDriver.listen (NVFLARE_COPIES), with the poll interval
        self.connector = connector
        self.server = tcp_driver.TcpStreamServer(self, connector)
        self.server.serve_forever(poll_interval=SIMULATOR_POLL)

    tcp_driver.TcpDriver.listen = listen


def load_drivers_on_demand() -> None:
    """NVFlare's transport registers its TCP driver alone, and every other driver only when a connector asks for a
    scheme the TCP driver does not serve (fix 17); idempotent. Only in NVFlare's simulator processes
    (``install_nvflare_fixes``): a deployed site loads every driver at its first connector, as NVFlare does."""
    from nvflare.fuel.f3 import communicator
    from nvflare.fuel.f3.drivers.tcp_driver import TcpDriver

    key = "nvflare.fuel.f3.communicator.load_comm_drivers"
    if key in ORIGINALS:
        return
    load_every_driver = ORIGINALS[key] = communicator.load_comm_drivers
    manager = communicator.driver_mgr
    find = manager.find_driver_class  # NVFlare's, bound to this process's manager
    ours = [scheme.lower() for scheme in TcpDriver.supported_transports()]

    def load_tcp_driver() -> None:
        if find(ours[0]) is None:
            manager.register(TcpDriver)

    def find_driver_class(scheme_or_url: str):
        found = find(scheme_or_url)
        if found is None and "every driver loaded" not in ORIGINALS:
            ORIGINALS["every driver loaded"] = load_every_driver
            for scheme in ours:  # NVFlare's search registers it again (a second registration logs an error)
                if manager.drivers.get(scheme) is TcpDriver:
                    del manager.drivers[scheme]
            load_every_driver()
            found = find(scheme_or_url)
        return found

    communicator.load_comm_drivers = load_tcp_driver
    manager.find_driver_class = find_driver_class


class _CappedSleeps:
    """Stands for the ``time`` module inside one NVFlare module: the same module, except that ``sleep`` called from
    one of ``callers`` (function names of that module) sleeps at most ``cap`` seconds (fix 10)."""

    def __init__(self, callers: tuple[str, ...], cap: float):
        self._callers, self._cap = frozenset(callers), cap

    def __getattr__(self, name: str):
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        import sys

        caller = sys._getframe(1).f_code.co_name  # noqa: SLF001 - the one frame that says who is polling
        time.sleep(min(seconds, self._cap) if caller in self._callers else seconds)


def quick_simulator_polls() -> None:
    """The simulator's start-up polls sleep at most ``SIMULATOR_POLL`` (fix 10), in each module of
    ``SIMULATOR_POLLS`` this process has loaded; idempotent."""

    _cap_sleeps(SIMULATOR_POLLS, SIMULATOR_POLL)


def short_workflow_grace() -> None:
    """The edge workflow's sleep after its last task lasts at most ``SIMULATOR_WORKFLOW_GRACE`` (fix 11);
    idempotent. Call in the simulator's server only (``install_nvflare_fixes`` does)."""
    _cap_sleeps(SIMULATOR_GRACES, SIMULATOR_WORKFLOW_GRACE)


def _cap_sleeps(modules: dict[str, tuple[str, ...]], cap: float) -> None:
    """Give each loaded module of ``modules`` a ``time`` whose ``sleep`` from the named functions lasts at most
    ``cap``; a module already given one keeps it."""
    import sys

    main = sys.modules.get("__main__")
    main_name = getattr(getattr(main, "__spec__", None), "name", None)  # a worker runs as python -m ...
    for name, callers in modules.items():
        module = main if name == main_name else sys.modules.get(name)
        if module is None or not hasattr(module, "time") or isinstance(module.time, _CappedSleeps):
            continue
        module.time = _CappedSleeps(callers, cap)


def short_simulator_shutdown_grace() -> None:
    """``MainProcessMonitor``'s sleep before its cleanup callbacks is at most ``SIMULATOR_SHUTDOWN_GRACE`` (fix 8);
    idempotent. Only for NVFlare's simulator processes (``in_simulator``): a deployed site keeps its grace."""
    from nvflare.fuel.f3.mpm import MainProcessMonitor

    if "MainProcessMonitor._start_shutdown" in ORIGINALS:
        return
    original = MainProcessMonitor._start_shutdown  # noqa: SLF001 - bound to the class: NVFlare's own
    ORIGINALS["MainProcessMonitor._start_shutdown"] = original

    def _start_shutdown(cls, shutdown_grace_time, cleanup_grace_time):
        original(min(shutdown_grace_time, SIMULATOR_SHUTDOWN_GRACE), cleanup_grace_time)

    MainProcessMonitor._start_shutdown = classmethod(_start_shutdown)  # noqa: SLF001 - fix 8


def in_simulator() -> bool:
    """This process is one of NVFlare's simulator processes (the one running its server and client runner, or a
    client worker), not a deployed site's."""
    import sys

    names = {"nvflare.private.fed.app.simulator.simulator_runner", "nvflare.private.fed.app.simulator.simulator_worker"}
    main = getattr(sys.modules.get("__main__"), "__spec__", None)  # a worker runs as python -m ...simulator_worker
    return bool(names & set(sys.modules)) or (main is not None and main.name in names)


def simulator_ports_outside_ephemeral_range() -> None:
    """NVFlare's simulator picks its workers' ports with ``common.ports.listen_ports`` (fix 7); idempotent."""
    from nvflare.private.fed.app.deployer import simulator_deployer
    from nvflare.private.fed.app.simulator import simulator_runner

    from common.ports import listen_ports

    for module in (simulator_runner, simulator_deployer):
        key = f"{module.__name__}.get_open_ports"
        if key not in ORIGINALS:
            ORIGINALS[key] = module.get_open_ports
            module.get_open_ports = listen_ports


def render_payloads_by_size() -> None:
    """``ConsumableBufferList`` (a received payload's chunks) renders as its size, not its bytes (fix 5)."""
    from nvflare.fuel.utils.buffer_list import ConsumableBufferList

    if "ConsumableBufferList.__repr__" in ORIGINALS:
        return
    ORIGINALS["ConsumableBufferList.__repr__"] = ConsumableBufferList.__repr__

    def __repr__(self) -> str:
        return f"<payload of {len(self)} chunk(s), {sum(len(c) for c in self)} bytes>"

    ConsumableBufferList.__repr__ = __repr__


def share_stream_cleanup_thread() -> None:
    """Make every finished stream's delayed removal a call on ``STREAM_CLEANUP`` instead of a ``threading.Timer``
    thread of its own (fix 4). Same delay, same removal; idempotent, once per process."""
    from nvflare.fuel.f3.streaming.byte_receiver import RxTask

    if "RxTask._schedule_remove_task" in ORIGINALS:
        return
    ORIGINALS["RxTask._schedule_remove_task"] = RxTask._schedule_remove_task  # noqa: SLF001

    def _schedule_remove_task(self, ttl: float = None):  # a copy of RxTask._schedule_remove_task (NVFLARE_COPIES)
        with self.stop_lock:
            if self.cleanup_timer:
                return
            scheduled = _Scheduled()
            delay = self.completed_task_ttl if ttl is None else ttl
            STREAM_CLEANUP.call_at(time.time() + delay, scheduled.run, self._remove_task)
            self.cleanup_timer = scheduled

    RxTask._schedule_remove_task = _schedule_remove_task  # noqa: SLF001 - fix 4
