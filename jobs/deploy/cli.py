"""Stand up (and tear down) a provisioned NVFlare edge hierarchy on this machine, for ``--env prod`` jobs.

    python -m jobs.deploy up --relays 2 --leaves 4 DIR     # provision, start, wait for the leaves; prints the flags
    python -m jobs.deploy up --proxy DIR                   # ... and NVFlare's routing proxy for real edge devices
    python jobs/pt_job_fedavg.py <those flags> ...         # run jobs on it
    python -m jobs.deploy down DIR                         # stop every process it started
    python -m jobs.deploy down --remove DIR                # ... and delete DIR

On several machines (``jobs.deploy.multi_host``: its docstring walks through it):

    python -m jobs.deploy provision DIR --relays 1 --leaves 2 --host server=H1 --host R1=H2 --host C11=H3 ...
    python -m jobs.deploy start-site SITE_KIT                   # on each site's machine
    python -m jobs.deploy wait --startup-kit ADMIN_KIT --leaves C11,C12
    python -m jobs.deploy shutdown --startup-kit ADMIN_KIT      # every site, through the admin API

The work is in ``jobs.deploy.local`` (this machine), ``jobs.deploy.multi_host`` (several), with
``jobs.deploy.provisioning``, ``jobs.deploy.sessions``, ``jobs.deploy.admin`` and ``jobs.deploy.device_proxy``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from common.jsonio import write_json_atomic
from jobs import admin_kit as kit
from jobs.deploy import admin, local, multi_host, provisioning
from jobs.deploy.device_proxy import DEVICES_FILE, device_client_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.deploy", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="provision and start a hierarchy in DIR (a new or empty folder)")
    up.add_argument("folder", metavar="DIR")
    up.add_argument("--relays", type=int, default=2)
    up.add_argument("--leaves", type=int, default=4, help="leaf clients in all (a multiple of --relays)")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for every leaf to connect")
    up.add_argument(
        "--proxy",
        action="store_true",
        help="also start NVFlare's routing proxy (HTTPS, on 127.0.0.1 only) that routes real edge devices to the "
        "leaves; its certificate is signed by the deployment's root CA unless --proxy-cert/--proxy-key give one",
    )
    up.add_argument("--proxy-port", type=int, default=None, help="the proxy's port (default: a free one)")
    up.add_argument(
        "--proxy-cert", default=None, metavar="PEM", help="the proxy's HTTPS certificate (with --proxy-key)"
    )
    up.add_argument("--proxy-key", default=None, metavar="PEM", help="its private key (with --proxy-cert)")
    down = sub.add_parser("down", help="stop every process of the hierarchy in DIR")
    down.add_argument("folder", metavar="DIR")
    down.add_argument("--remove", action="store_true", help="then delete DIR")
    prov = sub.add_parser("provision", help="provision kits for a hierarchy on several machines (NAME=HOST pairs)")
    prov.add_argument("folder", metavar="DIR")
    prov.add_argument("--relays", type=int, default=1)
    prov.add_argument("--leaves", type=int, default=2, help="leaf clients in all (a multiple of --relays)")
    prov.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME=HOST",
        help="a site's host name or address, once per site: server, R1.., C11..",
    )
    prov.add_argument(
        "--base-port",
        type=int,
        default=multi_host.BASE_PORT,
        help="ports are fixed: the server's, the admin's, then each relay's and leaf's edge API, from this one",
    )
    start = sub.add_parser("start-site", help="start one site of a provisioned kit on this machine")
    start.add_argument("site", metavar="SITE_KIT", help="the site's folder (server, R1, C11, ...)")
    wait = sub.add_parser("wait", help="wait until the server lists every leaf as connected (admin API)")
    wait.add_argument("--startup-kit", required=True, metavar="ADMIN_KIT")
    wait.add_argument("--leaves", required=True, help="comma-separated leaf names, e.g. C11,C12")
    wait.add_argument("--timeout", type=float, default=180.0)
    stop = sub.add_parser("shutdown", help="stop every site of a deployment through the admin API")
    stop.add_argument("--startup-kit", required=True, metavar="ADMIN_KIT")
    args = parser.parse_args(argv)
    if args.command == "up":
        check_proxy_flags(parser, args)
    commands = {
        "up": _up,
        "down": _down,
        "provision": _provision,
        "start-site": _start_site,
        "wait": _wait,
        "shutdown": _shutdown,
    }
    return commands[args.command](args)


def check_proxy_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The proxy's flags make sense together, and its certificate files exist, before anything starts."""
    if not args.proxy and (args.proxy_port is not None or args.proxy_cert or args.proxy_key):
        parser.error("--proxy-port, --proxy-cert and --proxy-key need --proxy")
    if bool(args.proxy_cert) != bool(args.proxy_key):
        parser.error("give --proxy-cert and --proxy-key together (or neither: up signs one with the root CA)")
    for path in filter(None, (args.proxy_cert, args.proxy_key)):
        if not os.path.isfile(path):
            parser.error(f"{path}: no such file (give the proxy's PEM certificate and key)")


