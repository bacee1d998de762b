"""The admin Session API of a deployment: an always-closed session, and waiting until leaf clients connect."""

from __future__ import annotations

import contextlib
import io
import time

from jobs.admin_kit import server_address, user_of


@contextlib.contextmanager
def admin_session(admin_kit: str, timeout: float = 5.0):
    """An admin Session, always closed (an unclosed one keeps the interpreter from exiting); NVFlare's prints to
    stdout while it is open are dropped."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    with contextlib.redirect_stdout(io.StringIO()):  # "Connecting to FLARE ..." on every (re)connection
        session = new_secure_session(user_of(admin_kit), admin_kit, timeout=timeout)
        try:
            yield session
        finally:
            session.close()


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
                host, port = server_address(admin_kit)
                raise TimeoutError(
                    f"the server's admin port {host}:{port} did not answer within {timeout:g} s ({ex})"
                ) from ex
            time.sleep(2.0)
    raise TimeoutError(f"leaf clients {sorted(missing)} did not connect within {timeout:g} s")
