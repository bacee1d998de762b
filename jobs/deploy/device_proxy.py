"""NVFlare's routing proxy for real edge devices, next to a local hierarchy (``python -m jobs.deploy up --proxy``).

    python -m jobs.deploy.device_proxy PORT LCP_MAP CA_CERT [--host 127.0.0.1] [--ssl-cert C --ssl-key K]

Devices speak HTTP (HTTPS with ``--ssl-cert``/``--ssl-key``, NVFlare's own options) to the proxy (``/job``,
``/task``, ``/selection``, ``/result``); it hashes each device's id to one leaf client of the LCP map and
forwards the request to that leaf's gRPC edge API over TLS (the deployment's ``rootCA.pem``). This is NVFlare's
own app (``nvflare.edge.web.routing_proxy``), set up exactly as its ``__main__`` does; the one difference is the
address it listens on: NVFlare's binds ``0.0.0.0`` (every interface, the network included), this one binds
``--host``, loopback unless asked otherwise.

``write_lcp_map`` writes the LCP map of a deployment: ``{leaf: {"host": H, "port": its edge service port}}``, the
format ``nvflare.edge.web.service.query.Query.load_lcp_map`` reads. ``sign_proxy_certificate`` makes the proxy a
certificate signed by the deployment's root CA, which devices given ``rootCA.pem`` trust.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from typing import Protocol

from common.job_files import REPO  # the device client imports the processor from this checkout
from jobs.deploy.provisioning import LOOPBACK


class Deployment(Protocol):
    """What an LCP map needs of a deployment (``jobs.deploy.local.Deployment`` has it)."""

    leaves: list[str]
    ports: dict[str, int]


def lcp_map(deployment: Deployment, host: str = LOOPBACK) -> dict[str, dict[str, str | int]]:
    """The LCP map of ``deployment``: each leaf client at ``host`` and its edge service port (``ports[leaf]``)."""
    return {leaf: {"host": host, "port": deployment.ports[leaf]} for leaf in deployment.leaves}


def write_lcp_map(deployment: Deployment, path: str, host: str = LOOPBACK) -> dict[str, dict[str, str | int]]:
    """Write ``deployment``'s LCP map to ``path`` (JSON) for the proxy; returns it."""
    mapping = lcp_map(deployment, host)
    with open(path, "w") as f:
        json.dump(mapping, f, indent=1)
    return mapping


DEVICE_PROCESSOR = "processors.device_processor.RealDeviceProcessor"
DEVICES_FILE = "devices.json"


def device_client_config(
    endpoint: str,
    job_name: str,
    count: int = 8,
    processor: str = DEVICE_PROCESSOR,
    workers: int | None = None,
    ca_cert: str | None = None,
) -> dict:
    """A config for NVFlare's HTTP device client (``python -m nvflare.edge.simulation.run_device_simulator
    FILE``): ``count`` devices asking for ``job_name`` at ``endpoint``, each training with ``processor`` (this
    project's device side by default, which reads how to train from each task), ``workers`` at a time (all).
    ``ca_cert``: the CA the devices trust for an HTTPS endpoint (the processor's ``ca_cert`` argument)."""
    return {
        "endpoint": endpoint,
        "job_name": job_name,
        "num_devices": count,
        "num_workers": workers or count,
        "get_job_timeout": 600,  # seconds a device waits for the job to be submitted
        "processor": {"path": processor, "python_path": REPO, "args": {"ca_cert": ca_cert} if ca_cert else {}},
    }


