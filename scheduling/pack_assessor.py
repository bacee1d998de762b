"""A pack's server: several runs in one NVFlare job (``docs/packs.md``), each with its own exact time.

``PackAssessor`` holds one ``scheduling.run_server.RunServer`` per run (its schedule, applier thread, global model,
``events.jsonl``, checkpoints and outcome, exactly as ``ExactTimeAssessor`` holds its one) and what the job has
once: the leaves (every run's pool holds every leaf's devices), their watch and the wake messages. Each report's
parts go to their runs (``common.protocol``: an update names its run; run 1's and later runs' held versions and
selection version travel in their sections), and the reply carries each run's part from that run's applier, run 0's
where a standalone job's is. Each run's applier applies its own updates in its own arrival order, so each run's
trace is its standalone trace whatever the others do. The job ends when every run has ended; devices that never
all registered end every run, and so does a lost leaf with ``--on-leaf-loss stop``; with ``continue`` every run
goes on without it (``RunServer.lose_leaves``: a run waiting for a place begins on the living leaves). One run ends
early, the others going on, when a ``STOP_REQUEST`` file appears in its results folder (a sweep pruning one trial
of a pack).

With ``at_once``, only that many runs go at a time and the rest wait in order: when a run ends (completed, pruned,
stopped) the next waiting run joins the running job, its schedule starting at simulated time 0 as its own job's
would, and its releases numbered on the leaves' lock-step from the highest release made so far (``release_offset``),
so the leaves never wait for a run that has not begun and the newcomer's release 1 trains beside the others' next.

A leaf on this machine shares memory with the pack's server (``common.bulk_parent``'s links): its diffs of every run
are copied out of its ring as its report is read, and each run's global model keeps its versions in a ring of its
own, which the leaf maps (the answer to its offer names run 0's ring as a standalone job's does and the later runs'
in ``runs``); a version goes down as a handle of its run's ring, leased to the leaf until the run's section of a
report says it holds it no more. When a run's model keeps no ring, the links carry diffs up only and every version
travels on NVFlare's wire. Not yet here (``docs/packs.md``, "Order of work"): real devices.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.edge.assessor import Assessment, Assessor
from nvflare.edge.mud import BaseState, PropKey, StateUpdateReply, StateUpdateReport

from common.nvflare_private import install_nvflare_fixes
from common.protocol import (
    AWAITED,
    BULK,
    BULK_BELOW,
    HELD_VERSIONS,
    LEAF_INFO,
    LEAF_PLANS,
    LEAF_REPORTS,
    LEAVES_SEEN,
    MODELS,
    RELEASES,
    RUN_JOINED,
    SELECTION_RELEASES,
    SELECTION_VERSIONS,
    run_section,
    sections_of,
)
from common.result_files import STOP_REQUEST
from common.run_scope import mark
from scheduling.child_intake import SETTLE_SECONDS
from scheduling.child_news import ChildNews
from scheduling.child_reply import register_devices, reply_to
from scheduling.leaf_watch import LeafWatch
from scheduling.pack_links import PackLinks
from scheduling.run_server import RunOptions, RunServer

# the keys of a reply that concern one run: a later run's section carries these (``simulation.run_tables``), and
# its selection's version, which run 0's reply carries as a header
RUN_REPLY_KEYS = (
    PropKey.DEVICE_SELECTION,
    MODELS,
    AWAITED,
    SELECTION_VERSIONS,
    SELECTION_RELEASES,
    RELEASES,
)


class PackAssessor(Assessor):
    """Args:
    runs: each run's settings, as ``RunOptions``' keyword arguments (run 0 first); each names its own
        persistor, global model and results folder.
    num_leaves: leaves whose devices must all be registered before the first selection.
    device_wait_timeout: seconds to wait for the leaves' devices before stopping every run.
    leaf_timeout: seconds of silence after which a leaf is lost.
    on_leaf_loss: ``stop`` (every run ends) or ``continue`` (every run goes on with the living leaves).
    at_once: runs going at a time, the first ones first; each later run waits for one to end, then joins the
        running job (0: every run from the start).
    bulk: the runs' ``--bulk``: ``auto`` (a leaf that shares this machine and user sends its diffs and gets its
        versions through shared memory), ``shm`` (the same, and a leaf that cannot stops every run) or ``wire``.
    """

    def __init__(
        self,
        runs: list[dict],
        num_leaves: int,
        device_wait_timeout: float = 120.0,
        leaf_timeout: float = 60.0,
        at_once: int = 0,
        on_leaf_loss: str = "stop",
        bulk: str = "auto",
    ):
        super().__init__()
        install_nvflare_fixes()
        self.runs = runs  # NVFlare writes each argument from the attribute of its name
        self.num_leaves = num_leaves
        self.device_wait_timeout = device_wait_timeout
        self.leaf_timeout = leaf_timeout
        self.at_once = at_once  # NVFlare writes each argument from the attribute of its name
        self.on_leaf_loss = on_leaf_loss
        self.bulk = bulk
        self.leaves = LeafWatch(leaf_timeout)
        # every run's pool holds the same devices on the same leaves: run 0's says where a device is
        self.news = ChildNews(self.leaves, lambda device: self.servers[0].schedule.pool.leaf_of(device))
        self.servers = [
            RunServer(RunOptions(**opts, leaf_timeout=leaf_timeout, run=run), self, self._released, self.news.wake_for)
            for run, opts in enumerate(runs)
        ]
        self.links = PackLinks(bulk, self.logger.info, self.servers)
        self.started = False
        # each run begun -> where its releases start on the leaves' lock-step (0 for those begun with the job)
        self.offsets: dict[int, int] = {}
        self.reports = 0
        self.leaf_plans: dict[str, dict] = {}  # each leaf's plan, for a run's recorder when it begins
        self._lock = threading.Lock()
        self._waiting_since = time.time()
        self.register_event_handler(EventType.START_RUN, self._start_run)
        self.register_event_handler(EventType.END_RUN, self._end_run)

    def _released(self, devices: list[str]) -> None:
        """A run released ``devices``: every child has news, not only theirs, since each leaf trains release n of
        every run together once every run has made it (``RELEASES``): a leaf waiting for this run's release count
        is woken when the applier next waits."""
        self.news.note(devices)
        self.news.note_leaves(self.servers[0].schedule.pool.leaves)

    # -- the job's start and end ----------------------------------------------------------------------------------
    def _start_run(self, _event: str, fl_ctx: FLContext) -> None:
        engine = fl_ctx.get_engine()
        for server in self.servers:
            if not server.start_run(fl_ctx):
                return
        self._waiting_since = time.time()
        self.leaves.set_hierarchy(fl_ctx.get_prop(FLContextKey.CLIENT_HIERARCHY))
        self.news.start(engine, lambda msg: self.log_warning(fl_ctx, msg))
        for server in self.servers:
            if server.options.resume:
                server.resume(fl_ctx)

    def _end_run(self, _event: str, fl_ctx: FLContext) -> None:
        for server in self.servers:
            server.stop()
        self.news.stop()
        for server in self.servers:
            if server.outcome is None and server.applier is None:
                server.finish("stopped", "the job ended before the run had a place to begin", fl_ctx)
            elif server.outcome is None:
                server.finish("stopped", "the run was aborted before its last version", fl_ctx)
            server.close()

    def start_task(self, fl_ctx: FLContext) -> Shareable:
        return BaseState(model_version=0, model=None, device_selection_version=0, device_selection={}).to_shareable()

    # -- reports in, replies out ------------------------------------------------------------------------------------
    def process_child_update(self, update: Shareable, fl_ctx: FLContext) -> tuple[bool, Shareable | None]:
        child = fl_ctx.get_peer_context().get_identity_name()
        received = []
        bulk_word, chosen = None, dict(self.links.choices)
        if self.servers[0].schedule is not None:
            bulk_word = self.links.take(child, update.get(BULK))
            self.links.note_below(update.get(BULK_BELOW))
        with self._lock:
            self.reports += 1
            if self.servers[0].schedule is None:
                return False, None
            report = StateUpdateReport.from_shareable(update)
            self.leaves.heard(child, update.get(LEAVES_SEEN))
            for server in self.servers:
                if server.applier is None:
                    register_devices(server.schedule.pool, update, report, self.leaves.lost)
                else:
                    with server.applier.lock:
                        register_devices(server.schedule.pool, update, report, self.leaves.lost)
            # every run's pool: a resumed run's is restored with the leaves it had, a new run's holds those heard
            if not self.started and all(len(s.schedule.pool.leaves) >= self.num_leaves for s in self.servers):
                first = len(self.servers) if self.at_once <= 0 else min(self.at_once, len(self.servers))
                waiting = f", {len(self.servers) - first} waiting for a place" if first < len(self.servers) else ""
                self.log_info(fl_ctx, f"all {self.num_leaves} leaves registered: starting {first} runs{waiting}")
                self.started = True
                for run in range(first):
                    self._begin(run, 0, fl_ctx)
            bulk = self.links.choices if self.links.choices != chosen else {}
            leaf_info = self._leaf_info(update.get(LEAF_PLANS) or {}, update.get(LEAF_REPORTS) or {}, bulk)
            if self.started:
                updates, error = self.links.updates_of(child, update)
                if error:
                    self.log_error(fl_ctx, error)
                for u in updates:
                    server = self.servers[u.run]
                    refused = server.applier.receive(u)
                    if refused:
                        self.log_warning(fl_ctx, f"run {u.run}: dropped an update: {refused}")
                    received.append(server)
        for run, info in leaf_info:  # written by the run's leaf log and recorder: outside the lock, as standalone
            self.fire_event_with_data(LEAF_INFO, mark(fl_ctx, run), LEAF_INFO, info)
        for server in {id(s): s for s in received}.values():
            server.applier.wait_settled(SETTLE_SECONDS)
        self.news.heard(child)
        if not self.started:
            reply = StateUpdateReply(0, None, 0, None).to_shareable()
            if bulk_word:
                reply[BULK] = bulk_word
            return True, reply
        leaves = self.leaves.leaves_of(child)
        sections = sections_of(update)
        reply = None
        for run, server in enumerate(self.servers):
            section = sections.get(run) or {}
            if run not in self.offsets:  # waiting (or never begun): no release, and no lock-step wait for it
                run_section(reply, run)[RELEASES] = [0, True]
                continue
            if run:
                selection_version = section.get(PropKey.DEVICE_SELECTION_VERSION, 0)
                asked = StateUpdateReport(0, selection_version, None, None)
            else:
                asked = report
            held = set(section.get(HELD_VERSIONS) or ())
            if self.links.ready(child):  # the versions it no longer views may be spilled, or their memory reused
                server.global_model.held_by(child, held)
            model = self.links.model_of(child, server)
            part = reply_to(server.applier, leaves, asked, held, model, release_offset=self.offsets[run])
            if not run:
                reply = part
            else:
                out = run_section(reply, run)
                out.update({k: part[k] for k in RUN_REPLY_KEYS if k in part})
                out[PropKey.DEVICE_SELECTION_VERSION] = part.get_header(PropKey.DEVICE_SELECTION_VERSION)
        if bulk_word:
            reply[BULK] = bulk_word
        return True, reply

    def _leaf_info(
        self, plans: dict[str, dict], lines: dict[str, list[dict]], bulk: dict[str, str]
    ) -> list[tuple[int, dict]]:
        """Each begun run's share of the leaves' report lines (a line names its run; run 0's none) with the leaves'
        plans and the leaves' bulk links, when they changed: the ``LEAF_INFO`` each run's leaf log and recorder take,
        as a standalone run's do (called under the lock; fired after it)."""
        self.leaf_plans.update(plans)
        by_run: dict[int, dict[str, list[dict]]] = {}
        for leaf, leaf_lines in lines.items():
            for line in leaf_lines:
                run = line.pop("run", 0)
                by_run.setdefault(run, {}).setdefault(leaf, []).append(line)
        return [
            (run, {"plans": plans, "reports": by_run.get(run, {}), "bulk": dict(bulk)})
            for run in sorted(self.offsets)
            if plans or bulk or run in by_run
        ]

    # -- runs begun, with the job or joining it -------------------------------------------------------------------
    def _begin(self, run: int, offset: int, fl_ctx: FLContext) -> None:
        """Begin ``run`` (its first selection and version, its applier), its releases numbered on the leaves'
        lock-step from ``offset``; a resumed run's applier has begun already (``RunServer.resume``)."""
        server = self.servers[run]
        self.offsets[run] = offset
        if server.applier is None:
            server.start(fl_ctx)
        if self.leaf_plans or self.links.choices:  # settled before this run began: its recorder records them too
            info = {"plans": dict(self.leaf_plans), "reports": {}, "bulk": dict(self.links.choices)}
            self.fire_event_with_data(LEAF_INFO, mark(fl_ctx, run), LEAF_INFO, info)

    def _join_waiting(self, fl_ctx: FLContext) -> None:
        """While fewer than ``at_once`` runs go, the next waiting run joins the running job (called under the
        lock). Its release 1 is the lock-step's ``offset + 1``, ``offset`` the most releases any run has made: no
        leaf has handed out a later release of any run yet (a leaf trains release n once every live run has made
        it), so the newcomer's releases train beside the others' next ones, never behind them."""
        if self.at_once <= 0:
            return
        joined = []
        while sum(1 for r in self.offsets if self.servers[r].outcome is None) < self.at_once:
            run = next((r for r, s in enumerate(self.servers) if r not in self.offsets and s.outcome is None), None)
            if run is None:
                break
            offset = max(self.offsets[r] + self.servers[r].applier.releases for r in self.offsets)
            mark(fl_ctx, run)
            self.fire_event_with_data(RUN_JOINED, fl_ctx, RUN_JOINED, {"offset": offset})
            self.log_info(
                fl_ctx,
                f"run {run} joins the running job: a place is free; its release 1 is release "
                f"{offset + 1} of the leaves' lock-step",
            )
            self._begin(run, offset, fl_ctx)
            joined.append(run)
        if joined:  # every leaf has news: the newcomer's devices, and its release count for the lock-step
            self.news.note_leaves(self.servers[0].schedule.pool.leaves)

    # -- the job's end: every run's ------------------------------------------------------------------------------
    def assess(self, fl_ctx: FLContext) -> Assessment:
        with self._lock:
            live = [s for s in self.servers if s.outcome is None]
            if not live:
                return Assessment.WORKFLOW_DONE
            if self.servers[0].schedule is None:
                return Assessment.CONTINUE
            if not self.started:
                if time.time() - self._waiting_since > self.device_wait_timeout:
                    pool = self.servers[0].schedule.pool
                    reason = (
                        f"only leaves {sorted(pool.leaves)} of {self.num_leaves} registered devices within "
                        f"--device-wait-timeout {self.device_wait_timeout:g} s"
                    )
                    for server in live:
                        server.finish("stopped", reason, fl_ctx)
                    return Assessment.WORKFLOW_DONE
                return Assessment.CONTINUE
            # an update lost (no run can go on exactly), or with --bulk shm a leaf that cannot share memory
            bulk = self.links.error or self.links.required_failure
            if bulk:
                for server in live:
                    with server.applier.lock if server.applier is not None else contextlib.nullcontext():
                        server.finish("stopped", bulk, fl_ctx)
                return Assessment.WORKFLOW_DONE
            lost = self.leaves.newly_lost()
            for leaf in lost:  # its ring unmapped here
                self.links.forget(leaf)
            names = ", ".join(sorted(lost))
            go_on = self.on_leaf_loss == "continue"
            if lost and go_on:
                self.log_error(
                    fl_ctx,
                    f"leaf {names} lost: every run goes on without it, its in-flight devices count as failed, its "
                    "devices are never selected again (--on-leaf-loss continue)",
                )
            stopped = [s for s in live if self._stop_requested(s, fl_ctx)]
            for server in live:
                if server in stopped:
                    continue
                if server.applier is None:  # waiting for a place: it begins on the living leaves, or not at all
                    if lost and go_on:
                        server.lose_leaves(lost)
                    elif lost:
                        server.finish("stopped", f"leaf {names} was lost before the run began", fl_ctx)
                    continue
                with server.applier.lock:
                    if lost and not go_on:
                        reason = f"leaf {names} sent nothing for {self.leaf_timeout:g} s (--leaf-timeout): lost"
                        server.finish("stopped", reason + " (--on-leaf-loss stop)", fl_ctx)
                        continue
                    if lost:
                        server.lose_leaves(lost)
                    server.check_end(fl_ctx)
        for server in stopped:  # its applier's thread joined outside the lock its replies take
            server.stop()
        with self._lock:
            self._join_waiting(fl_ctx)
            done = all(s.outcome is not None for s in self.servers)
        return Assessment.WORKFLOW_DONE if done else Assessment.CONTINUE

    def _stop_requested(self, server: RunServer, fl_ctx: FLContext) -> bool:
        """Whether a request to end ``server``'s run (``STOP_REQUEST`` in its results folder: the sweep pruned its
        trial) has come; if so the run is finished ``pruned`` with the request's reason. Its applier stops after
        (``assess``): it makes no more releases, so the leaves' lock-step no longer waits for it (``RELEASES``' ended),
        and the other runs go on, or a waiting run takes its place. A run still waiting for a place ends so too."""
        path = os.path.join(server.out, STOP_REQUEST)
        if not server.out or not os.path.exists(path):
            return False
        try:
            with open(path) as f:
                reason = str(json.load(f).get("reason") or "")
        except (OSError, ValueError, AttributeError):
            reason = ""
        reason = reason or "stopped on request (its stop_request.json)"
        if server.applier is None:
            server.finish("pruned", reason, fl_ctx)
            return True
        with server.applier.lock:
            server.finish("pruned", reason, fl_ctx)
        return True
