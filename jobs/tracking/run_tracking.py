"""The driver's trackers for one run: opened before NVFlare starts, fed from the result files as they grow, ended
with the run, and never able to stop it.

* **Before anything starts** (``connect``, then ``start`` once the results folder is ready): each chosen client
  imports and opens its store; one that cannot is one line and exit 2 (``ConfigError``), before NVFlare starts.
  ``start`` creates the tracker runs, or with ``--resume`` continues the ones whose ids the checkpoint keeps
  (``checkpoint/tracking.json``: each run's id, store and the last version it holds).
* **During the run** (``with tracking:``, SimEnv): a thread of the driver reads ``metrics.json`` (rewritten by the
  server after every evaluation) and ``events.jsonl`` every second and logs what is new (``jobs.tracking.series``).
  On a deployment the results come home when the job ends, and ``finish`` logs them all then.
* **At the end** (``finish``, after the driver has drawn the plot and written the summary): the rest of the
  versions and staleness, the outcome and summary, the result files as artefacts, and the run's end status.

A tracker that fails (its store gone, a full disk, a network error) is reported once, on the console, and then left
alone for the rest of the run: the run goes on, and the result files, which only the server and the driver's own
code write, are complete whatever the tracker did. Its state keeps the last version it holds, so ``--resume``
continues it from there: a resumed run is one tracker run, each version logged once.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time

from common.choices import ConfigError
from common.jsonio import write_json_atomic
from common.result_files import CHECKPOINT, METRICS, TRACKING_STATE
from jobs.run.results import read_metrics
from jobs.tracking.choice import default_mlflow_uri, error_line, trackers_of
from jobs.tracking.mlflow_run import MlflowRun
from jobs.tracking.params import flat_params
from jobs.tracking.series import StalenessReader, artefacts
from jobs.tracking.wandb_run import WandbRun, wandb_dir

COST_SHARE = 20  # seconds between looks at the result files >= this x what the last look took


def state_file(results_dir: str) -> str:
    return os.path.join(results_dir, CHECKPOINT, TRACKING_STATE)


def read_state(results_dir: str | None) -> dict:
    """The tracker runs an earlier attempt of the run in ``results_dir`` logged to ({} when none)."""
    try:
        with open(state_file(results_dir or "")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def make_trackers(tracking: str, uri: str | None, parent: str | None, workspace: str) -> list:
    """The driver's trackers a ``--tracking`` value names, not yet connected."""
    chosen = trackers_of(tracking)
    found: list = []
    if "mlflow" in chosen:
        found.append(MlflowRun(uri or default_mlflow_uri(workspace), parent=parent))
    if "wandb" in chosen:
        found.append(WandbRun(wandb_dir(workspace)))
    return found


