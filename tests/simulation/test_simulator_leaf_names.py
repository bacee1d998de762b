"""Fix 19 of common/nvflare_private.py: two leaves that NVFlare's simulator starts together never share a name.

NVFlare's ``SimulatorClientRunner.do_one_task`` runs on one thread per leaf (SimEnv's ``num_threads``); each names
its leaf in the one build context all those threads share (``self.build_ctx["client_name"] = ...``), then sends
that context to the leaf's new worker process, which takes its identity from it. These tests run NVFlare's own
``do_one_task`` for two leaves at once, with the worker processes and their connections standing in; the e2e test
(``tests/e2e/test_bring_your_own.py``) runs it for real.
"""

from __future__ import annotations

import inspect
import pickle
import threading
import types

from nvflare.private.fed.simulator.simulator_const import SimulatorConstants

from common import nvflare_private
from common.nvflare_private import ORIGINALS, LeafStartFixes, distinct_leaf_names
from common.ports import listen_ports

LEAVES = ("site-1", "site-2")


class Worker:
    """A leaf's worker process that has not exited: NVFlare's runner polls it, then ends it."""

    def poll(self) -> None:
        return None

    def terminate(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        return 0


class Connection:
    """The runner's end of a worker's connection: keeps what the worker would receive; the worker's answer is
    "stop" (its task ended the run), as after a leaf's last task."""

    def __init__(self) -> None:
        self.received: list = []
        self.replies = [True, None]  # stop_run, then the name of the client that ended the run

    def send(self, data) -> None:
        self.received.append(pickle.loads(pickle.dumps(data)))  # what crosses to the worker, as it was at send

    def recv(self):
        return self.replies.pop(0)


class DeployArgs(types.SimpleNamespace):
    """NVFlare's deploy arguments, which ``do_one_task`` copies between naming the leaf and sending its context:
    each copy waits (briefly) for the other leaf's thread to get there too, as two threads may on a busy machine."""

    both_naming = threading.Barrier(len(LEAVES), timeout=5.0)

    def __deepcopy__(self, memo) -> DeployArgs:
        try:
            self.both_naming.wait()
        except threading.BrokenBarrierError:  # a runner that lets one leaf through at a time: nothing to wait for
            pass
        return DeployArgs(**vars(self))


def run_leaves_together(monkeypatch, tmp_path) -> dict[str, str]:
    """NVFlare's ``do_one_task`` for both leaves at once, each on its own thread as ``run_client_thread`` runs it;
    returns, per leaf, the client name its worker was sent."""
    from nvflare.private.fed.app.simulator import simulator_runner

    monkeypatch.setattr(simulator_runner, "get_open_ports", lambda number: [10000])
    monkeypatch.setattr(
        simulator_runner, "subprocess", types.SimpleNamespace(Popen=lambda *a, **k: Worker(), TimeoutExpired=Exception)
    )
    DeployArgs.both_naming.reset()
    for leaf in LEAVES:
        for folder in ("startup", "local"):  # each leaf's workspace, as NVFlare's deployer made it
            (tmp_path / leaf / folder).mkdir(parents=True)
    args = types.SimpleNamespace(workspace=str(tmp_path), log_config="log_config.json", set=[])
    build_ctx = {"client_name": LEAVES[-1], "client_components": {}}  # as the last client NVFlare created left it
    runner = simulator_runner.SimulatorClientRunner(
        str(tmp_path / "no_server_custom"), args, [], {}, DeployArgs(workspace=str(tmp_path)), build_ctx
    )
    cell = types.SimpleNamespace(get_root_url_for_child=lambda: "tcp://root", get_internal_listener_url=lambda: "")
    clients = [types.SimpleNamespace(client_name=leaf, token="t", cell=cell) for leaf in LEAVES]
    runner.federated_clients = clients
    connections = {leaf: Connection() for leaf in LEAVES}
    thread_leaf = threading.local()  # each thread's connection is to its own leaf's worker
    runner._create_connection = lambda port, timeout: connections[thread_leaf.name]  # noqa: SLF001 - stands in

    errors = []

    def run(client) -> None:
        thread_leaf.name = client.client_name
        try:
            runner.do_one_task(client, len(LEAVES), None, threading.Lock())
        except Exception as e:  # raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(client,)) for client in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads) and errors == []
    return {leaf: c.received[0][SimulatorConstants.BUILD_CTX]["client_name"] for leaf, c in connections.items()}


def test_nvflare_names_each_leaf_in_one_shared_build_context_before_sending_it():
    """Where fix 19 hooks in: ``do_one_task`` names the leaf in ``self.build_ctx``, the runner's one context
    for every leaf, copies the deploy arguments, then sends the context to the leaf's worker."""
    from nvflare.private.fed.app.simulator import simulator_runner

    source = inspect.getsource(simulator_runner.SimulatorClientRunner.do_one_task)
    named = source.index('self.build_ctx["client_name"] = client.client_name')
    copied = source.index("copy.deepcopy(self.deploy_args)")
    sent = source.index("conn.send(data)")
    assert named < copied < sent and "SimulatorConstants.BUILD_CTX: self.build_ctx" in source
    init = inspect.getsource(simulator_runner.SimulatorClientRunner.__init__)
    assert "self.build_ctx = build_ctx" in init


def test_two_leaves_started_together_never_share_a_name(monkeypatch, tmp_path):
    from nvflare.private.fed.app.simulator import simulator_runner  # noqa: F401 - the runner's process

    distinct_leaf_names()
    distinct_leaf_names()  # idempotent
    assert run_leaves_together(monkeypatch, tmp_path) == {"site-1": "site-1", "site-2": "site-2"}


def test_nvflares_own_runner_sends_two_leaves_started_together_one_name(monkeypatch, tmp_path):
    """Why fix 19: without it both workers are sent the name the later thread wrote (in the failed CI run,
    site-1's worker came up as site-2). Should NVFlare fix this upstream, this test fails: the fix can go."""
    from nvflare.private.fed.app.simulator import simulator_runner

    monkeypatch.delattr(simulator_runner.SimulatorClientRunner, "build_ctx", raising=False)  # NVFlare's attribute
    names = run_leaves_together(monkeypatch, tmp_path)
    assert len(set(names.values())) == 1


def test_the_drop_ins_server_component_installs_both_leaf_start_fixes_in_the_simulator(monkeypatch, tmp_path):
    """``LeafStartFixes`` (the server component ``use_fast_simulator`` adds, the one fix-installer of a user's
    server): built in the simulator's process, each leaf's worker gets its own name (fix 19) and a port from
    ``listen_ports`` (fix 7); built elsewhere (a deployed site), it changes nothing."""
    from nvflare.fuel.utils import network_utils
    from nvflare.private.fed.app.simulator import simulator_runner

    key = f"{simulator_runner.__name__}.get_open_ports"
    monkeypatch.delattr(simulator_runner.SimulatorClientRunner, "build_ctx", raising=False)  # NVFlare's own, both
    monkeypatch.setattr(simulator_runner, "get_open_ports", network_utils.get_open_ports)
    monkeypatch.delitem(ORIGINALS, key, raising=False)
    monkeypatch.setattr(nvflare_private, "in_simulator", lambda: False)
    LeafStartFixes()
    assert simulator_runner.get_open_ports is network_utils.get_open_ports
    assert "build_ctx" not in simulator_runner.SimulatorClientRunner.__dict__
    monkeypatch.setattr(nvflare_private, "in_simulator", lambda: True)
    LeafStartFixes()
    assert simulator_runner.get_open_ports is listen_ports
    assert run_leaves_together(monkeypatch, tmp_path) == {"site-1": "site-1", "site-2": "site-2"}
