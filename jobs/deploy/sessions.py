"""Processes in sessions of their own: how a deployment starts its sites and its proxy, finds them again and ends
them (every process a site starts, job processes included, stays in its session)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import psutil


def start_in_session(command: list[str], cwd: str, log_path: str, env: dict[str, str]) -> int:
    """Start ``command`` in a new session (every process it starts stays in it), its output appended to
    ``log_path``; its session id."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid  # a new session's leader: its pid is the session id


def launch_site(site_dir: str) -> int:
    """Start one site in the foreground mode of its own start script, in a new session; its session id."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # the scripts run python3
    command = ["bash", os.path.join(site_dir, "startup", "sub_start.sh"), "--once"]
    return start_in_session(command, site_dir, os.path.join(site_dir, "console.log"), env)


def exited(p: psutil.Process) -> bool:
    """A zombie: it has exited, but its parent has not reaped it yet. Processes this one started (the sites, the
    proxy) stay so until it exits, and still report their session: without this, a site or proxy that exits at
    start would look alive, and ``stop`` would wait its whole grace for it."""
    return p.info.get("status") == psutil.STATUS_ZOMBIE


def session_processes(sid: int) -> list[psutil.Process]:
    """The living processes of session ``sid`` (zombies left out: they have exited)."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getsid(p.pid) == sid and not exited(p):
                found.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return found


def stop_session(sid: int, grace: float = 10.0) -> None:
    """End every process of session ``sid``: SIGTERM, then SIGKILL to those still there after ``grace`` s."""
    procs = session_processes(sid)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)