class RunTracking:
    """Args:
    trackers: ``MlflowRun`` / ``WandbRun`` objects (none: every call does nothing).
    saved: the state of an earlier attempt (``read_state``), for ``--resume``.
    interval: seconds between looks at the result files while the run goes on.
    """

    def __init__(self, trackers: list, saved: dict | None = None, interval: float = 1.0):
        self.trackers = trackers
        self.saved = saved or {}
        self.interval = interval
        self.state: dict[str, dict] = {}
        self.failed: set[str] = set()
        self.results_dir = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mtime = 0.0
        self._staleness: StalenessReader | None = None

    @classmethod
    def for_config(cls, cfg) -> RunTracking:
        """The trackers of a ``JobConfig`` (``run.tracking``); with ``--resume``, continuing the saved runs (in the
        saved MLflow store unless ``--tracking-uri`` names another)."""
        run = cfg.run
        saved = read_state(run.resume) if run.resume else {}
        uri = run.tracking_uri or (saved.get("mlflow") or {}).get("uri")
        return cls(make_trackers(run.tracking, uri, run.tracking_parent, run.workspace), saved)

    def connect(self) -> None:
        """Import each client and open its store; ``ConfigError`` (one line) for the first that cannot."""
        for tracker in self.trackers:
            tracker.connect()

    def start(self, results_dir: str, config: dict, flag_prefix: str = "") -> list[str]:
        """Create (or continue) each tracker's run for the run in ``results_dir`` with ``config``
        (``JobConfig.to_dict()``); ``ConfigError`` when one cannot. What to print: how to open each."""
        self.results_dir = results_dir
        params = flat_params(config, flag_prefix)
        tags = {"edgesim.results": results_dir, "edgesim.command": shlex.join([sys.executable, *sys.argv])}
        name = os.path.basename(results_dir.rstrip(os.sep))
        for tracker in self.trackers:
            saved = self.saved.get(tracker.name) or {}
            try:
                state = tracker.start(saved, name, params, tags)
            except Exception as ex:
                self._give_up(f"{tracker.name}: {error_line(ex)}")
                if isinstance(ex, ConfigError):
                    raise
                raise ConfigError(f"--tracking {tracker.name}: its run could not start ({error_line(ex)})") from ex
            kept = saved if state.get("run_id") == saved.get("run_id") else {}  # a new run starts from nothing
            versions = {k: kept.get(k, 0) for k in ("logged_version", "staleness_version")}
            self.state[tracker.name] = state | versions
        if self.trackers:
            after = min(s["staleness_version"] for s in self.state.values())
            self._staleness = StalenessReader(results_dir, after)
            self._save()
        return [t.describe() for t in self.trackers]

    def __enter__(self) -> RunTracking:
        if self.trackers and self.results_dir:
            self._thread = threading.Thread(target=self._follow, name="tracking", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _follow(self) -> None:
        # a long run's metrics.json grows: read it at most once per 20 x what a read costs (<= 5% of a core)
        pause = self.interval
        while not self._stop.wait(pause):
            started = time.perf_counter()
            self.log_new()
            pause = max(self.interval, COST_SHARE * (time.perf_counter() - started))

    def log_new(self, final: bool = False) -> None:
        """Log the versions and staleness rows the result files hold that each tracker does not yet have."""
        with self._lock:
            try:
                changed = os.path.getmtime(os.path.join(self.results_dir, METRICS))
            except OSError:
                changed = self._mtime
            records = read_metrics(self.results_dir).get("versions", []) if changed != self._mtime or final else []
            self._mtime = changed
            rows = self._staleness.read(final) if self._staleness is not None else {}
            for tracker in self.trackers:
                state = self.state[tracker.name]
                new = [r for r in records if r["version"] > state["logged_version"]]
                if new and self._safe(tracker, f"logging version {new[-1]['version']}", tracker.log_versions, new):
                    state["logged_version"] = new[-1]["version"]
                mine = {v: row for v, row in rows.items() if v > state["staleness_version"]}
                if mine and self._safe(tracker, "logging staleness", tracker.log_staleness, mine):
                    state["staleness_version"] = max(mine)
            if records or rows:
                self._save()

    def finish(self) -> list[str]:
        """End every tracker run: the rest of the run, its outcome and summary, its files. Called once the driver
        has written ``metrics.json``'s last word. What to print."""
        self.__exit__()
        if not self.trackers or not self.results_dir:
            return []
        self.log_new(final=True)
        metrics, files = read_metrics(self.results_dir), artefacts(self.results_dir)
        for tracker in self.trackers:
            if tracker.name in self.failed:  # what it took before failing is still written (W&B's service buffers)
                try:
                    tracker.abandon()
                except Exception:  # said once already
                    pass
            self._safe(tracker, "ending its run", tracker.finish, metrics, files)
        self._save()
        return [t.describe() for t in self.trackers if t.name not in self.failed]

    def _give_up(self, why: str) -> None:
        """A tracker could not start: the runs the others started end FAILED (the job will not run)."""
        for tracker in self.trackers:
            if tracker.name in self.state:
                try:
                    tracker.finish({"outcome": {"status": "stopped", "reason": f"a tracker did not start ({why})"}}, [])
                except Exception:  # the job stops with the first error's line anyway
                    pass

    def _safe(self, tracker, what: str, call, *args) -> bool:
        """``call(*args)``, unless the tracker failed before; a first failure is said once and the tracker left."""
        if tracker.name in self.failed:
            return False
        try:
            call(*args)
            return True
        except Exception as ex:  # any client's error: the run must not notice
            self.failed.add(tracker.name)
            print(
                f"[edgesim] warning: {tracker.name} tracking failed {what} ({error_line(ex)}); it records nothing more "
                "of this run, which goes on (metrics.json and the other result files are complete; --resume "
                "continues the tracker run from its last version)",
                file=sys.stderr,
                flush=True,
            )
            return False

    def _save(self) -> None:
        try:
            os.makedirs(os.path.dirname(state_file(self.results_dir)), exist_ok=True)
            write_json_atomic(state_file(self.results_dir), self.state)
        except OSError:
            pass  # a full disk: the next write tries again, and the run's own files are not ours
