"""Every use of NVFlare's private names in this project, in one place (NVFlare 2.9).

``tests/simulation/test_nvflare_private.py`` fails, naming the name, if an NVFlare upgrade renames or reshapes
any of them, before a run silently changes behaviour. Every NVFlare function whose body a fix copies
(``NVFLARE_COPIES``) or whose behaviour a fix relies on (``NVFLARE_RELIED_ON``: where it sleeps, which branch a
setting takes, what it reads) carries a digest of its source in NVFlare ``TESTED_NVFLARE``;
``simulation.nvflare_guard`` compares them with the installed NVFlare (its test fails naming each function that
changed, and a job on another NVFlare version is warned or refused before it starts). What each fix would need
from NVFlare upstream, so that it can be deleted: ``docs/nvflare-upstream.md``.

1. **No payload rendering.** ``EdgeTaskExecutor._handle_edge_request`` evaluates ``f"received edge request:
   {request}"`` and ``f"Reply to edge: {reply}"`` for every device request, even with debug logging off; each
   renders a whole model or diff with numpy's ``repr`` (most of a leaf's CPU; the measured costs of this and the
   other fixes: ``docs/nvflare-upstream.md``). ``NoPayloadRendering`` overrides the two handlers with the same behaviour minus the rendering; our leaf
   executor uses it, and ``QuietEdgeModelExecutor`` is NVFlare's stock leaf executor with it (``use_fast_simulator``
   puts it in place of a recipe's ``EdgeModelExecutor``).
2. **A built job's apps.** ``FedJob`` keeps each target's app in ``_deploy_map`` and has no public way to replace a
   component it holds; ``use_fast_simulator`` replaces the clients' runner and executor there
   (``client_app_config``, ``server_app_config``), and reaches a recipe's job through ``Recipe._job``
   (``recipe_job``).
3. **The leaves' sync interval.** ``ScatterAndGatherForEdge`` keeps ``update_interval`` and ``assess_interval`` as
   ``_update_interval`` and ``_assess_interval`` (NVFlare exports a component's arguments from those attributes);
   ``set_sync_interval`` changes them on a built job.
4. **One thread for finished streams.** NVFlare streams every aux message (each leaf sync and its reply), and each
   received stream's ``RxTask._schedule_remove_task`` starts a ``threading.Timer`` thread that sleeps 65 s before
   removing the finished stream. A process receiving a few syncs a second thus holds hundreds of idle threads
   (``benchmarks/perf/bench_soak.py``), and a faster protocol would hold thousands. ``share_stream_cleanup_thread`` gives every finished stream's removal, with the
   same delay, to one scheduler thread per process.
5. **No payload rendering in the cell.** ``nvflare.fuel.f3.cellnet.cell.Adapter.call`` evaluates
   ``f"... incoming data={result}"`` for every streamed message, debug logging off or not, where ``result`` is the
   received payload as a ``ConsumableBufferList`` (a ``list`` of byte chunks): the whole payload rendered with
   ``repr``, a large share of the server's CPU in a FedBuff run (py-spy).
   ``ConsumableBufferList`` gets a ``__repr__`` that names its size instead.

``install_nvflare_fixes`` applies 4 and 5 once per process, and 7, 8, 10 to 13 and 17 in NVFlare's simulator
processes;
our server and leaf components call it.
6. **Syncs when there is news, not on a timer.** ``HierarchicalUpdateGatherer._do_task`` is the loop in which a
   leaf (or relay) reports to its parent and takes its reply, then sleeps ``update_interval`` plus up to 0.5 s of
   jitter. Every result of a device thus waited for the next sync, and every selection for the one after: a
   full round trip of sleeps whenever the server waits for a device it just selected. ``EventDrivenSync`` is the
   same loop, except that it sleeps until ``sync_now()`` is called (a device result, a child's report, or the
   parent's wake message) or ``update_interval`` has passed (a heartbeat), and hands each reply to
   ``after_parent_reply`` (a relay then wakes its children).
7. **Simulator worker ports outside the ephemeral range.** NVFlare's simulator gives each client worker process a
   port from ``get_open_ports`` (the kernel's choice, then closed) that the worker binds seconds later; an outgoing
   connection of the run can take it meanwhile (``Address already in use``, a leaf that never starts: seen in CI).
   ``simulator_ports_outside_ephemeral_range`` makes ``simulator_runner`` and ``simulator_deployer`` pick with
   ``common.ports.listen_ports`` (our server component installs it in the simulator's process, before the
   simulator starts its client workers).
8. **A short shutdown grace in the simulator.** ``MainProcessMonitor.run`` ends an NVFlare process by sleeping
   ``shutdown_grace_time`` "to let pending activities finish" before its cleanup callbacks; the simulator's
   server process gets 3 s (hard-coded in ``SimulatorRunner.run_process``), paid by every SimEnv run between its
   server's last log line and its exit. By then the server runner has fired END_RUN, every result is written and
   the client workers have ended. ``short_simulator_shutdown_grace`` caps that sleep at
   ``SIMULATOR_SHUTDOWN_GRACE`` in the simulator's processes only; the cleanup callbacks still run, and are still
   waited for, as before.
9. **The server's engine check.** ``FederatedServer.start_run`` notices that its server runner has finished by
   polling every ``check_engine_frequency`` seconds (3 s, NVFlare's default): on average 1.5 s, up to 3 s, between
   a run's END_RUN and the server's shutdown. ``quick_engine_checks`` sets it to ``SIMULATOR_ENGINE_CHECK`` on the
   simulator's server (each check also sends the job's heartbeat to its parent cell, in the same process there).
   ``tests/simulation/test_nvflare_private.py`` checks the attribute and the loop in NVFlare's source.
10. **Short polls while the simulator starts.** Between a SimEnv run's server being ready and its leaves running,
   NVFlare's simulator sleeps in fixed steps: ``SimulatorRunner.simulator_run_main`` checks every 1 s whether the
   server app has started, ``SimulatorClientRunner.run_client_thread`` sleeps 1 s before it starts a client
   worker, ``SimulatorClientRunner._create_connection`` retries its connection to a starting worker every 1 s,
   and each worker's ``ClientRunner.init_run`` sleeps 0.5 s before each attempt to sync with the server: up to
   3.5 s of every run's start spent asleep. Before those, the server's cell sleeps 0.5 s after it starts its
   internal listener (``ConnectorManager._get_connector``, "Kludge: to wait for listener ready and avoid race"):
   nothing connects to that listener for seconds (the server's job cell is in the same process, the workers
   start after the server app), and a connector that came too early would retry. At the end, each worker
   (``ClientTaskWorker.run``) sleeps the task fetch interval (2 s) after its last task before it asks for the
   next one, END_RUN: the simulator's shutdown waits for it. ``quick_simulator_polls`` gives ``simulator_runner``, ``client_runner``, ``connector_manager`` and
   ``simulator_worker`` a ``time`` whose ``sleep``, called from those functions (``SIMULATOR_POLLS``), sleeps at
   most ``SIMULATOR_POLL``; every other sleep of those modules, and every check, is NVFlare's. A worker asking
   again for a task that is not there yet (``ClientTaskWorker.do_one_task``, 0.5 s) is capped too: that happens
   only at the end, between its last task and END_RUN (our leaves hold one task for the whole run, scheduled
   before they start), where it kept each leaf up to 0.5 s from taking END_RUN. So is a leaf's wait between two
   tries to send its task's last report (``ClientRunner._send_task_result`` and ``_try_send_result_once`` sleep
   ``task_check_interval``, 5 s): under load a report sent as the run ends can time out, and the leaf then slept
   the whole 5 s before it saw the run's abort and took END_RUN, with the server's shutdown waiting for it
   (``bench_fixed_cost.py`` under load).
   Only in the simulator's processes; the
   tests check each function still sleeps there. ``simulation.early_start`` installs these fixes as each
   simulator process reads its logging config, before the server's cell starts, so the first sleeps are short
   too.
11. **A short grace after the workflow.** ``ScatterAndGatherForEdge.control_flow`` sleeps ``update_interval + 1``
   s after its last task "for clients to end gracefully" before the server fires END_RUN: 1.25 s of every run's
   end at our default interval. By then the run's outcome is decided and every version is made; each leaf was told
   to end its task (the workflow's ``end_task`` message) and ends it within a few tens of milliseconds (NVFlare
   drops the task's final report anyway: "task ... is not found"). ``short_workflow_grace`` caps that sleep at
   ``SIMULATOR_WORKFLOW_GRACE`` in the simulator's server (``SIMULATOR_GRACES``; ``--simulator stock`` keeps
   NVFlare's: neither our assessor nor ``simulation.early_start`` installs the fixes there); a deployment keeps
   NVFlare's grace.

12. **The leaves start with the server app, not after it.** ``SimulatorRunner.simulator_run_main`` starts the
   server app on a thread, waits until that app has started (``engine_info.status``: its components built, which
   imports torch and every module of ours the server uses), and only then starts a worker process per leaf: a fresh
   interpreter that imports NVFlare and torch and builds the leaf's app before it first asks the server anything.
   On 2 cores one core was idle for the whole server app build. Each worker's
   first message to the server job is NVFlare's own runner sync (``ClientRunner.init_run``), which it retries
   until the server's runner answers, exactly as a deployed client job does when it starts before the server's.
   ``leaves_start_with_server_app`` replaces ``SimulatorRunner.start_server_app`` with NVFlare's own, run after
   starting a thread that starts the leaves (NVFlare's ``client_run``, the same arguments) as soon as the server
   app's folder is set (``server_custom_folder``) and its job cell exists, the state NVFlare's order gave them;
   ``SimulatorRunner.client_run``, which ``simulator_run_main`` calls once the server app has started, then waits
   for those leaves instead of starting them again. A server app that fails still fails the run at once (NVFlare
   raises; its MPM ends the process, which still runs the thread that started the leaves; each worker exits with
   its parent). Only without ``--gpu`` groups (NVFlare then
   splits the leaves between its GPUs; SimEnv runs never name one); installed by ``simulation.early_start`` as
   the server process reads its log config, before ``simulator_run_main`` starts the app.

13. **Listeners that stop at once in the simulator.** NVFlare's TCP listener (``TcpDriver.listen``) serves with
   ``socketserver``'s ``serve_forever``, which looks for a shutdown every ``poll_interval`` (0.5 s by default);
   stopping the listener (``TcpDriver.shutdown``) waits for that look. The simulator's server stops its cell's
   two listeners in MPM's cleanup, between a run's last version and its exit: py-spy found that cleanup callback
   waiting there (``BaseServer.shutdown``). ``quick_listener_stops`` gives
   ``TcpDriver`` a ``listen`` that is NVFlare's (its three lines) with ``serve_forever(poll_interval=SIMULATOR_POLL)``
   in the simulator's processes; a
   connection is still accepted the moment it arrives (the listener's ``select`` returns at once), and a deployed
   site keeps NVFlare's interval.

14. **Arrays inline in each message.** NVFlare sends each numpy array above a size threshold through a separate
   download transaction (an .npz written, a download request and reply, CRC-checked on the way): an extra round
   trip inside every leaf sync that carries a diff or a model. The application config variable that sets the
   numpy decomposer's chunk size (``INLINE_ARRAYS``, its name made by ``ViaDownloaderDecomposer._config_var_name``)
   set to 0 makes it put the arrays in the message itself (``ViaDownloaderDecomposer.decompose``:
   ``max_chunk_size <= 0``); the job carries it to every site (``jobs.run.recipe``).
15. **Our fixes installed as each simulator process reads its log config.** NVFlare reads a job's logging config
   at the very start of each simulator process (``SimulatorRunner.setup``, ``simulator_worker.main``), before the
   server's cell starts; ``simulation.early_start`` names its filter factory there, so fixes 8 to 13 are in place
   before NVFlare's first sleeps.
16. **NVFlare's job processes, by their command line.** A leaf on a deployment counts this job's client processes
   on its machine (``simulation.leaf_plan``): NVFlare starts each as ``python -m`` ``NVFLARE_CLIENT_JOB_MODULE``
   with ``-n JOB_ID`` (a deployed site) or ``NVFLARE_SIMULATOR_WORKER_MODULE`` with ``-o`` its workspace (SimEnv).
17. **Only the transport driver a simulator run uses.** The first connector or listener a process makes
   (``Communicator.add_connector``, ``start_listener``) calls ``load_comm_drivers``, which imports every module of
   NVFlare's ``drivers`` package to find the drivers in them: the gRPC drivers (gRPC, protobuf) and the aiohttp
   ones, in the simulator's server process and in each leaf's worker, all on a run's start (what it cost:
   ``docs/performance-history.md``, "Start-up, 2026-12-01, later"). The simulator's URLs are all ``tcp://``.
   ``load_drivers_on_demand`` makes ``load_comm_drivers`` register NVFlare's ``TcpDriver`` alone, and gives the
   process's ``driver_mgr`` a ``find_driver_class`` that, for a scheme no registered driver serves, first loads
   every driver as NVFlare does (its ``load_comm_drivers``, after removing the TCP driver it registered so that
   NVFlare's own search registers it again, not twice) and looks again. Only in the simulator's processes
   (``install_nvflare_fixes``, from ``simulation.early_start``, before their first cell); a deployed site loads
   every driver, as NVFlare does.
18. **The early syncs of fix 12, off the console.** A leaf's runner syncs with the server's runner before it
   starts (``ClientRunner.init_run``: the ``__sync_runner__`` aux message, retried every 0.5 s, capped by fix 10,
   until answered OK). With fix 12 the leaves start while the server app is being built, so their first syncs reach
   the server before its ``ServerRunner`` has registered the topic (``_register_aux_message_handler``, in its
   constructor); NVFlare's ``AuxRunner._process_request`` then replies ``TOPIC_UNKNOWN``, which the leaf retries,
   and logs an ERROR ("received unknown aux message topic ``__sync_runner__``"), about three per run, on the
   console of every SimEnv run. Nothing failed: the leaf's next try is answered. Registering the topic earlier
   would need a patch inside NVFlare's server start (the aux runner refuses a second handler for a topic) for no
   gain, so ``EarlySyncNotice``, a logging filter on the console handler of the run's log config
   (``jobs.run.environments.quiet_log_config``), drops exactly that line from the console; NVFlare's log files
   keep it. Any other unknown topic still shows.

Over 400 lines: every private NVFlare name the project uses lives in this one file (the project's rule), each fix
with its reason.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.job_def import ALL_SITES, SERVER_SITE_NAME, JobMetaKey
from nvflare.apis.shareable import ReturnCode, Shareable, make_reply
from nvflare.apis.signal import Signal
from nvflare.edge.constants import EdgeApiStatus, EdgeContextKey, EdgeTaskHeaderKey
from nvflare.edge.controllers.sage import ScatterAndGatherForEdge
from nvflare.edge.executors.edge_model_executor import EdgeModelExecutor
from nvflare.edge.utils import message_topic_for_task_update
from nvflare.edge.web.models.job_response import JobResponse

from simulation.due_timer import DueTimer

if TYPE_CHECKING:  # the recipe's classes: 0.5 s of imports a simulator process never needs (early_start)
    from nvflare.job_config.api import FedJob
    from nvflare.recipe.spec import Recipe

TESTED_NVFLARE = "2.9.0"  # the NVFlare these fixes were written and tested against (pyproject.toml pins it)

# module.Class.function -> digest of its source in TESTED_NVFLARE (``simulation.nvflare_guard.source_digest``)
NVFLARE_COPIES = {  # bodies a fix copies, with its one change (each copy names its original)
    "nvflare.edge.executors.hug.HierarchicalUpdateGatherer._do_task": "9bc74a20b409322f",
    "nvflare.edge.executors.ete.EdgeTaskExecutor._handle_edge_request": "37e246d09f8ceb2f",
    "nvflare.edge.executors.ete.EdgeTaskExecutor._handle_edge_job_request": "2b0675c596a5ff40",
    "nvflare.fuel.f3.drivers.tcp_driver.TcpDriver.listen": "fde878dbc2546e72",
    "nvflare.fuel.f3.streaming.byte_receiver.RxTask._schedule_remove_task": "53ba0fe8e9554ef0",
}
_RUNNER = "nvflare.private.fed.app.simulator.simulator_runner"
_CLIENT_RUNNER = "nvflare.private.fed.client.client_runner.ClientRunner"
_WORKER = "nvflare.private.fed.app.simulator.simulator_worker"
NVFLARE_RELIED_ON = {  # bodies whose behaviour a fix depends on (the fix's number in the module docstring)
    f"{_RUNNER}.SimulatorRunner.setup": "8152f8675112ea51",  # 15
    f"{_RUNNER}.SimulatorRunner.simulator_run_main": "fa7e3a54048f6aed",  # 10, 12
    f"{_RUNNER}.SimulatorRunner.start_server_app": "8e76d39ef6ef8cf1",  # 12
    f"{_RUNNER}.SimulatorRunner.client_run": "81a615e0e20e677e",  # 12
    f"{_RUNNER}.SimulatorClientRunner.run_client_thread": "9bc66407f7717d78",  # 10
    f"{_RUNNER}.SimulatorClientRunner._create_connection": "8f524e5aebaf4004",  # 10
    f"{_RUNNER}.SimulatorClientRunner.do_one_task": "e2d56068a07ad7d9",  # 7, 16
    "nvflare.private.fed.client.client_executor.JobExecutor.start_app": "4502e22529d7b38c",  # 16
    f"{_CLIENT_RUNNER}.init_run": "978a344d246ec91b",  # 10
    f"{_CLIENT_RUNNER}._send_task_result": "5c4591509679bedf",  # 10
    f"{_CLIENT_RUNNER}._try_send_result_once": "907b82638989d9e4",  # 10
    f"{_WORKER}.ClientTaskWorker.run": "2405414767da983e",  # 10
    f"{_WORKER}.ClientTaskWorker.do_one_task": "42a9f55d5a0b1cd0",  # 10
    f"{_WORKER}.main": "c451c07d5f6a1ca7",  # 15
    "nvflare.fuel.f3.cellnet.connector_manager.ConnectorManager._get_connector": "f6ad95d18f315789",  # 10
    "nvflare.edge.controllers.sage.ScatterAndGatherForEdge.control_flow": "00183ad9cc5148e7",  # 11
    "nvflare.fuel.f3.mpm.MainProcessMonitor._start_shutdown": "53a427bd4ebea262",  # 8
    "nvflare.private.fed.server.fed_server.FederatedServer.start_run": "7768d4955024a4c5",  # 9
    "nvflare.fuel.f3.cellnet.cell.Adapter.call": "3209a3399e733866",  # 5
    "nvflare.fuel.utils.fobs.decomposers.via_downloader.ViaDownloaderDecomposer.decompose": "c5511a3d5c57e0ec",  # 14
    "nvflare.fuel.f3.communicator.load_comm_drivers": "b8a9557c78c24eed",  # 17
    "nvflare.fuel.f3.communicator.Communicator.add_connector": "fdae41af3af15e6b",  # 17
    "nvflare.fuel.f3.communicator.Communicator.start_listener": "61f6d7bb757aa688",  # 17
    "nvflare.fuel.f3.drivers.driver_manager.DriverManager.search_folder": "d39768130c7b6013",  # 17
    "nvflare.private.aux_runner.AuxRunner._process_request": "88113aac2d20a961",  # 18
    "nvflare.private.fed.server.server_runner.ServerRunner._register_aux_message_handler": "c1aa0cab2f5328f5",  # 18
}
NVFLARE_CLIENT_JOB_MODULE = "nvflare.private.fed.app.client.worker_process"  # fix 16: one per client per job
NVFLARE_SIMULATOR_WORKER_MODULE = _WORKER  # fix 16: one per SimEnv leaf
INLINE_ARRAYS = {"np_download_chunk_size": 0}  # fix 14: the numpy decomposer's chunk size, as a job config variable

NVFLARE_PRIVATE_OVERRIDES = {
    "nvflare.edge.executors.hug.HierarchicalUpdateGatherer._do_task": ("self", "fl_ctx", "abort_signal"),
    "nvflare.edge.executors.ete.EdgeTaskExecutor._handle_edge_request": (
        "self",
        "event_type",
        "fl_ctx",
        "process_f",
        "no_task_reply",
    ),
    "nvflare.edge.executors.ete.EdgeTaskExecutor._handle_edge_job_request": ("self", "event_type", "fl_ctx"),
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
NVFLARE_PRIVATE_ATTRIBUTES = {
    "nvflare.job_config.api.FedJob": ("_deploy_map",),
    "nvflare.recipe.spec.Recipe": ("_job",),
    "nvflare.edge.controllers.sage.ScatterAndGatherForEdge": ("_update_interval", "_assess_interval"),
    "nvflare.edge.executors.hug.HierarchicalUpdateGatherer": (
        "_pending_task",
        "_task_done",
        "_process_error",
        "_parent_name",
        "_num_children",
        "_updater",
        "_make_update_report",
        "_pending_clients_status",
    ),
}


class NoPayloadRendering:
    """Mixin for an ``EdgeTaskExecutor``: its device-request handlers without rendering requests or replies."""

    def _handle_edge_request(self, event_type: str, fl_ctx: FLContext, process_f, no_task_reply):
        # a copy of EdgeTaskExecutor._handle_edge_request (NVFLARE_COPIES), without its two payload-rendering logs
        task_info = self.get_current_task(fl_ctx)
        if not task_info:
            reply = no_task_reply
        else:
            request = fl_ctx.get_prop(EdgeContextKey.REQUEST_FROM_EDGE)
            reply = process_f(request=request, fl_ctx=fl_ctx, current_task=task_info)
        fl_ctx.set_prop(EdgeContextKey.REPLY_TO_EDGE, reply, private=True, sticky=False)

    def _handle_edge_job_request(self, event_type: str, fl_ctx: FLContext):
        # a copy of EdgeTaskExecutor._handle_edge_job_request (NVFLARE_COPIES), without its payload-rendering log
        job_name = fl_ctx.get_prop(FLContextKey.JOB_META).get(JobMetaKey.JOB_NAME)
        reply = JobResponse(EdgeApiStatus.OK, fl_ctx.get_job_id(), job_name, job_data={})
        fl_ctx.set_prop(EdgeContextKey.REPLY_TO_EDGE, reply, private=True, sticky=False)


class EventDrivenSync:
    """Mixin for a ``HierarchicalUpdateGatherer`` (an edge executor): its sync loop (``_do_task``), waking when a
    sync is asked for instead of sleeping a fixed interval (see the module docstring, 6). The class sets
    ``self.sync_cond = threading.Condition()`` and ``self.sync_due = math.inf`` in its constructor."""

    sync_cond: threading.Condition
    sync_due: float

    def sync_now(self) -> None:
        """Report to the parent at once (there is something to send, or news to fetch)."""
        self.sync_soon(0.0)

    def sync_soon(self, delay: float) -> None:
        """Report to the parent within ``delay`` seconds (what else arrives by then goes in the same report)."""
        with self.sync_cond:
            self.sync_due = min(self.sync_due, time.monotonic() + delay)
            self.sync_cond.notify()

    def _wait_for_sync(self, interval: float) -> None:
        """Until a sync is due, or ``interval`` (the heartbeat) has passed."""
        heartbeat = time.monotonic() + interval
        with self.sync_cond:
            while (due := min(self.sync_due, heartbeat)) > time.monotonic():
                self.sync_cond.wait(due - time.monotonic())
            self.sync_due = math.inf

    def after_parent_reply(self, changed: bool, fl_ctx: FLContext) -> None:
        """Called with what ``process_parent_update_reply`` returned, after each reply."""

    def _do_task(self, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        # a copy of HierarchicalUpdateGatherer._do_task (NVFLARE_COPIES), with its sleep replaced by the event
        task_info = self._pending_task
        update_interval = task_info.update_interval
        engine = fl_ctx.get_engine()
        while not (self._task_done or self._process_error):
            report = self._make_update_report(task_info, fl_ctx)
            replies = engine.send_aux_request(
                targets=self._parent_name,
                topic=message_topic_for_task_update(task_info.name),
                request=report,
                timeout=self.update_timeout,
                fl_ctx=fl_ctx,
            )
            if len(replies) != 1:
                self.log_error(fl_ctx, f"no reply from parent {self._parent_name}")
                self._process_error = True
                break
            reply = next(iter(replies.values()))
            if not isinstance(reply, Shareable):
                self.log_error(fl_ctx, f"bad reply from parent {self._parent_name}: {type(reply)}")
                self._process_error = True
                break
            rc = reply.get_return_code()
            if rc == ReturnCode.TASK_ABORTED:
                self.log_info(fl_ctx, f"task {task_info.seq} is done: parent task is gone")
                break
            if rc != ReturnCode.OK:
                if not (rc == ReturnCode.TIMEOUT and self._task_done):
                    self.log_error(fl_ctx, f"error updating parent {self._parent_name}: {rc}")
                break
            if reply.get_header(EdgeTaskHeaderKey.TASK_SEQ, task_info.seq) != task_info.seq:
                self.log_info(fl_ctx, f"task {task_info.seq} is done: the parent moved on")
                break
            if self._num_children > 0 and self._pending_clients_status()[0] >= self._num_children:
                self.log_info(fl_ctx, f"task {task_info.seq} is done: all child clients are done")
                break
            try:
                changed = self._updater.process_parent_update_reply(reply, fl_ctx)
            except Exception as ex:
                self.log_exception(fl_ctx, f"processing the parent's reply failed: {ex}")
            else:
                self.after_parent_reply(bool(changed), fl_ctx)
            if abort_signal.triggered:
                return make_reply(ReturnCode.TASK_ABORTED)
            self._wait_for_sync(update_interval)
        if self._process_error:
            return make_reply(ReturnCode.EXECUTION_EXCEPTION)
        return self._make_update_report(task_info, fl_ctx)


class QuietEdgeModelExecutor(NoPayloadRendering, EdgeModelExecutor):
    """NVFlare's stock leaf executor (``EdgeModelExecutor``: summing aggregators, the newest model), without
    rendering payloads. Same arguments."""


def recipe_job(recipe: Recipe) -> FedJob:
    """The job a recipe builds (and runs)."""
    return recipe._job  # noqa: SLF001 - see the module docstring (2)


def _apps(job: FedJob) -> dict:
    return job._deploy_map  # noqa: SLF001 - see the module docstring (2)


def client_app_config(job: FedJob):
    """The ``ClientAppConfig`` every client runs (``components``: id -> component; ``executors``)."""
    app = _apps(job).get(ALL_SITES)
    if app is None:
        raise ValueError(
            "the job has no app for all clients (@ALL): configure its clients and its device simulation "
            "first (EdgeJob.configure_client, EdgeJob.configure_simulation)"
        )
    return app.app_config


def server_app_config(job: FedJob):
    """The ``ServerAppConfig`` of the server (``components``; ``workflows``)."""
    app = _apps(job).get(SERVER_SITE_NAME)
    if app is None:
        raise ValueError("the job has no server app")
    return app.app_config


def set_sync_interval(controller: ScatterAndGatherForEdge, update_interval: float) -> None:
    """Leaves sync with their parents every ``update_interval`` seconds; the server assesses at least as often."""
    controller._update_interval = update_interval  # noqa: SLF001 - see the module docstring (3)
    controller._assess_interval = min(controller._assess_interval, update_interval)  # noqa: SLF001


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
SIMULATOR_ENGINE_CHECK = 0.25  # seconds between the simulator server's checks for a finished run (NVFlare: 3)


SIMULATOR_POLL = 0.05  # seconds at most between the simulator's start-up checks (NVFlare: 0.5 to 1; fix 10)
SIMULATOR_WORKFLOW_GRACE = 0.25  # seconds the workflow waits for its leaves after its last task (NVFlare: 1.25; fix 11)


def install_nvflare_fixes() -> None:
    """Fixes 4 and 5 of the module docstring, and 7, 8 and 10 to 13 in the simulator's processes; once per process.
    On an NVFlare other than ``TESTED_NVFLARE`` it logs a warning once (a deployment's site may run another
    NVFlare than the machine that submitted the job, whose driver checked its own: ``simulation.nvflare_guard``)."""
    warn_untested_nvflare()
    share_stream_cleanup_thread()
    render_payloads_by_size()
    if in_simulator():
        simulator_ports_outside_ephemeral_range()
        short_simulator_shutdown_grace()
        quick_simulator_polls()
        short_workflow_grace()
        leaves_start_with_server_app()
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
            "NVFlare %s is installed; edgesim-flare's fixes to it (simulation/nvflare_private.py) were written "
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


def quick_engine_checks(engine) -> None:
    """The simulator's server checks every ``SIMULATOR_ENGINE_CHECK`` seconds whether its run has finished (fix 9);
    a no-op outside the simulator, or for an engine without NVFlare's ``FederatedServer``. Call at START_RUN."""
    server = getattr(engine, "server", None)
    if in_simulator() and server is not None and hasattr(server, "check_engine_frequency"):
        server.check_engine_frequency = min(server.check_engine_frequency, SIMULATOR_ENGINE_CHECK)


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

    MainProcessMonitor._start_shutdown = classmethod(_start_shutdown)  # noqa: SLF001 - see the docstring (8)


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
    thread of its own (see the module docstring, 4). Same delay, same removal; idempotent, once per process."""
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

    RxTask._schedule_remove_task = _schedule_remove_task  # noqa: SLF001 - see the module docstring (4)
