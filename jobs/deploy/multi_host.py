"""The hierarchy across several machines: one project for named hosts, a site started on its own machine, waiting
for the leaves and stopping everything through the admin API, with no state kept on any one machine.

    python -m jobs.deploy provision DIR --relays 1 --leaves 2 \\
        --host server=10.0.0.1 --host R1=10.0.0.2 --host C11=10.0.0.3 --host C12=10.0.0.4
    # copy DIR/edgesim/prod_00/<site> to its host, then on that host (this project installed there):
    python -m jobs.deploy start-site <site folder>              # server first, then relays, then leaves
    python -m jobs.deploy wait --startup-kit <admin kit> --leaves C11,C12
    python jobs/pt_job_fedavg.py --env prod --startup-kit <admin kit> --username admin@nvidia.com ...
    python -m jobs.deploy shutdown --startup-kit <admin kit>     # every site, through the admin API

``provision`` writes ``DIR/project.yml`` (NVFlare's project file, for ``nvflare provision -p`` too) and the kits.
The project is ``jobs.deploy.provisioning.project_dict`` with every host given: the server's ``default_host`` and
``host_names``, each relay's ``listening_host`` (left at ``localhost`` a relay binds 127.0.0.1 and its leaves
retry for ever), fixed ports from ``--base-port``, mutual TLS between every pair (NVFlare's relay default is clear
TCP), each leaf's edge API on its own address only, the internal listeners on loopback, and the server's job store inside its own kit (set again by
``start-site`` wherever the kit was copied). ``listening`` says what listens where.
"""

from __future__ import annotations

import os

from jobs.deploy import admin, exposure, provisioning, sessions

BASE_PORT = 8002


def parse_hosts(pairs: list[str], relays: int, leaves: int) -> dict[str, str]:
    """``["server=H", "R1=H", ...]`` as a dict; every site of the project must be named once, and nothing else."""
    relay_names, leaf_names = provisioning.site_names(relays, leaves)
    sites = ["server", *relay_names, *leaf_names]
    hosts: dict[str, str] = {}
    for pair in pairs:
        name, sep, host = pair.partition("=")
        if not sep or not name or not host:
            raise ValueError(f"--host {pair!r}: give NAME=HOST, e.g. --host server=10.0.0.1")
        if name not in sites:
            raise ValueError(f"--host {pair!r}: no site {name!r} in this project; its sites are {', '.join(sites)}")
        if name in hosts:
            raise ValueError(f"--host {name} is given twice")
        hosts[name] = host
    missing = [s for s in sites if s not in hosts]
    if missing:
        raise ValueError(f"no --host for {', '.join(missing)}: give every site its host (NAME=HOST)")
    return hosts


def fixed_ports(relays: int, leaves: int, base: int = BASE_PORT) -> list[int]:
    """The project's ports, in ``project_dict``'s order (server, admin, then each relay followed by its leaves, then
    the internal listeners of the server and the leaves, on loopback): ``base``, ``base`` + 1, ... (fixed, so
    firewalls can be opened before the sites start)."""
    return list(range(base, base + provisioning.port_count(relays, leaves)))


def provision(folder: str, relays: int, leaves: int, hosts: dict[str, str], base_port: int = BASE_PORT) -> dict:
    """Write ``folder/project.yml`` and provision the kits for ``hosts``; what listens where (``listening``)."""
    os.makedirs(folder, exist_ok=True)
    prod, used, leaf_names = provisioning.provision(
        folder, relays, leaves, hosts, fixed_ports(relays, leaves, base_port)
    )
    return {"prod": prod, "admin_kit": os.path.join(prod, provisioning.ADMIN), "leaves": leaf_names} | {
        "listening": listening(hosts, used)
    }


def listening(hosts: dict[str, str], ports: dict[str, int]) -> list[str]:
    """One line per listener (``exposure.documented``): who listens on which host and port, and who connects."""
    return [row.line() for row in exposure.documented(ports, hosts)]


def start_site(site_dir: str) -> int:
    """Start the site whose kit is ``site_dir`` on this machine, in a session of its own, with this Python's
    environment on ``PATH`` (NVFlare's start scripts run ``python3``); a server kit keeps its job store inside
    itself. Its session id."""
    site_dir = os.path.abspath(site_dir)
    if not os.path.isfile(os.path.join(site_dir, "startup", "sub_start.sh")):
        raise FileNotFoundError(f"{site_dir} is not a site's kit (no startup/sub_start.sh)")
    if os.path.isfile(os.path.join(site_dir, "startup", "fed_server.json")):
        provisioning.keep_storage_in(site_dir)
    provisioning.quiet_site_logging(site_dir)
    return sessions.launch_site(site_dir)


def shutdown(admin_kit: str) -> None:
    """Stop every site (clients, relays' leaves and the server) through the admin API: nothing local is needed."""
    with admin.admin_session(os.path.abspath(admin_kit), timeout=10.0) as session:
        # sent, not waited for: NVFlare's own wait gives the server 30 s to become unreachable, and a server with
        # relays can take longer to exit after it says "stopped"; callers that need the sites gone wait for them
        session.shutdown("all", wait=False)
