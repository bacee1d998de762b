"""Fixes 12 and 13 of common/nvflare_private.py: NVFlare's simulator starts the leaves' workers with its server
app, not after it, and its listeners stop without waiting out a poll. What each relies on in NVFlare's source, and
what it does on NVFlare's own classes (the parts around it standing in); the e2e tests run them for real."""

import inspect
import threading
import time

from common.nvflare_private import ORIGINALS, leaves_start_with_server_app, quick_listener_stops


def test_nvflare_starts_the_leaves_after_the_server_app_where_fix_12_hooks_in():
    """Fix 12 relies on NVFlare's order: ``simulator_run_main`` starts ``start_server_app`` on a thread, waits for
    the app to be started, then calls ``client_run`` (through its executor); ``start_server_app`` sets the app's
    folder, then creates the server's job cell, then builds and starts the app."""
    from nvflare.private.fed.app.simulator import simulator_runner

    runner = simulator_runner.SimulatorRunner
    main = inspect.getsource(runner.simulator_run_main)
    thread = main.index("threading.Thread(target=self.start_server_app")
    wait = main.index("while self.server.engine.engine_info.status != MachineStatus.STARTED")
    assert thread < wait < main.index("self.client_run(*p)") < main.index("self.server.abort_run()")
    start = inspect.getsource(ORIGINALS.get("SimulatorRunner.start_server_app", runner.start_server_app))
    folder = start.index("self.server_custom_folder = ")
    cell = start.index("self.server.job_cell = self.server.create_job_cell(")
    assert folder < cell < start.index("server_app_runner.start_server_app(")
    assert "SimulatorClientRunner(" in inspect.getsource(ORIGINALS.get("SimulatorRunner.client_run", runner.client_run))


def test_the_leaves_start_once_with_the_server_app_and_the_runner_waits_for_them(monkeypatch):
    """Fix 12 on NVFlare's ``SimulatorRunner`` (its two methods standing in): the leaves start (once) as soon as
    the server app's folder and job cell exist, while the app is still starting; ``client_run`` then waits for
    them. With GPU groups, NVFlare's own order."""
    from nvflare.private.fed.app.simulator import simulator_runner

    runner_class = simulator_runner.SimulatorRunner
    events = []
    leaves_started = threading.Event()

    def start_server_app(self, args):  # NVFlare's order (the previous test): folder, job cell, then the app
        self.server_custom_folder = "/app_server/custom"
        self.server.job_cell = "job cell"
        events.append("job cell")
        leaves_started.wait(1.0)  # building the app (torch's import, our components): the leaves start meanwhile
        events.append("app started")

    def client_run(self, server_custom_folder, clients, gpu):
        events.append(("leaves", server_custom_folder, tuple(clients), gpu))
        leaves_started.set()
        time.sleep(0.2)  # the leaves run
        events.append("leaves ended")

    from common import nvflare_private

    originals = {}  # NVFlare's methods as this process keeps them, untouched by the test
    monkeypatch.setattr(nvflare_private, "ORIGINALS", originals)
    for name, method in (("start_server_app", start_server_app), ("client_run", client_run)):
        monkeypatch.setattr(runner_class, name, method)
    leaves_start_with_server_app()
    leaves_start_with_server_app()  # idempotent
    assert originals == {"SimulatorRunner.start_server_app": start_server_app, "SimulatorRunner.client_run": client_run}

    def run(gpu: str | None) -> list:
        """What simulator_run_main does: the server app on a thread, then (once it has started) client_run."""
        events.clear()
        leaves_started.clear()
        runner = runner_class.__new__(runner_class)
        runner.args = type("Args", (), {"gpu": gpu})()
        runner.server = type("Server", (), {})()
        runner.server_custom_folder, runner.federated_clients = None, ["site-1", "site-2"]
        server_thread = threading.Thread(target=runner.start_server_app, args=[runner.args])
        server_thread.start()
        server_thread.join()
        runner.client_run(runner.server_custom_folder, runner.federated_clients, gpu)
        return list(events)

    leaves = ("leaves", "/app_server/custom", ("site-1", "site-2"))
    found = run(None)  # the leaves started while the app started, once; client_run returned once they ended
    assert found[:2] == ["job cell", (*leaves, None)] and found.count("leaves ended") == 1
    assert found[-1] in ("leaves ended", "app started") and len(found) == 4
    assert run("0,1") == ["job cell", "app started", (*leaves, "0,1"), "leaves ended"]


def test_the_simulators_listeners_stop_at_once_and_still_accept_at_once(monkeypatch):
    """Fix 13 on NVFlare's own ``TcpDriver`` and ``TcpStreamServer`` (a plain connection handler standing in for
    NVFlare's cell's): NVFlare's ``listen`` is the three lines the fix repeats; with the fix a listener serves
    looking for a shutdown every ``SIMULATOR_POLL`` seconds (NVFlare's: 0.5), accepts connections and stops;
    idempotent."""
    import socket
    import socketserver
    import textwrap

    from nvflare.fuel.f3.drivers import tcp_driver

    from common import nvflare_private

    listen = textwrap.dedent(inspect.getsource(ORIGINALS.get("TcpDriver.listen", tcp_driver.TcpDriver.listen)))
    assert [line.strip() for line in listen.splitlines()[1:] if line.strip()] == [
        "self.connector = connector",
        "self.server = TcpStreamServer(self, connector)",
        "self.server.serve_forever()",
    ]
    assert "self.server.shutdown()" in inspect.getsource(tcp_driver.TcpDriver.shutdown)
    monkeypatch.setattr(nvflare_private, "ORIGINALS", {})
    monkeypatch.setattr(tcp_driver.TcpDriver, "listen", tcp_driver.TcpDriver.listen)
    quick_listener_stops()
    quick_listener_stops()
    accepted = threading.Event()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            accepted.set()

    polls = []

    class Server(tcp_driver.TcpStreamServer):
        def __init__(self, driver, connector):  # NVFlare's binds the connector's address; this one any free port
            socketserver.TCPServer.__init__(self, ("127.0.0.1", 0), Handler)

        def serve_forever(self, poll_interval=0.5):
            polls.append(poll_interval)
            super().serve_forever(poll_interval)

    monkeypatch.setattr(tcp_driver, "TcpStreamServer", Server)
    driver = tcp_driver.TcpDriver()
    thread = threading.Thread(target=driver.listen, args=["connector"])
    thread.start()
    try:
        while driver.server is None:
            time.sleep(0.01)
        with socket.create_connection(driver.server.server_address, timeout=5):
            assert accepted.wait(5)
        driver.server.shutdown()  # what TcpDriver.shutdown calls: it waits for the listener's next look
        thread.join(5)
        assert not thread.is_alive() and polls == [nvflare_private.SIMULATOR_POLL]
    finally:
        driver.server.shutdown()
        driver.server.server_close()
        thread.join(5)
