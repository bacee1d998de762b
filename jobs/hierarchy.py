"""A provisioned NVFlare edge hierarchy on this machine: provision it, start it, wait for it, stop it.

It is what ``python -m jobs.deploy up|down`` runs, and what the hierarchy test stands up. Everything goes through
NVFlare's own tooling:

* provisioning: the lighter's Python API (``prepare_project`` / ``Provisioner``) with NVFlare's edge builder, on a
  project with explicit participants, so every port is ours to choose (the edge template's ports are fixed): a
  server, ``relays`` relays, and ``leaves / relays`` leaf clients below each relay (``lcp_only``: leaves report
  straight to the server through their relay);
* ``nvflare.lighter.utils.update_storage_locations``: the job and snapshot stores go inside the deployment
  folder instead of NVFlare's shared ``/tmp/nvflare/...``, so two deployments never share jobs;
* each site's own ``startup/sub_start.sh --once`` (no restart loop), in a session of its own, with its console
  in ``<site>/console.log`` and NVFlare's INFO logging in the site's log files only;
* the admin Session API: wait until every leaf client is connected; ``shutdown("all")`` to stop;
* with ``proxy``: NVFlare's routing proxy for real edge devices (``jobs.device_proxy``, on loopback), in a session
  of its own like a site's, routing each device to a leaf's edge API by the LCP map it writes in the folder.

``deployment.json`` in the folder records what was started (the sites' and the proxy's sessions), so ``stop``
finds and ends every process of the deployment, job processes included, even when the admin API cannot.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass

import psutil
import yaml

from common.ports import listen_ports
from jobs.device_proxy import LOOPBACK, write_lcp_map

ADMIN = "admin@nvidia.com"
STATE_FILE = "deployment.json"
PROJECT = "edgesim"
PROXY = "proxy"  # the proxy's key in ``Deployment.sessions`` (no site is named so)
LCP_MAP_FILE = "lcp_map.json"
PROJECT_FILE = "project.yml"
EDGE_RESOURCES = "edge__p_resources.json"  # a leaf's edge API settings, written by NVFlare's edge builder
PROXY_LOG = "proxy.log"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Deployment:
    """What ``start`` stood up (``deployment.json``).

    Attributes:
        folder: the deployment's folder.
        prod_dir: the provisioned kits (``<folder>/<project>/prod_00``).
        admin_kit: the admin's startup kit: ``--startup-kit`` of ``--env prod``.
        leaves: the leaf clients' names.
        ports: port by role (``server``, ``admin``, each relay's and each leaf's).
        sessions: each site's process session id (every process a site starts stays in it), and the proxy's.
        proxy_port: the routing proxy's HTTP port on loopback, or None without one (and in older
            ``deployment.json`` files, which lack the field).
    """

    folder: str
    prod_dir: str
    admin_kit: str
    leaves: list[str]
    ports: dict[str, int]
    sessions: dict[str, int]
    proxy_port: int | None = None

    @property
    def proxy_endpoint(self) -> str | None:
        """The URL devices connect to, or None without a proxy."""
        return None if self.proxy_port is None else f"http://{LOOPBACK}:{self.proxy_port}/"

    @property
    def lcp_map_file(self) -> str:
        """The proxy's LCP map (written when the proxy starts)."""
        return os.path.join(self.folder, LCP_MAP_FILE)

    @property
    def ca_cert(self) -> str:
        """The deployment's root CA certificate, which signed the leaves' edge API certificates (every site's
        startup kit holds a copy; the server's always exists)."""
        return os.path.join(self.prod_dir, "server", "startup", "rootCA.pem")

    @property
    def job_flags(self) -> list[str]:
        """The flags that point a job at this deployment."""
        return [
            "--env",
            "prod",
            "--startup-kit",
            self.admin_kit,
            "--username",
            ADMIN,
            "--num-leaf-nodes",
            str(len(self.leaves)),
        ]

    def save(self) -> None:
        with open(os.path.join(self.folder, STATE_FILE), "w") as f:
            json.dump(asdict(self), f, indent=1)

    @classmethod
    def load(cls, folder: str) -> Deployment:
        path = os.path.join(folder, STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{folder} holds no {STATE_FILE}: it is not a deployment started by jobs.deploy")
        with open(path) as f:
            return cls(**json.load(f))


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on this machine now, below the ephemeral range (``common.ports``); they stay free
    unless another program takes them before the sites start, which a retry of ``start`` fixes."""
    return listen_ports(n)


def site_names(relays: int, leaves: int) -> tuple[list[str], list[str]]:
    """The relays ``R1..`` and the leaves ``C11, C12, .. C21 ..`` of a project (``leaves / relays`` per relay)."""
    if relays < 1 or leaves < relays or leaves % relays:
        raise ValueError(f"--leaves ({leaves}) must be a positive multiple of --relays ({relays})")
    per_relay = leaves // relays
    if per_relay > 9 or relays > 9:
        raise ValueError("at most 9 relays and 9 leaves per relay (site names C<relay><leaf>)")
    names = [f"C{r}{c}" for r in range(1, relays + 1) for c in range(1, per_relay + 1)]
    return [f"R{r}" for r in range(1, relays + 1)], names


def project_dict(
    relays: int, leaves: int, ports: list[int], hosts: dict[str, str] | None = None
) -> tuple[dict, dict[str, int], list[str]]:
    """The provisioning project: server, relays ``R1..``, leaves ``C11, C12, .. C21 ..`` (``lcp_only``).

    ``hosts`` gives each site's host name or address (``server``, ``R1``, ``C11``, ...); without it every site is on
    this machine (``localhost``, certificates naming ``127.0.0.1`` too). The leaves reach their relay over mutual
    TLS (NVFlare's relay default is clear TCP), as they reach the server."""
    relay_names, names = site_names(relays, leaves)

    def host(site: str) -> str:
        return hosts[site] if hosts else "localhost"

    def host_names(site: str) -> list[str]:
        # a certificate naming 127.0.0.1 too lets the routing proxy's LCP map address a local leaf by IP
        return [host(site)] if hosts else ["localhost", LOOPBACK]

    it = iter(ports)
    used = {"server": next(it), "admin": next(it)}
    participants = [
        dict(
            name="server",
            type="server",
            org="edgesim",
            fed_learn_port=used["server"],
            admin_port=used["admin"],
            host_names=host_names("server"),
            default_host=host("server"),
        )
    ]
    for r, relay in enumerate(relay_names, start=1):
        used[relay] = next(it)
        participants.append(
            dict(
                name=relay,
                type="relay",
                org="edgesim",
                listening_host={
                    "default_host": host(relay),
                    "host_names": host_names(relay),
                    "port": used[relay],
                    "connection_security": "mtls",
                },
            )
        )
        for leaf in (n for n in names if n.startswith(f"C{r}")):
            used[leaf] = next(it)
            participants.append(
                dict(
                    name=leaf,
                    type="client",
                    org="edgesim",
                    connect_to={"name": relay},
                    # the leaf's certificate also serves its edge API (TLS), which devices reach through the proxy
                    listening_host={"default_host": host(leaf), "host_names": host_names(leaf)},
                    edge_service_port=used[leaf],
                )
            )
    participants.append(dict(name=ADMIN, type="admin", org="edgesim", role="project_admin"))
    project = {
        "api_version": 3,
        "name": PROJECT,
        "description": "edgesim-flare local edge hierarchy",
        "participants": participants,
        "builders": [
            {
                "path": "nvflare.lighter.impl.workspace.WorkspaceBuilder",
                "args": {"template_file": ["master_template.yml"]},
            },
            {"path": "nvflare.lighter.impl.static_file.StaticFileBuilder", "args": {"config_folder": "config"}},
            {"path": "nvflare.lighter.impl.cert.CertBuilder"},
            {"path": "nvflare.lighter.impl.signature.SignatureBuilder"},
            {"path": "nvflare.lighter.impl.edge.EdgeBuilder"},
        ],
    }
    return project, used, names


def provision(
    folder: str,
    relays: int,
    leaves: int,
    hosts: dict[str, str] | None = None,
    ports: list[int] | None = None,
) -> tuple[str, dict[str, int], list[str]]:
    """Provision the kits under ``folder`` (``project_dict``: on this machine, or on ``hosts`` with ``ports``), its
    project also written as ``folder/project.yml``; returns (prod dir, ports, leaf names). Each leaf's edge API listens on its own host only (NVFlare's edge
    builder binds it to every interface)."""
    from nvflare.lighter.constants import CtxKey
    from nvflare.lighter.prov_utils import prepare_builders, prepare_packager
    from nvflare.lighter.provision import prepare_project
    from nvflare.lighter.provisioner import Provisioner

    project, used, names = project_dict(relays, leaves, ports or free_ports(2 + relays + leaves), hosts)
    with open(os.path.join(folder, PROJECT_FILE), "w") as f:  # NVFlare's project file: `nvflare provision -p`
        yaml.safe_dump(project, f, sort_keys=False)
    with open(os.path.join(folder, "provision.log"), "w") as log, contextlib.redirect_stdout(log):  # its summary
        ctx = Provisioner(folder, prepare_builders(project), prepare_packager(project)).provision(
            prepare_project(project)
        )
    if ctx.get(CtxKey.BUILD_ERROR):
        raise RuntimeError(f"NVFlare's provisioning failed: {ctx.get(CtxKey.ERRORS)}")
    prod = ctx.get_result_location()
    for leaf in names:
        bind_edge_api(os.path.join(prod, leaf), hosts[leaf] if hosts else LOOPBACK)
    keep_storage_in(os.path.join(prod, "server"), os.path.join(folder, "storage") if not hosts else None)
    return prod, used, names


def bind_edge_api(leaf_dir: str, host: str) -> None:
    """The leaf's edge API (``local/edge__p_resources.json``, NVFlare's ``ApiService``) listens on ``host`` only."""
    path = os.path.join(leaf_dir, "local", EDGE_RESOURCES)
    with open(path) as f:
        resources = json.load(f)
    for component in resources["components"]:
        if component["id"] == "api_service":
            component["args"]["host"] = host
    with open(path, "w") as f:
        json.dump(resources, f, indent=2)


def keep_storage_in(server_dir: str, storage: str | None = None) -> None:
    """The server's job and snapshot stores under ``storage`` (default: ``<server kit>/storage``), not NVFlare's
    shared ``/tmp/nvflare/...``: two deployments never share jobs, and a copied kit keeps its jobs with it."""
    from nvflare.lighter.utils import update_storage_locations

    update_storage_locations(
        local_dir=os.path.join(server_dir, "local"), workspace=storage or os.path.join(server_dir, "storage")
    )


def quiet_site_logging(site_dir: str) -> None:
    """NVFlare's default site logging with the console at WARNING (INFO stays in the site's log files)."""
    local = os.path.join(site_dir, "local")
    with open(os.path.join(local, "log_config.json.default")) as f:
        config = json.load(f)
    config["handlers"]["consoleHandler"]["level"] = "WARNING"
    with open(os.path.join(local, "log_config.json"), "w") as f:
        json.dump(config, f, indent=1)


def start_in_session(command: list[str], cwd: str, log_path: str, env: dict[str, str]) -> int:
    """Start ``command`` in a new session (every process it starts stays in it), its output appended to
    ``log_path``; its session id."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid  # a new session's leader: its pid is the session id


def start_site(site_dir: str) -> int:
    """Start one site in the foreground mode of its own start script, in a new session; its session id."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # the scripts run python3
    command = ["bash", os.path.join(site_dir, "startup", "sub_start.sh"), "--once"]
    return start_in_session(command, site_dir, os.path.join(site_dir, "console.log"), env)


@contextlib.contextmanager
def admin_session(admin_kit: str, timeout: float = 5.0):
    """An admin Session, always closed (an unclosed one keeps the interpreter from exiting); NVFlare's prints to
    stdout while it is open are dropped."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    with contextlib.redirect_stdout(io.StringIO()):  # "Connecting to FLARE ..." on every (re)connection
        session = new_secure_session(ADMIN, admin_kit, timeout=timeout)
        try:
            yield session
        finally:
            session.close()


def wait_for_leaves(deployment: Deployment, timeout: float) -> None:
    """Until the server lists every leaf client as connected; raises ``TimeoutError`` naming the missing ones, or
    ``RuntimeError`` when a site of the deployment exited."""

    def check_sites() -> None:
        dead = [site for site, sid in deployment.sessions.items() if not session_processes(sid)]
        if dead:
            raise RuntimeError(
                f"site(s) {', '.join(dead)} exited at start; see their console.log under {deployment.prod_dir}"
            )

    wait_for_clients(deployment.admin_kit, deployment.leaves, timeout, check_sites)


def wait_for_clients(admin_kit: str, leaves: list[str], timeout: float, check_sites=None) -> None:
    """Until the server (reached with the admin's startup kit) lists every one of ``leaves`` as connected; raises
    ``TimeoutError`` naming the missing ones. ``check_sites`` is called between tries (it may raise)."""
    deadline = time.time() + timeout
    missing = set(leaves)
    while time.time() < deadline:
        if check_sites is not None:
            check_sites()
        try:
            with admin_session(admin_kit) as session:
                while time.time() < deadline:
                    clients = session.check_status("server").get("clients", [])
                    missing = set(leaves) - {c["client_name"] for c in clients}
                    if not missing:
                        return
                    time.sleep(1.0)
        except Exception as ex:  # the server is not up yet: NoConnection, then a retry
            if time.time() > deadline:
                raise TimeoutError(f"the server did not answer within {timeout:g} s ({ex})") from ex
            time.sleep(2.0)
    raise TimeoutError(f"leaf clients {sorted(missing)} did not connect within {timeout:g} s")


def start_proxy(deployment: Deployment) -> int:
    """Start NVFlare's routing proxy (``jobs.device_proxy``) on loopback at ``deployment.proxy_port``, routing to
    the deployment's leaves (LCP map written in its folder), in a new session; its session id. Its log goes to
    ``<folder>/proxy.log``."""
    write_lcp_map(deployment, deployment.lcp_map_file)
    env = dict(os.environ)
    # ``-m jobs.device_proxy`` must find this checkout whatever the caller's working folder is.
    env["PYTHONPATH"] = os.pathsep.join(p for p in [REPO, env.get("PYTHONPATH", "")] if p)
    command = [sys.executable, "-m", "jobs.device_proxy", str(deployment.proxy_port)]
    command += [deployment.lcp_map_file, deployment.ca_cert, "--host", LOOPBACK]
    return start_in_session(command, deployment.folder, os.path.join(deployment.folder, PROXY_LOG), env)


def proxy_answers(url: str, timeout: float = 2.0) -> bool:
    """Whether an HTTP server answers at ``url`` (the proxy's base URL), with any status.

    The probe is a ``POST /job`` without the device-id header: the proxy's own app rejects it (400, an error JSON)
    before routing anything, so the probe never reaches a leaf nor registers a device there."""
    request = urllib.request.Request(url.rstrip("/") + "/job", data=b"{}", method="POST")
    request.add_header("Content-Type", "application/json")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an http_proxy of the env
    try:
        with opener.open(request, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True  # an HTTP answer: it is up
    except (urllib.error.URLError, OSError):
        return False  # nothing listens yet (connection refused), or no answer in time


def wait_for_proxy(deployment: Deployment, timeout: float) -> None:
    """Until the proxy answers HTTP; ``RuntimeError`` if it exited, ``TimeoutError`` if it never answered."""
    log = os.path.join(deployment.folder, PROXY_LOG)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proxy_answers(deployment.proxy_endpoint):
            return
        if not session_processes(deployment.sessions[PROXY]):
            raise RuntimeError(f"NVFlare's routing proxy exited at start; see {log}")
        time.sleep(0.5)
    raise TimeoutError(
        f"NVFlare's routing proxy did not answer on port {deployment.proxy_port} within {timeout:g} s; see {log}"
    )


def start(
    folder: str,
    relays: int = 2,
    leaves: int = 4,
    timeout: float = 180.0,
    proxy: bool = False,
    proxy_port: int | None = None,
    proxy_timeout: float = 60.0,
) -> Deployment:
    """Provision and start a hierarchy in ``folder`` (new or empty) and wait for its leaves, then, with ``proxy``,
    NVFlare's routing proxy on ``proxy_port`` (a free one if None) and wait until it answers; stops everything it
    started if that fails."""
    folder = os.path.abspath(folder)
    if os.path.exists(folder) and os.listdir(folder):
        raise FileExistsError(f"{folder} is not empty: give a new folder (or stop and remove the old deployment)")
    os.makedirs(folder, exist_ok=True)
    prod, ports, names = provision(folder, relays, leaves)
    sites = ["server", *[f"R{r}" for r in range(1, relays + 1)], *names]
    if proxy and proxy_port is None:
        proxy_port = listen_ports(1)[0]  # the same picker as the sites' ports: never one of theirs
    deployment = Deployment(
        folder, prod, os.path.join(prod, ADMIN), names, ports, {}, proxy_port=proxy_port if proxy else None
    )
    try:
        for site in sites:
            quiet_site_logging(os.path.join(prod, site))
            deployment.sessions[site] = start_site(os.path.join(prod, site))
            deployment.save()
        wait_for_leaves(deployment, timeout)
        if proxy:
            deployment.sessions[PROXY] = start_proxy(deployment)
            deployment.save()
            wait_for_proxy(deployment, proxy_timeout)
    except BaseException:
        stop(folder)
        raise
    return deployment


def _exited(p: psutil.Process) -> bool:
    """A zombie: it has exited, but its parent has not reaped it yet. Processes this one started (the sites, the
    proxy) stay so until it exits, and still report their session: without this, a site or proxy that exits at
    start would look alive, and ``stop`` would wait its whole grace for it."""
    return p.info.get("status") == psutil.STATUS_ZOMBIE


def session_processes(sid: int) -> list[psutil.Process]:
    """The living processes of session ``sid`` (zombies left out: they have exited)."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getsid(p.pid) == sid and not _exited(p):
                found.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return found


def deployment_processes(deployment: Deployment) -> list[psutil.Process]:
    """Every process of the deployment: the sites' sessions, and the job processes NVFlare starts in sessions of
    their own (their command lines name their site's folder)."""
    found = []
    sessions = set(deployment.sessions.values())
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            mine = not _exited(p) and (
                os.getsid(p.pid) in sessions or any(a.startswith(deployment.prod_dir) for a in p.info["cmdline"] or ())
            )
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
        if mine:
            found.append(p)
    return found


def stop_session(sid: int, grace: float = 10.0) -> None:
    """End every process of session ``sid``: SIGTERM, then SIGKILL to those still there after ``grace`` s."""
    procs = session_processes(sid)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)


def stop(folder: str, grace: float = 30.0) -> int:
    """Stop every process of the deployment in ``folder``: the proxy (SIGTERM: it has no other way to stop), the
    admin API's ``shutdown all``, then whatever is left of it (``deployment_processes``: job processes included).
    Returns how many had to be killed (the proxy is not counted: SIGTERM is how it stops)."""
    deployment = Deployment.load(folder)
    if PROXY in deployment.sessions:
        # First, so devices stop reaching leaves that go down; and the shutdown below never ends it, so waiting
        # ``grace`` for it would only delay ``down``.
        stop_session(deployment.sessions[PROXY])
    logging.disable(logging.ERROR)  # the admin client logs "no connection to server" while the server goes down
    try:
        with contextlib.suppress(Exception), admin_session(deployment.admin_kit, timeout=5.0) as session:
            session.shutdown("all")  # the server may be gone already: then the sessions below are ended
    finally:
        logging.disable(logging.NOTSET)
    deadline = time.time() + grace
    left = []
    while time.time() < deadline:
        left = deployment_processes(deployment)
        if not left:
            return 0
        time.sleep(1.0)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(left, timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=10)
    return len(left)


def remove(folder: str) -> None:
    """Delete a stopped deployment's folder."""
    Deployment.load(folder)  # only a deployment's folder
    shutil.rmtree(folder)