def sign_proxy_certificate(state_dir: str, dest: str, host: str = LOOPBACK, days: int = 360) -> tuple[str, str]:
    """A certificate for the proxy on ``host`` (also ``localhost`` for loopback), signed by the root CA NVFlare's
    provisioning keeps in ``state_dir/cert.json``, and its key, written to ``dest/proxy.crt`` and ``proxy.key``
    (the key readable by its owner only); their paths. Made with NVFlare's lighter, as the sites' are."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID
    from nvflare.lighter.utils import (
        Identity,
        generate_cert,
        generate_keys,
        load_private_key,
        serialize_cert,
        serialize_pri_key,
    )

    with open(os.path.join(state_dir, "cert.json")) as f:
        state = json.load(f)
    root = x509.load_pem_x509_certificate(state["root_cert"].encode("ascii"))
    root_name = root.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    root_org = root.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    issuer = Identity(root_name, root_org[0].value if root_org else None)
    key, public = generate_keys()
    cert = generate_cert(
        Identity("proxy", issuer.org),
        issuer,
        load_private_key(state["root_pri_key"]),
        public,
        valid_days=days,
        server_default_host=host,
        server_additional_hosts=["localhost"] if host == LOOPBACK else None,
        # a few minutes back: a device whose clock runs a little behind still accepts it
        not_valid_before=datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5),
    )
    cert_path, key_path = os.path.join(dest, "proxy.crt"), os.path.join(dest, "proxy.key")
    with open(cert_path, "wb") as f:
        f.write(serialize_cert(cert))
    with open(os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(serialize_pri_key(key))
    return cert_path, key_path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: NVFlare's routing proxy's positional arguments, plus ``--host``."""
    parser = argparse.ArgumentParser(prog="python -m jobs.deploy.device_proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int, metavar="PORT", help="the HTTP port devices connect to")
    parser.add_argument("lcp_map", metavar="LCP_MAP", help='JSON file {leaf: {"host": H, "port": P}}')
    parser.add_argument("ca_cert", metavar="CA_CERT", help="the deployment's rootCA.pem (the leaves' edge API is TLS)")
    parser.add_argument(
        "--host",
        default=LOOPBACK,
        help=f"address to listen on (default {LOOPBACK}: this machine only); 0.0.0.0 exposes the proxy, "
        "and through it the leaves' edge API, to the network",
    )
    parser.add_argument("--ssl-cert", default=None, help="serve HTTPS with this certificate (PEM; with --ssl-key)")
    parser.add_argument("--ssl-key", default=None, help="the certificate's private key (PEM; with --ssl-cert)")
    args = parser.parse_args(argv)
    if bool(args.ssl_cert) != bool(args.ssl_key):
        parser.error("give --ssl-cert and --ssl-key together (or neither, for plain HTTP)")
    for path in filter(None, (args.ssl_cert, args.ssl_key)):
        if not os.path.isfile(path):
            parser.error(f"{path}: no such file (give the proxy's PEM certificate and key)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Set up NVFlare's routing-proxy app as its ``__main__`` does, then serve on ``--host:PORT`` until killed."""
    args = parse_args(argv)
    # The same logging as NVFlare's __main__: each routed request and gRPC failure is logged at INFO/ERROR.
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s - %(name)s - %(levelname)s - %(message)s",
        handlers=[logging.StreamHandler()],
    )
    # Imported here: Flask and NVFlare's edge web stack are needed only by the proxy process, not by its launcher.
    from nvflare.edge.web.routing_proxy import FilteredJSONProvider, app  # importing it registers the ApiError handler
    from nvflare.edge.web.views.feg_views import api_query, feg_bp

    api_query.set_lcp_mapping(args.lcp_map)
    api_query.set_ca_cert(args.ca_cert)
    api_query.start()
    app.json = FilteredJSONProvider(app)
    app.register_blueprint(feg_bp)
    # NVFlare's __main__ passes its --ssl-cert/--ssl-key the same way: Flask's (cert, key) ssl_context
    ssl_context = (args.ssl_cert, args.ssl_key) if args.ssl_cert else None
    scheme = "https" if ssl_context else "http"
    print(
        f"[edgesim] NVFlare's routing proxy on {scheme}://{args.host}:{args.port}/ (LCP map {args.lcp_map})", flush=True
    )
    app.run(host=args.host, port=args.port, debug=False, ssl_context=ssl_context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
