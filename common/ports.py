"""Ports for the listeners a run starts on this machine (NVFlare's simulator workers, a local hierarchy's sites).

Why not the kernel's choice (bind to port 0, close, hand the number on): that number comes from the ephemeral range,
the range every outgoing TCP connection takes its local port from. The listener binds it seconds later, in another
process, and meanwhile one of the run's own outgoing connections may have taken it: ``OSError: [Errno 98] Address
already in use`` in NVFlare's ``simulator_worker``, and a leaf that never starts (seen once in CI). Ports below the
ephemeral range are never given to outgoing connections; ``listen_ports`` picks there, checks each is free now, and
never hands one out twice in a process.
"""

from __future__ import annotations

import random
import socket
import threading

LOWEST = 10000  # below the usual registered services' clutter; far from the ephemeral range's start (32768)
_GIVEN: set[int] = set()
_LOCK = threading.Lock()
_PICK = random.SystemRandom()  # port numbers never reach a result: no seed wanted


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default where it cannot be read)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def is_free(port: int) -> bool:
    """Nothing listens on ``port`` (any address) and it is not held in TIME_WAIT."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def listen_ports(number: int) -> list[int]:
    """``number`` distinct ports, free now, outside the ephemeral range, not handed out before by this process.

    Same signature as ``nvflare.fuel.utils.network_utils.get_open_ports``, which ``nvflare_private`` replaces
    with it in NVFlare's simulator."""
    low, _ = ephemeral_range()
    if low - LOWEST < 1000:  # an unusual ephemeral range leaves no room below it: the kernel's choice
        return _kernel_ports(number)
    ports: list[int] = []
    with _LOCK:
        for _ in range(100 * number):
            port = _PICK.randrange(LOWEST, low)
            if port in _GIVEN or port in ports or not is_free(port):
                continue
            ports.append(port)
            if len(ports) == number:
                _GIVEN.update(ports)
                return ports
    return _kernel_ports(number)


def _kernel_ports(number: int) -> list[int]:
    sockets = []
    try:
        for _ in range(number):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
