"""The server's intake of its children's reports (``ExactTimeAssessor``'s part): each report's devices registered,
its updates handed to the applier (diffs copied out of a child's shared memory, ``common.bulk_parent``), its leaves'
plans and lines passed on to the result components, and the reply built from the applier's last view (which
carries the child's news: ``scheduling.child_news``).

A mixin of ``scheduling.exact_assessor.ExactTimeAssessor``, whose constructor and run start set the state it uses
(``schedule``, ``applier``, ``links``, ``leaves``, ``global_model``, ``news``, the locks and counts)."""

from __future__ import annotations

from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.edge.mud import StateUpdateReply, StateUpdateReport

from common.protocol import (
    BULK,
    BULK_BELOW,
    HELD_VERSIONS,
    LEAF_INFO,
    LEAF_PLANS,
    LEAF_REPORTS,
    LEAVES_SEEN,
    MODELS,
)
from scheduling.child_reply import register_devices, reply_to

# seconds a report's reply may wait for the updates it brought to be applied (then it carries the selections they
# caused); a slower method (FedRevive's distillation) answers sooner, and the waker brings the news later
SETTLE_SECONDS = 0.05


class ChildIntake:
    """Each child's report in, its reply out (see the module docstring)."""

    def process_child_update(self, update: Shareable, fl_ctx: FLContext) -> tuple[bool, Shareable | None]:
        child = fl_ctx.get_peer_context().get_identity_name()
        received = False
        bulk_word, chosen = None, dict(self.links.choices)
        if self.global_model is not None:
            bulk_word = self.links.on_report(child, update.get(BULK), self.global_model)
            self.links.note_below(update.get(BULK_BELOW))
        with self._lock:  # each child's reports arrive on a thread of their own: the counts are kept under it
            self.reports += 1
            if self.schedule is None:
                return False, None
            report = StateUpdateReport.from_shareable(update)
            self.leaves.heard(child, update.get(LEAVES_SEEN))
            if self.applier is None:
                register_devices(self.schedule.pool, update, report, self.leaves.lost)
                if self._ready():
                    self._start(fl_ctx)
            else:
                with self.applier.lock:
                    register_devices(self.schedule.pool, update, report, self.leaves.lost)
            if self.applier is not None:
                updates, error = self.links.updates_of(child, update)
                if error:
                    self.log_error(fl_ctx, error)
                for u in updates:
                    refused = self.applier.receive(u)
                    if refused:
                        self.log_warning(fl_ctx, f"dropped an update: {refused}")
                received = bool(updates)
        plans, lines = update.get(LEAF_PLANS), update.get(LEAF_REPORTS)
        bulk = self.links.choices if self.links.choices != chosen else {}
        if plans or lines or bulk:  # recorded by the result components (evaluation)
            info = {"plans": plans or {}, "reports": lines or {}, "bulk": dict(bulk)}
            self.fire_event_with_data(LEAF_INFO, fl_ctx, LEAF_INFO, info)
        if received:  # answer with what they caused (new selections), unless applying them takes long
            self.applier.wait_settled(SETTLE_SECONDS)
        self.news.heard(child)
        if self.applier is None:
            reply = StateUpdateReply(0, None, 0, None).to_shareable()
        else:
            held = set(update.get(HELD_VERSIONS) or ())
            if self.links.ready(child):  # the versions it no longer views may be spilled, or their memory reused
                self.global_model.held_by(child, held)
            # real devices: every leaf may be asked by any device (the proxy's hash decides), so each hears everything
            leaves = self.schedule.pool.leaves if self.real_devices else self.leaves.leaves_of(child)
            applier = self.applier
            reply = reply_to(
                applier, leaves, report, held, lambda v: self.links.model(child, v, self.global_model, applier.model)
            )
            with self._lock:
                self.models_sent += len(reply.get(MODELS) or ())
        if bulk_word:
            reply[BULK] = bulk_word
        return True, reply
