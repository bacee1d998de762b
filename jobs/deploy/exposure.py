"""What a deployment exposes: the table of every port its sites listen on (``documented``), the sockets its
processes really listen on (``listening_sockets``), and the difference (``undocumented``).

The table is the one ``docs/deployment.md`` ("What is exposed") gives and ``python -m jobs.deploy provision``
prints; the e2e tests scan a local ``up`` and each namespaced host after the sites start and fail on any socket
bound wider than its row, or on a port with no row.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import psutil

from jobs.deploy.provisioning import LOOPBACK, internal

EVERY_INTERFACE = "0.0.0.0"  # NVFlare's server FL port off loopback (fed_server.py ``deploy``): also [::]


@dataclass(frozen=True)
class Listener:
    """One row of the table: ``site`` listens on ``host:port`` (``EVERY_INTERFACE``: every interface)."""

    site: str
    host: str
    port: int
    what: str  # protocol, who connects, how they are authenticated

    def line(self) -> str:
        return f"{self.site:<7} {self.host}:{self.port}  {self.what}"


def documented(
    ports: dict[str, int], hosts: dict[str, str] | None = None, proxy_port: int | None = None
) -> list[Listener]:
    """Every listener of a deployment with these ``ports`` (``provisioning.project_dict``'s): on ``hosts`` (a
    multi-host project) or all on this machine's loopback (``up``), with the routing proxy's ``proxy_port``."""

    def host(site: str) -> str:
        return hosts[site] if hosts else LOOPBACK

    # NVFlare binds the server's FL port to every interface unless its host is loopback (fed_server.py ``deploy``)
    rows = [
        Listener(
            "server",
            host("server") if not hosts else EVERY_INTERFACE,
            ports["server"],
            "NVFlare cell (HTTP/WebSocket, mutual TLS: relays' and leaves' certificates from the project's CA)",
        ),
        Listener("server", host("server"), ports["admin"], "admin API (mutual TLS: the admin's startup kit)"),
        Listener("server", LOOPBACK, ports[internal("server")], "internal cell (TCP, the server's own job processes)"),
    ]
    for site, port in ports.items():
        if site.startswith("R"):
            rows.append(Listener(site, host(site), port, "relay cell (TCP, mutual TLS: its leaves' certificates)"))
        elif site.startswith("C") and "-" not in site:
            rows.append(
                Listener(site, host(site), port, "edge API (gRPC over TLS: the routing proxy, the project's CA)")
            )
            rows.append(Listener(site, LOOPBACK, ports[internal(site)], "internal cell (TCP, its own job processes)"))
    if proxy_port is not None:
        rows.append(Listener("proxy", LOOPBACK, proxy_port, "routing proxy (HTTPS: real devices, not authenticated)"))
    return rows


def listening_sockets(pids: set[int] | None = None) -> list[tuple[str, int, int | None]]:
    """(address, port, pid) of each listening TCP socket of this network namespace, of ``pids`` only if given;
    an IPv4-mapped IPv6 address is given as its IPv4 one (gRPC's dual-stack socket on 127.0.0.1)."""
    found = []
    for c in psutil.net_connections(kind="inet"):
        if c.status != psutil.CONN_LISTEN or (pids is not None and c.pid not in pids):
            continue
        address = ipaddress.ip_address(c.laddr.ip.split("%")[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        found.append((str(address), c.laddr.port, c.pid))
    return found


def addresses(host: str) -> set[str]:
    """The addresses a listener documented on ``host`` may bind."""
    if host == EVERY_INTERFACE:
        return {"0.0.0.0", "::"}
    try:
        return {str(ipaddress.ip_address(host))}
    except ValueError:
        return {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}


def undocumented(found: list[tuple[str, int, int | None]], table: list[Listener]) -> list[str]:
    """One line per socket of ``found`` with no row of ``table`` for its port and address."""
    allowed: dict[int, set[str]] = {}
    for row in table:
        allowed.setdefault(row.port, set()).update(addresses(row.host))
    return [
        f"{address}:{port} (pid {pid}): "
        + (f"bound wider than documented ({', '.join(sorted(allowed[port]))})" if port in allowed else "no row")
        for address, port, pid in found
        if address not in allowed.get(port, ())
    ]
