"""An admin's startup kit, read before anything is sent: whose it is, where its server's admin port is, and
whether that port answers. Each check raises ``ValueError`` with one line naming the fix, so a mistake costs one
line and exit 2 (``--env prod`` jobs: ``jobs.config.RunConfig`` and ``jobs.run.driver``; ``python -m
jobs.deploy wait|shutdown``), not NVFlare's tracebacks after a login that cannot succeed."""

from __future__ import annotations

import json
import os
import socket

ADMIN_CONFIG = os.path.join("startup", "fed_admin.json")  # written by NVFlare's lighter in every admin kit
SITES = os.path.join("local", "edgesim_sites.json")  # written by ``jobs.deploy.provisioning.provision``


def admin_config(kit: str) -> dict:
    """The ``admin`` section of the kit's ``startup/fed_admin.json``; ``ValueError`` if ``kit`` is no admin kit."""
    path = os.path.join(os.path.expanduser(kit), ADMIN_CONFIG)
    if not os.path.isfile(path):
        raise ValueError(
            f"--startup-kit {kit} is not an admin's startup kit (no {ADMIN_CONFIG}): give the admin's folder of "
            "the provisioned kits, e.g. <prod_00>/admin@nvidia.com"
        )
    try:
        with open(path) as f:
            return json.load(f)["admin"]
    except (OSError, ValueError, KeyError) as ex:
        raise ValueError(f"--startup-kit {kit}: {path} is unreadable ({ex}); provision the kits again") from ex


def check_user(kit: str, username: str) -> None:
    """``username`` is the user the kit was provisioned for (NVFlare refuses any other at login)."""
    owner = admin_config(kit).get("username")
    if username != owner:
        raise ValueError(
            f"--username {username} does not match the startup kit's user {owner} ({ADMIN_CONFIG}): "
            f"use --username {owner}"
        )


def server_address(kit: str) -> tuple[str, int]:
    """The host and admin port the kit's user logs in to."""
    config = admin_config(kit)
    return config["host"], int(config["port"])


def check_server_answers(kit: str, timeout: float = 5.0) -> None:
    """Something accepts TCP connections at the kit's server admin port; ``ValueError`` naming host and port."""
    host, port = server_address(kit)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as ex:
        reason = "no answer" if isinstance(ex, TimeoutError) else (ex.strerror or str(ex))
        raise ValueError(
            f"the server's admin port {host}:{port} (the startup kit's {ADMIN_CONFIG}) does not answer "
            f"({reason}): start the deployment, or check that this machine resolves and reaches {host}"
        ) from ex


def user_of(kit: str) -> str:
    """The user the kit was provisioned for."""
    return admin_config(kit)["username"]


def project_leaves(kit: str) -> list[str] | None:
    """The project's leaves, in the project's order (C11, C12, .. C21, ..), when ``jobs.deploy`` provisioned the
    kit (``local/edgesim_sites.json``); None for a kit provisioned otherwise."""
    path = os.path.join(os.path.expanduser(kit), SITES)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return list(json.load(f)["leaves"])


def check_leaves(kit: str, leaves: list[str]) -> None:
    """Every one of ``leaves`` is a leaf of the kit's project (when ``project_leaves`` knows them)."""
    known = project_leaves(kit)
    unknown = [leaf for leaf in leaves if known is not None and leaf not in known]
    if unknown:
        raise ValueError(f"--leaves: no leaf {', '.join(unknown)} in this project; its leaves are {','.join(known)}")


def check_leaf_count(kit: str, count: int) -> None:
    """``--num-leaf-nodes`` is the number of leaves the kit's project has (when ``project_leaves`` knows them)."""
    known = project_leaves(kit)
    if known is not None and count != len(known):
        raise ValueError(
            f"--num-leaf-nodes {count}: the deployment has {len(known)} leaves ({','.join(known)}): "
            f"use --num-leaf-nodes {len(known)}"
        )
