"""Stand up (and tear down) a provisioned NVFlare edge hierarchy on this machine, for ``--env prod`` jobs.

    python -m jobs.deploy up --relays 2 --leaves 4 DIR     # provision, start, wait for the leaves; prints the flags
    python -m jobs.deploy up --proxy DIR                   # ... and NVFlare's routing proxy for real edge devices
    python jobs/pt_job_fedavg.py <those flags> ...         # run jobs on it
    python -m jobs.deploy down DIR                         # stop every process it started
    python -m jobs.deploy down --remove DIR                # ... and delete DIR

The work is in ``jobs.hierarchy``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from common.jsonio import write_json_atomic
from jobs import hierarchy
from jobs.device_proxy import DEVICES_FILE, device_client_config


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
        help="also start NVFlare's routing proxy (HTTP, on 127.0.0.1 only) that routes real edge devices to the leaves",
    )
    up.add_argument("--proxy-port", type=int, default=None, help="the proxy's port (default: a free one)")
    down = sub.add_parser("down", help="stop every process of the hierarchy in DIR")
    down.add_argument("folder", metavar="DIR")
    down.add_argument("--remove", action="store_true", help="then delete DIR")
    args = parser.parse_args(argv)

    if args.command == "up":
        if args.proxy_port is not None and not args.proxy:
            parser.error("--proxy-port needs --proxy")
        try:
            deployment = hierarchy.start(
                args.folder, args.relays, args.leaves, args.timeout, proxy=args.proxy, proxy_port=args.proxy_port
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
            write_json_atomic(devices, device_client_config(deployment.proxy_endpoint, "edgesim_fedbuff"))
            print(
                f"[edgesim] devices connect to {deployment.proxy_endpoint} (NVFlare's routing proxy; LCP map "
                f"{deployment.lcp_map_file})\n[edgesim] 8 HTTP devices for a --devices real job named edgesim_fedbuff "
                f"(edit {devices} for another):\n  python -m nvflare.edge.simulation.run_device_simulator "
                f"{shlex.quote(devices)}"
            )
        print(f"[edgesim] run a job on it with:\n  python jobs/pt_job_fedavg.py {shlex.join(deployment.job_flags)}")
        print(f"[edgesim] stop it with: python -m jobs.deploy down {shlex.quote(deployment.folder)}")
        return 0
    try:
        killed = hierarchy.stop(args.folder)
    except FileNotFoundError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 2
    print(
        f"[edgesim] hierarchy in {args.folder} stopped"
        + (f" ({killed} process(es) had to be killed)" if killed else "")
    )
    if args.remove:
        hierarchy.remove(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
