"""Provisioning an NVFlare edge project with NVFlare's lighter API: the project's participants (a server, relays
``R1..``, leaves ``C11, C12, ..``), its kits, and the edits each kit gets after NVFlare's builders (the leaf's edge
API on its own host, the server's job store inside the deployment, quieter console logging).

Used by the local hierarchy (``jobs.deploy.local``) and the multi-host project (``jobs.deploy.multi_host``)."""

from __future__ import annotations

import contextlib
import json
import os

import yaml

from common.ports import listen_ports
from jobs.admin_kit import SITES

LOOPBACK = "127.0.0.1"
ADMIN = "admin@nvidia.com"


PROJECT = "edgesim"


PROJECT_FILE = "project.yml"


EDGE_RESOURCES = "edge__p_resources.json"  # a leaf's edge API settings, written by NVFlare's edge builder


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on this machine now, below the ephemeral range (``common.ports``); they stay free
    unless another program takes them before the sites start, which a retry of ``start`` fixes."""
    return listen_ports(n)


def internal(site: str) -> str:
    """The ``ports`` key of ``site``'s internal cell listener (the server's and each leaf's: its job processes
    connect to it on this machine)."""
    return f"{site}-internal"


def port_count(relays: int, leaves: int) -> int:
    """How many ports a project takes: the server's, the admin's, each relay's, each leaf's edge API, then the
    internal listeners of the server and of each leaf."""
    return 3 + relays + 2 * leaves


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
    for site in ["server", *names]:  # not NVFlare's project keys: ``bind_listeners`` writes them in the kits
        used[internal(site)] = next(it)
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

    project, used, names = project_dict(relays, leaves, ports or free_ports(port_count(relays, leaves)), hosts)
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
    bind_listeners(prod, used, names, hosts)
    relay_names = [f"R{r}" for r in range(1, relays + 1)]
    # the project's sites in the admin kit, which travels to the admin's machine: ``wait`` and a prod --dry-run
    _write(os.path.join(prod, ADMIN, SITES), {"relays": relay_names, "leaves": names})
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


def bind_listeners(prod: str, ports: dict[str, int], leaves: list[str], hosts: dict[str, str] | None) -> None:
    """Every NVFlare listener of the kits on the address given for its site (127.0.0.1 without ``hosts``), and the
    internal listeners of the server and the leaves on loopback at their fixed ports (NVFlare's default: a random
    port, and for a leaf named by a non-loopback host, every interface: ``fuel/f3/drivers/net_utils.py``
    ``get_tcp_urls``).

    * server: ``service.target`` on loopback makes NVFlare bind the FL port there (``fed_server.py`` ``deploy``
      binds every interface for any other host), and ``admin_host`` binds the admin port to the server's host;
    * relay: ``listen_host`` in its internal listener's resources (``local/comm_config.json``);
    * server and leaves: ``local/comm_config.json``'s internal listener on 127.0.0.1 at ``ports[internal(site)]``."""
    server = hosts["server"] if hosts else LOOPBACK
    config_path = os.path.join(prod, "server", "startup", "fed_server.json")
    config = _read(config_path)
    service = config["servers"][0]
    if not hosts:
        service["service"]["target"] = f"{LOOPBACK}:{ports['server']}"
    service["admin_host"] = server
    _write(config_path, config)
    for site in (name for name in ports if name.startswith("R")):
        path = os.path.join(prod, site, "local", "comm_config.json")
        config = _read(path)
        config["internal"]["resources"]["listen_host"] = hosts[site] if hosts else LOOPBACK
        _write(path, config)
    for site in ["server", *leaves]:
        path = os.path.join(prod, site, "local", "comm_config.json")
        config = _read(path) if os.path.exists(path) else {}
        resources = {"host": LOOPBACK, "listen_host": LOOPBACK, "port": ports[internal(site)]}
        resources["connection_security"] = "clear"  # NVFlare's default for it: the job processes of this machine
        config["internal"] = {"scheme": "tcp", "resources": resources}
        _write(path, config)


def _read(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _write(path: str, config: dict) -> None:
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


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
