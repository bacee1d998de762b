"""Ending and resuming the real jobs e2e tests start: a started job finished (``finish``), a results folder resumed
with the job's own command (``resume``), and one of several jobs killed at a checkpoint and resumed
(``run_one_killed_and_resumed``)."""

from __future__ import annotations

import subprocess

from tests.conftest import PYTHON, REPO, checkpoint_version, kill_tree, wait_for


def finish(proc: subprocess.Popen, timeout: float = 400) -> tuple[int, str]:
    """A started job's exit code and output once it ends (killed with its descendants if it outlasts ``timeout``)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    return proc.returncode, out


def resume(output, *command: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``command`` (default the job script alone, ``--resume``'s own way) with ``--resume output`` appended, run to
    its end."""
    command = command or (PYTHON, "jobs/pt_job_fedrevive.py")
    return subprocess.run(
        [*command, "--resume", str(output)], cwd=REPO, env=env, capture_output=True, text=True, timeout=400
    )


def run_one_killed_and_resumed(
    commands: dict[str, list[str]], killed: str, output, env: dict, version: int = 4
) -> dict[str, tuple[int, str]]:
    """Start every job of ``commands`` at once (their results do not depend on it: exact time), kill ``killed``'s
    process tree with SIGKILL once its results folder ``output`` holds a checkpoint of ``version``, wait for the
    others, then resume it: its own command with ``--resume output`` appended, which must exit 0 and say it
    resumed. Returns each job that was not killed: its exit code and output."""
    procs, outputs = {}, {}
    try:
        for name, command in commands.items():
            procs[name] = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        what = f"a checkpoint at version {version}"
        wait_for(lambda: checkpoint_version(output) >= version, procs[killed], 300, what)
        kill_tree(procs[killed].pid)
        outputs = {name: proc.communicate(timeout=400)[0] for name, proc in procs.items() if name != killed}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                kill_tree(proc.pid)
    resumed = resume(output, *commands[killed], env=env)
    assert resumed.returncode == 0 and "resuming" in resumed.stdout, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    return {name: (procs[name].returncode, out) for name, out in outputs.items()}
