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
* with ``proxy``: NVFlare's routing proxy for real edge devices (``jobs.deploy.device_proxy``, on loopback, HTTPS with
  a certificate signed by the deployment's root CA or one given), in a session of its own like a site's, routing
  each device to a leaf's edge API by the LCP map it writes in the folder.

``deployment.json`` in the folder records what was started (the sites' and the proxy's sessions), so ``stop``
finds and ends every process of the deployment, job processes included, even when the admin API cannot.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import ssl
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass

import psutil

from common.job_files import REPO
from common.ports import listen_ports
from jobs.admin_kit import check_server_answers
from jobs.deploy.admin import admin_session, wait_for_clients
from jobs.deploy.device_proxy import sign_proxy_certificate, write_lcp_map
from jobs.deploy.provisioning import ADMIN, LOOPBACK, provision, quiet_site_logging
from jobs.deploy.sessions import exited, launch_site, session_processes, start_in_session, stop_session

STATE_FILE = "deployment.json"
PROXY = "proxy"  # the proxy's key in ``Deployment.sessions`` (no site is named so)
LCP_MAP_FILE = "lcp_map.json"
PROXY_LOG = "proxy.log"


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
        proxy_port: the routing proxy's port on loopback, or None without one (and in older
            ``deployment.json`` files, which lack the field).
        proxy_cert: the proxy's HTTPS certificate and ``proxy_key`` its key (None: plain HTTP, as older
            deployments' proxies served).
        proxy_ca: the CA certificate devices verify the proxy's certificate against (the deployment's
            ``rootCA.pem`` when ``up`` signed it; None for a certificate given to ``up``: the devices' own CAs).
    """

    folder: str
    prod_dir: str
    admin_kit: str
    leaves: list[str]
    ports: dict[str, int]
    sessions: dict[str, int]
    proxy_port: int | None = None
    proxy_cert: str | None = None
    proxy_key: str | None = None
    proxy_ca: str | None = None

    @property
    def proxy_endpoint(self) -> str | None:
        """The URL devices connect to, or None without a proxy."""
        scheme = "https" if self.proxy_cert else "http"
        return None if self.proxy_port is None else f"{scheme}://{LOOPBACK}:{self.proxy_port}/"

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


def start_proxy(deployment: Deployment) -> int:
    """Start NVFlare's routing proxy (``jobs.deploy.device_proxy``) on loopback at ``deployment.proxy_port``, routing to
    the deployment's leaves (LCP map written in its folder), in a new session; its session id. Its log goes to
    ``<folder>/proxy.log``."""
    write_lcp_map(deployment, deployment.lcp_map_file)
    env = dict(os.environ)
    # ``-m jobs.deploy.device_proxy`` must find this checkout whatever the caller's working folder is.
    env["PYTHONPATH"] = os.pathsep.join(p for p in [REPO, env.get("PYTHONPATH", "")] if p)
    command = [sys.executable, "-m", "jobs.deploy.device_proxy", str(deployment.proxy_port)]
    command += [deployment.lcp_map_file, deployment.ca_cert, "--host", LOOPBACK]
    if deployment.proxy_cert:
        command += ["--ssl-cert", deployment.proxy_cert, "--ssl-key", deployment.proxy_key]
    return start_in_session(command, deployment.folder, os.path.join(deployment.folder, PROXY_LOG), env)


def proxy_answers(url: str, timeout: float = 2.0) -> bool:
    """Whether an HTTP server answers at ``url`` (the proxy's base URL), with any status.

    The probe is a ``POST /job`` without the device-id header: the proxy's own app rejects it (400, an error JSON)
    before routing anything, so the probe never reaches a leaf nor registers a device there."""
    request = urllib.request.Request(url.rstrip("/") + "/job", data=b"{}", method="POST")
    request.add_header("Content-Type", "application/json")
    # A liveness probe only (nothing is sent but the refused request): it answers is all it asks, so an HTTPS
    # proxy's certificate is not checked here; devices check it (``device_client_config``'s ``ca_cert``).
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    # never via an http_proxy of the env
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls))
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
    proxy_tls: tuple[str, str] | None = None,
) -> Deployment:
    """Provision and start a hierarchy in ``folder`` (new or empty) and wait for its leaves, then, with ``proxy``,
    NVFlare's routing proxy on ``proxy_port`` (a free one if None), serving HTTPS with ``proxy_tls`` (certificate,
    key), or with a certificate signed by the deployment's root CA if None, and wait until it answers; stops
    everything it started if that fails."""
    folder = os.path.abspath(folder)
    if os.path.exists(folder) and os.listdir(folder):
        raise FileExistsError(f"{folder} is not empty: give a new folder (or stop and remove the old deployment)")
    os.makedirs(folder, exist_ok=True)
    prod, ports, names = provision(folder, relays, leaves)
    sites = ["server", *[f"R{r}" for r in range(1, relays + 1)], *names]
    if proxy and proxy_port is None:
        proxy_port = listen_ports(1)[0]  # the same picker as the sites' ports: never one of theirs
    cert = key = ca = None
    if proxy:
        if proxy_tls:
            cert, key = (os.path.abspath(p) for p in proxy_tls)
        else:  # NVFlare's provisioning keeps its root CA in <project>/state, beside prod_00
            cert, key = sign_proxy_certificate(os.path.join(os.path.dirname(prod), "state"), folder)
            ca = os.path.join(prod, "server", "startup", "rootCA.pem")
    deployment = Deployment(
        folder,
        prod,
        os.path.join(prod, ADMIN),
        names,
        ports,
        {},
        proxy_port=proxy_port if proxy else None,
        proxy_cert=cert,
        proxy_key=key,
        proxy_ca=ca,
    )
    try:
        for site in sites:
            quiet_site_logging(os.path.join(prod, site))
            deployment.sessions[site] = launch_site(os.path.join(prod, site))
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


def deployment_processes(deployment: Deployment) -> list[psutil.Process]:
    """Every process of the deployment: the sites' sessions, and the job processes NVFlare starts in sessions of
    their own (their command lines name their site's folder)."""
    found = []
    sessions = set(deployment.sessions.values())
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            mine = not exited(p) and (
                os.getsid(p.pid) in sessions or any(a.startswith(deployment.prod_dir) for a in p.info["cmdline"] or ())
            )
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
        if mine:
            found.append(p)
    return found


def stop(folder: str, grace: float = 30.0) -> int:
    """Stop every process of the deployment in ``folder``: the proxy (SIGTERM: it has no other way to stop), the
    admin API's ``shutdown all``, then whatever is left of it (``deployment_processes``: job processes included).
    Returns how many had to be killed (the proxy is not counted: SIGTERM is how it stops)."""
    deployment = Deployment.load(folder)
    if PROXY in deployment.sessions:
        # First, so devices stop reaching leaves that go down; and the shutdown below never ends it, so waiting
        # ``grace`` for it would only delay ``down``.
        stop_session(deployment.sessions[PROXY])
    try:
        check_server_answers(deployment.admin_kit, timeout=2.0)
        server_up = True
    except ValueError:
        server_up = False  # stopped already, or its server is gone: the sessions below are ended at once
    if server_up:
        logging.disable(logging.ERROR)  # the admin client logs "no connection to server" while the server stops
        try:
            with contextlib.suppress(Exception), admin_session(deployment.admin_kit, timeout=5.0) as session:
                session.shutdown("all")
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
