"""Scores every scheduled global model version on the test split of the devices' own dataset source.

Unlike NVFlare's ``GlobalEvaluator`` it neither embeds data in the job config nor downloads: it loads the same
``DataConfig`` the devices use. For each evaluated version it fires ``VERSION_EVALUATED`` with a record::

    {"version", "accuracy", "loss" (the mean cross-entropy), "eval_seconds", "wall_seconds" (since the run
     started), "epoch" (wall clock),
     "sim_seconds" (simulated time of the version, when the global model reports one),
     "method" (the method's status, when it has one), "fleet" (devices online as it was made, of "devices", and
     the "updates" applied and "failed" so far), "server" (the strategy's wall seconds so far and when the version
     was made, ``aggregation.global_model.ServerWork``), "skipped" (how many versions were skipped before this one, if any) and "skipped_versions" (which),
     "per_user" (with per-user test data: the users' accuracy spread, ``evaluation.per_user``),
     "privacy" (with differential privacy: the accountant's inputs and the epsilon spent, ``docs/privacy.md``)}

Versions evaluated: 1, then every ``eval_frequency``-th, always ``max_model_version``, and the last version made
when the run ends earlier (``RUN_OUTCOME``: a time budget, a lost leaf).

Version 1 is the run's initial global model (``processors.models.initial_model``: a function of the model and the
seed), which the server only announces once every leaf has registered, when the leaves start training and take the
CPU. The evaluation thread therefore scores the initial model first, at START_RUN, while the leaves' processes are
still starting; version 1's record takes that accuracy when its weights are exactly the initial model's (every
array equal), and is evaluated as any other version otherwise. A resumed run, whose version 1 is recorded
already, does not.

Evaluation runs on a thread of its own, on the version's weights (each version is a new, never-modified dict),
so the server keeps answering the leaves while a large model is scored (a ResNet-18 evaluation takes about a
minute on a 2-core CPU, longer than a leaf waits for its parent's reply). With ``backlog`` ``wait`` (the default)
every scheduled version is evaluated, in order, however far behind, so a seed's accuracy curve is the same on any
machine and under any load (a sweep's pruner compares these curves). With ``skip`` (opt-in: speed over a complete
curve) a newer scheduled version supersedes the ones still waiting when it falls behind: they are not evaluated,
and the next record says which were skipped (``skipped``, ``skipped_versions``). The last version of the run is
never skipped: nothing comes after it. END_RUN waits for the
evaluation under way and the ones still waiting, so the run's last version is always evaluated and recorded.

On the CPU the evaluation thread computes with half the cores (``eval_threads``): the applier, NVFlare's transport
and, in the simulator, the leaves run beside it. With every core, the OpenMP worker that each of torch's parallel
regions wakes spins after it for more CPU than the region took: on 2 cores an evaluation with every core costs
several times the CPU of one with one thread, and takes more wall time (PERFORMANCE_OPTIMIZATION.md, "The
figures behind rules in the code"). Only this thread's OpenMP count is set (``limit_this_thread``):
``torch.set_num_threads`` would also set the count every thread starting torch work later takes, FedRevive's
distillation on the applier thread among them, and change its bits.

While it scores a version the evaluation thread beats (``common.heartbeat``: ``working.json`` in the results
folder), so the driver's watchdog, which stops a job that makes no progress after its outcome, knows a slow
evaluation from a hang. When the run's outcome is decided, its last version is handed to the model saver
(``VERSION_MADE_LAST``) before it is evaluated: ``global_model.pt`` holds it even if its evaluation never ends.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

import numpy as np
import torch
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.app_common.app_event_type import AppEventType

from common.choices import EvalBacklog
from common.cores import available_cores
from common.heartbeat import Heartbeat
from common.privacy_accounting import with_epsilon
from common.protocol import (
    CHECKPOINT_DUE,
    FLEET,
    METHOD_STATUS,
    NEW_VERSION,
    NEW_WEIGHTS,
    PRIVACY,
    RUN_OUTCOME,
    RUN_RESUMED,
    SERVER_WORK,
    SIM_TIME,
)
from common.run_scope import mark, scoped
from evaluation.events import VERSION_EVALUATED, VERSION_MADE_LAST, VERSION_RECORD, VERSION_WEIGHTS
from evaluation.per_user import per_user_accuracy
from evaluation.schedule import is_scheduled
from processors.data.config import DataConfig
from processors.data.sources import load_dataset
from processors.device import resolve_device
from processors.models import build_model, initial_model
from processors.precision import use_precision
from processors.training import evaluate


def load_into(net: torch.nn.Module, weights: dict) -> torch.nn.Module:
    """Copy ``weights`` into ``net`` (entries it lacks keep the net's own values), with each tensor's own dtype."""
    device = next(net.parameters()).device
    own = net.state_dict()
    state = {
        k: torch.as_tensor(np.asarray(weights[k])).to(device=device, dtype=own[k].dtype).view_as(own[k])
        if k in weights
        else own[k]
        for k in own
    }
    net.load_state_dict(state)
    return net


def eval_threads(device: torch.device) -> int:
    """Intra-op threads of the evaluation thread: half the cores on the CPU (see the module docstring); a GPU's
    evaluation keeps torch's default."""
    if device.type != "cpu":
        return torch.get_num_threads()
    return max(1, available_cores() // 2)


def limit_this_thread(threads: int) -> None:
    """The calling thread's OpenMP thread count (torch's intra-op threads here), leaving every other thread's and
    the count threads starting later take (see the module docstring). Where torch brings no libgomp of its own (not
    a Linux wheel), nothing changes."""
    if threads >= torch.get_num_threads():  # also torch's own set-up of this thread's count, which comes first
        return
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    if os.path.exists(path):
        ctypes.CDLL(path).omp_set_num_threads(threads)  # the library torch loaded: OpenMP's per-thread setting


class Scorer:
    """A model and the test split of a run's data, on the run's device: what scores a version's weights (the
    evaluator's, and ``python -m jobs.finish``'s for a version saved but not evaluated during the run).

    Args: as ``GlobalModelEvaluator``'s ``model``, ``data``, ``seed``, ``compute_device`` and ``precision``.
    """

    def __init__(self, model: str, data: dict, seed: int = 0, compute_device: str = "auto", precision: str = "fp32"):
        device = resolve_device(compute_device)
        use_precision(precision, device)  # this process's TF32 switches (CUDA only)
        self.net = build_model(model).to(device)
        loaded = load_dataset(DataConfig(**data).spec(seed))
        self._test = (loaded.x_test.to(device), loaded.y_test.to(device))
        self._prepare = loaded.prepare
        users = loaded.users  # per-user test data (LEAF's evaluation): the spread over the users too
        self._user_offsets = users.test_offsets if users is not None else None

    def score(self, weights: dict) -> tuple[float, float, dict | None]:
        """Accuracy and loss of ``weights`` on the test split, and with per-user test data the users' spread."""
        net = load_into(self.net, weights)
        if self._user_offsets is None:
            return (*evaluate(net, *self._test, prepare=self._prepare), None)
        return per_user_accuracy(net, *self._test, self._user_offsets, self._prepare)


class GlobalModelEvaluator(FLComponent):
    """Args:
    model: model name (``processors.models``).
    data: ``DataConfig.to_dict()``.
    seed: the run seed (the synthetic dataset depends on it).
    compute_device: torch device the evaluation runs on.
    eval_frequency: evaluate every N versions.
    max_model_version: the last version, always evaluated.
    backlog: ``skip`` (a newer scheduled version supersedes the waiting ones) or ``wait`` (evaluate each).
    precision: the run's ``--precision``: its TF32 switches on CUDA (``processors.precision``); evaluation itself
        stays float32 (no autocast), so every method's curve is scored alike.
    results_dir: the run's results folder, where the evaluation thread beats ("": the server app's run folder).
    run: in a pack, the run it evaluates (``common.run_scope``); None: the job's one run.
    """

    def __init__(
        self,
        model: str,
        data: dict,
        seed: int = 0,
        compute_device: str = "auto",
        eval_frequency: int = 1,
        max_model_version: int = 0,
        backlog: EvalBacklog = "wait",
        precision: str = "fp32",
        results_dir: str = "",
        run: int | None = None,
    ):
        super().__init__()
        self.run = run
        self.precision = precision
        self.results_dir = results_dir
        self._out = ""
        self.model = model
        self.data = data
        self.seed = seed
        self.compute_device = compute_device
        self.eval_frequency = eval_frequency
        self.max_model_version = max_model_version
        self.backlog = backlog
        self._scorer: Scorer | None = None
        self._start = 0.0
        self._engine = None
        self._latest: tuple | None = None  # (version, weights, sim time, ...) of the newest version
        self._evaluated: set[int] = set()  # versions submitted (evaluated, waiting or skipped)
        self._waiting: list[tuple] = []  # (version, weights, sim time, method status), oldest first
        self._skipped: list[int] = []  # versions superseded since the last evaluated one
        self._evaluating: int | None = None  # the version being evaluated now
        self._closing = False
        self._cond = threading.Condition()
        self._wall_offset = 0.0
        self._thread: threading.Thread | None = None
        self._initial: tuple[dict, tuple, float] | None = None  # weights, scores (``_score``), seconds
        self._ahead = False  # version 1 is being (or was) scored at START_RUN: no newer version supersedes it
        self.register_event_handler(EventType.START_RUN, self._start_run)
        self.register_event_handler(AppEventType.GLOBAL_WEIGHTS_UPDATED, scoped(run, self._on_version))
        self.register_event_handler(RUN_OUTCOME, scoped(run, self._on_outcome))
        self.register_event_handler(RUN_RESUMED, scoped(run, self._on_resume))
        self.register_event_handler(CHECKPOINT_DUE, scoped(run, self._before_checkpoint))
        self.register_event_handler(EventType.END_RUN, self._end_run)

    def _start_run(self, _event: str, fl_ctx: FLContext) -> None:
        self._start = time.time()
        self._engine = fl_ctx.get_engine()
        # where it beats: the results folder, else the app's (common.output); none on a stand-in engine without one
        self._out = self.results_dir or fl_ctx.get_prop(FLContextKey.APP_ROOT) or ""
        self._scorer = Scorer(self.model, self.data, self.seed, self.compute_device, self.precision)
        # a resumed run recorded version 1 already (RUN_RESUMED comes from the assessor's START_RUN, before ours)
        initial = None
        self._ahead = 1 not in self._evaluated
        if self._ahead:
            with torch.random.fork_rng(devices=[]):  # torch's generator as it was: a run's draws stay the same
                initial = {
                    k: v.detach().cpu().numpy() for k, v in initial_model(self.model, self.seed).state_dict().items()
                }
        self._thread = threading.Thread(target=self._run, args=(initial,), name="evaluator", daemon=True)
        self._thread.start()

    def _on_version(self, _event: str, fl_ctx: FLContext) -> None:
        # the version's own (not sticky) copy: NVFlare's sticky CURRENT_ROUND may be another run's in a pack
        version = int(fl_ctx.get_prop(NEW_VERSION) or 0)
        self._latest = (
            version,
            fl_ctx.get_prop(NEW_WEIGHTS),
            fl_ctx.get_prop(SIM_TIME),
            fl_ctx.get_prop(METHOD_STATUS),
            fl_ctx.get_prop(FLEET),
            fl_ctx.get_prop(SERVER_WORK),
            fl_ctx.get_prop(PRIVACY),
        )
        if is_scheduled(version, self.eval_frequency, self.max_model_version):
            self._submit(self._latest)

    def _on_resume(self, _event: str, fl_ctx: FLContext) -> None:
        meta = fl_ctx.get_prop(RUN_RESUMED)
        self._wall_offset = meta["wall_seconds"]  # wall seconds continue from the interrupted run's
        self._evaluated.update(range(1, meta["version"] + 1))

    def _before_checkpoint(self, _event: str, fl_ctx: FLContext) -> None:
        """With ``backlog`` ``wait``, every scheduled version up to the checkpoint's is recorded before it is
        written: a run resumed from it starts after them (``skip`` may drop pending versions anyway)."""
        version = fl_ctx.get_prop(CHECKPOINT_DUE)
        if self.backlog != "wait" or self._thread is None:
            return
        with self._cond:
            while any(v <= version for v in self._owed()):
                self._cond.wait(0.5)

    def _owed(self) -> list[int]:
        """Versions submitted and not recorded yet (under ``_cond``)."""
        return [item[0] for item in self._waiting] + ([self._evaluating] if self._evaluating is not None else [])

    def _on_outcome(self, _event: str, fl_ctx: FLContext) -> None:
        if self._latest is not None:  # the run ended: its last version is saved now, and always scored
            version, weights = self._latest[:2]
            fl_ctx.set_prop(VERSION_WEIGHTS, weights, private=True, sticky=False)
            self.fire_event_with_data(VERSION_MADE_LAST, fl_ctx, VERSION_RECORD, {"version": version})
            self._submit(self._latest)

    def _submit(self, item: tuple) -> None:
        with self._cond:
            if item[0] in self._evaluated:
                return
            self._evaluated.add(item[0])
            if self.backlog == "skip":  # the newest supersedes what still waits, except a version 1 scored ahead
                kept = [w for w in self._waiting if w[0] == 1 and self._ahead]
                self._skipped += [w[0] for w in self._waiting if w not in kept]
                self._waiting[:] = kept
            self._waiting.append(item)
            self._cond.notify()

    def _end_run(self, _event: str, fl_ctx: FLContext) -> None:
        if self._thread is not None:
            with self._cond:
                self._closing = True
                self._cond.notify()
            self._thread.join()  # the waiting evaluations finish: the last one is the run's result
            self._thread = None

    def _next(self) -> tuple[tuple, list[int]] | None:
        """The next version to evaluate and those skipped before it; None once closed and drained."""
        with self._cond:
            while not self._waiting and not self._closing:
                self._cond.wait()
            if not self._waiting:
                return None
            skipped, self._skipped = self._skipped, []
            item = self._waiting.pop(0)
            self._evaluating = item[0]
            return item, skipped

    def _score(self, weights: dict) -> tuple[float, float, dict | None]:
        """Accuracy and loss of ``weights`` on the test split, and with per-user test data the users' spread."""
        return self._scorer.score(weights)

    def _score_initial(self, weights: dict) -> None:
        """Score the run's initial model ahead of version 1 (see the module docstring)."""
        started = time.time()
        with Heartbeat(self._out, "evaluating", 1):
            scores = self._score(weights)
        self._initial = (weights, scores, time.time() - started)

    def _scored_ahead(self, version: int, weights: dict) -> tuple[tuple, float] | None:
        """Version 1's scores and seconds, scored at START_RUN, if its weights are the initial model's."""
        if version != 1 or self._initial is None:
            return None
        initial, scores, seconds = self._initial
        self._initial = None
        same = initial.keys() == weights.keys() and all(
            np.array_equal(np.asarray(weights[k]), v) and np.asarray(weights[k]).dtype == v.dtype
            for k, v in initial.items()
        )
        return (scores, seconds) if same else None

    def _run(self, initial: dict | None = None) -> None:
        limit_this_thread(eval_threads(next(self._scorer.net.parameters()).device))
        if initial is not None:
            self._score_initial(initial)
        while (job := self._next()) is not None:
            (version, weights, sim_time, status, fleet, server, privacy), skipped = job
            started = time.time()
            scored = self._scored_ahead(version, weights)
            if scored is None:
                with Heartbeat(self._out, "evaluating", version):
                    scores = self._score(weights)
                (accuracy, loss, spread), eval_seconds = scores, time.time() - started
            else:
                (accuracy, loss, spread), eval_seconds = scored
            now = time.time()
            record = {
                "version": version,
                "accuracy": round(accuracy, 5),
                "loss": round(loss, 5),
                "wall_seconds": round(self._wall_offset + now - self._start, 3),
                "eval_seconds": round(eval_seconds, 3),
                "epoch": round(now, 3),
            }
            if spread is not None:
                record["per_user"] = spread
            if sim_time is not None:
                record["sim_seconds"] = round(float(sim_time), 6)
            if skipped:
                record["skipped"] = len(skipped)
                record["skipped_versions"] = skipped
            if status:
                record["method"] = status
            if fleet:
                record["fleet"] = fleet
            if server:
                record["server"] = server
            if privacy:  # the accountant's inputs and the epsilon they spend, computed here, off the server's path
                record["privacy"] = with_epsilon(privacy)
            fl_ctx = mark(self._engine.new_context(), self.run)
            fl_ctx.set_prop(VERSION_WEIGHTS, weights, private=True, sticky=False)
            self.fire_event_with_data(VERSION_EVALUATED, fl_ctx, VERSION_RECORD, record)
            with self._cond:  # recorded (the recorder writes on VERSION_EVALUATED): nothing owed for it now
                self._evaluating = None
                self._cond.notify_all()