def _up(args: argparse.Namespace) -> int:
    tls = (args.proxy_cert, args.proxy_key) if args.proxy_cert else None
    try:
        deployment = local.start(
            args.folder,
            args.relays,
            args.leaves,
            args.timeout,
            proxy=args.proxy,
            proxy_port=args.proxy_port,
            proxy_tls=tls,
        )
    except (ValueError, FileExistsError) as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as ex:
        print(f"error: the hierarchy did not come up, and everything it started was stopped: {ex}", file=sys.stderr)
        return 1
    print(
        f"[edgesim] hierarchy up in {deployment.folder}: server, {args.relays} relays, leaves "
        f"{', '.join(deployment.leaves)} (ports {deployment.ports})"
    )
    if deployment.proxy_endpoint:
        devices = os.path.join(deployment.folder, DEVICES_FILE)
        config = device_client_config(deployment.proxy_endpoint, "edgesim_fedbuff", ca_cert=deployment.proxy_ca)
        write_json_atomic(devices, config)
        trust = f"; devices trust {deployment.proxy_ca}" if deployment.proxy_ca else ""
        print(
            f"[edgesim] devices connect to {deployment.proxy_endpoint} (NVFlare's routing proxy; LCP map "
            f"{deployment.lcp_map_file}{trust})\n[edgesim] 8 HTTPS devices for a --devices real job named edgesim_fedbuff "
            f"(edit {devices} for another):\n  python -m nvflare.edge.simulation.run_device_simulator "
            f"{shlex.quote(devices)}"
        )
    print(f"[edgesim] run a job on it with:\n  python jobs/pt_job_fedavg.py {shlex.join(deployment.job_flags)}")
    print(f"[edgesim] stop it with: python -m jobs.deploy down {shlex.quote(deployment.folder)}")
    return 0


def _down(args: argparse.Namespace) -> int:
    try:
        killed = local.stop(args.folder)
    except FileNotFoundError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    print(
        f"[edgesim] hierarchy in {args.folder} stopped"
        + (f" ({killed} process(es) had to be killed)" if killed else "")
    )
    if args.remove:
        local.remove(args.folder)
    return 0


def _provision(args: argparse.Namespace) -> int:
    try:
        hosts = multi_host.parse_hosts(args.host, args.relays, args.leaves)
        if os.path.exists(args.folder) and os.listdir(args.folder):
            raise ValueError(f"{args.folder} is not empty: give a new or empty folder")
        made = multi_host.provision(args.folder, args.relays, args.leaves, hosts, args.base_port)
    except (ValueError, RuntimeError) as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    prod, kit = made["prod"], made["admin_kit"]
    print(f"[edgesim] kits in {prod} (project: {os.path.join(args.folder, provisioning.PROJECT_FILE)})")
    print("[edgesim] what listens where:\n  " + "\n  ".join(made["listening"]))
    print(
        f"[edgesim] copy each site's folder from {prod} to its host, install this project there, and start it "
        "there (server, then relays, then leaves):\n  python -m jobs.deploy start-site <site folder>"
    )
    leaves = ",".join(made["leaves"])
    print(
        f"[edgesim] then, with the admin kit {kit}:\n  python -m jobs.deploy wait --startup-kit {shlex.quote(kit)} "
        f"--leaves {leaves}\n  python jobs/pt_job_fedavg.py --env prod --startup-kit {shlex.quote(kit)} --username "
        f"{provisioning.ADMIN} --num-leaf-nodes {len(made['leaves'])} ...\n  python -m jobs.deploy shutdown "
        f"--startup-kit {shlex.quote(kit)}"
    )
    return 0


def _start_site(args: argparse.Namespace) -> int:
    try:
        sid = multi_host.start_site(args.site)
    except FileNotFoundError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    print(
        f"[edgesim] {os.path.basename(os.path.abspath(args.site))} started (session {sid}; console in "
        f"{os.path.join(os.path.abspath(args.site), 'console.log')})"
    )
    return 0


def _wait(args: argparse.Namespace) -> int:
    leaves = [name for name in args.leaves.split(",") if name]
    try:
        kit.admin_config(args.startup_kit)
        kit.check_leaves(args.startup_kit, leaves)
        admin.wait_for_clients(os.path.abspath(args.startup_kit), leaves, args.timeout)
    except ValueError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    except TimeoutError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 1
    print(f"[edgesim] every leaf is connected: {', '.join(leaves)}")
    return 0


def _shutdown(args: argparse.Namespace) -> int:
    try:
        kit.admin_config(args.startup_kit)
    except ValueError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    try:
        kit.check_server_answers(args.startup_kit)
    except ValueError as ex:
        # a stopped deployment is said so at once, not after the admin client's retries and connection noise
        print(f"error: nothing shut down: {ex}", file=sys.stderr)
        return 2
    try:
        multi_host.shutdown(args.startup_kit)
    except Exception as ex:  # the admin API's own errors: not authorised
        print(f"error: the server did not take the shutdown ({type(ex).__name__}: {ex})", file=sys.stderr)
        return 1
    print("[edgesim] shutdown sent: the server, the relays and the leaves stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
