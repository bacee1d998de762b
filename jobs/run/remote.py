"""Follows a job submitted to a deployment (``--env prod`` or ``poc``) and brings its results home.

The server of a deployment writes the run's results into its own job workspace (``app_server/``: ``metrics.json``,
``events.jsonl``, ``global_model.pt``, ``tensorboard/``, the leaves' report logs, checkpoints), which is not on
this machine. ``follow`` waits for the job, printing its status changes and the server's progress lines as they
appear in its log (prod: through the admin Session API), then downloads the job's result through NVFlare's
admin API and copies the run's result files (``common.result_files`` and the method's own, as the driver names
them: ``jobs.run.results.result_files_of``) into ``--output``, with NVFlare's server logs under ``nvflare/server/``.
A failed or aborted job still brings home what exists. Ctrl-C aborts the job on the deployment first.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
import time

from common.result_files import NVFLARE, matches

PROGRESS_MARK = "[edgesim] "
SERVER_LOGS = ("log.txt", "error_log.txt", "meta.json")


def find_server_app(downloaded: str) -> str | None:
    """The server's app folder in a downloaded job result (the one whose config is the server's)."""
    workspace = os.path.join(downloaded, "workspace")
    if not os.path.isdir(workspace):
        return None
    for name in sorted(os.listdir(workspace)):
        if os.path.exists(os.path.join(workspace, name, "config", "config_fed_server.json")):
            return os.path.join(workspace, name)
    return None


def bring_home(downloaded: str, results_dir: str, files: tuple[str, ...]) -> list[str]:
    """Copy the run's result ``files`` (names or glob patterns) found in a downloaded job result's server app folder
    into ``results_dir`` (the job's own ``config/`` and ``custom/`` are not among them); returns the names copied."""
    copied = []
    app = find_server_app(downloaded)
    if app is not None:
        for name in sorted(os.listdir(app)):
            if not matches(name, files):
                continue
            src, dst = os.path.join(app, name), os.path.join(results_dir, name)
            if os.path.isdir(src):
                shutil.copytree(src, dst, dirs_exist_ok=True)
            else:
                shutil.copy2(src, dst)
            copied.append(name)
    logs = os.path.join(results_dir, NVFLARE, "server")
    os.makedirs(logs, exist_ok=True)
    for name in SERVER_LOGS:
        src = os.path.join(downloaded, "workspace", name)
        if os.path.exists(src):
            shutil.copy2(src, os.path.join(logs, name))
    if os.path.exists(os.path.join(downloaded, "meta.json")):
        shutil.copy2(os.path.join(downloaded, "meta.json"), os.path.join(results_dir, NVFLARE, "job_meta.json"))
    return copied


def progress_lines(log_text: str) -> list[str]:
    """The server's ``[edgesim] ...`` progress lines in its log, without the log's own prefix."""
    return [line[line.index(PROGRESS_MARK) :] for line in log_text.splitlines() if PROGRESS_MARK in line]


class ProdFollower:
    """Follows a job through an admin Session of a provisioned deployment.

    Args:
        startup_kit: the admin's startup kit folder.
        username: the admin user.
        files: the run's result files to bring home (``bring_home``).
        poll: seconds between two looks at the job.
    """

    def __init__(self, startup_kit: str, username: str, files: tuple[str, ...], poll: float = 5.0):
        self.startup_kit, self.username, self.files, self.poll = startup_kit, username, files, poll

    @contextlib.contextmanager
    def _session(self):
        from nvflare.fuel.flare_api.flare_api import new_secure_session

        with contextlib.redirect_stdout(io.StringIO()):  # "Connecting to FLARE ..."
            session = new_secure_session(self.username, self.startup_kit)
        try:
            yield session
        finally:
            session.close()  # an unclosed Session keeps the interpreter from exiting

    def follow(self, job_id: str, results_dir: str) -> str:
        """Wait for the job (Ctrl-C aborts it), bring its results home; its final status."""
        with self._session() as session:
            try:
                status = self._wait(session, job_id)
            except KeyboardInterrupt:
                print(f"[edgesim] interrupted: aborting job {job_id} on the deployment", file=sys.stderr)
                session.abort_job(job_id)
                self._wait(session, job_id, quiet=True, timeout=120)
                self._download(session, job_id, results_dir)
                raise
            self._download(session, job_id, results_dir)
        return status

    def _wait(self, session, job_id: str, quiet: bool = False, timeout: float = 0.0) -> str:
        shown, last, started = set(), None, time.time()
        while True:
            status = session.get_job_status(job_id) or "UNKNOWN"
            if status != last and not quiet:
                print(f"[edgesim] job {job_id}: {status}")
            last = status
            if not quiet:
                with contextlib.suppress(Exception):  # progress is a nicety: a failed look is not an error
                    text = session.get_job_logs(job_id, "server").get("logs", {}).get("server", "")
                    for line in progress_lines(text):
                        if line not in shown:
                            shown.add(line)
                            print(line)
            if status.startswith("FINISHED"):
                return status
            if timeout and time.time() - started > timeout:
                return status
            time.sleep(self.poll)

    def _download(self, session, job_id: str, results_dir: str) -> None:
        with tempfile.TemporaryDirectory(prefix="download-", dir=results_dir) as tmp:
            try:
                downloaded = session.download_job_result(job_id, destination=tmp)
            except Exception as ex:  # nothing to download (a job that never ran)
                print(f"[edgesim] the job's result could not be downloaded: {ex}", file=sys.stderr)
                return
            copied = bring_home(downloaded, results_dir, self.files)
        print(f"[edgesim] brought home from the server: {', '.join(copied) or 'nothing'}")


def follow_poc(env, job_id: str, results_dir: str, files: tuple[str, ...], poll: float = 5.0) -> str:
    """The same through ``PocEnv``'s public methods (status only; the POC workspace is removed afterwards)."""
    last = None
    try:
        while True:
            with contextlib.redirect_stdout(io.StringIO()):  # "Connecting to FLARE ..." on every call
                status = env.get_job_status(job_id) or "UNKNOWN"
            if status != last:
                print(f"[edgesim] job {job_id}: {status}")
                last = status
            if status.startswith("FINISHED"):
                break
            time.sleep(poll)
    except KeyboardInterrupt:
        env.abort_job(job_id)
        raise
    finally:
        with contextlib.redirect_stdout(io.StringIO()):  # NVFlare's job monitor prints the job's meta, twice
            downloaded = env.get_job_result(job_id, timeout=60.0)
        if downloaded:
            print(
                f"[edgesim] brought home from the server: {', '.join(bring_home(downloaded, results_dir, files)) or 'nothing'}"
            )
        env.stop(clean_up=True)
    return last
