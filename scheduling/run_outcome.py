"""When the server's run is over, and how it says so (``ExactTimeAssessor``'s part): NVFlare's workflow asks
``assess`` every ``assess_interval``; the run ends when the schedule is done (the last version or the time budget),
a leaf is lost (``--on-leaf-loss stop``; with ``continue`` its in-flight devices fail and its devices leave the
pool), the devices never all registered, an update could not be applied or read, or the devices keep failing. The
outcome is fired as ``RUN_OUTCOME`` for the result components.

A mixin of ``scheduling.exact_assessor.ExactTimeAssessor``, whose constructor and run start set the state it uses
(``run_server``, and through it ``schedule``, ``applier``, ``global_model``, ``outcome``; ``leaves``, ``links``,
its options, ``_lock``); the run's own end (its last version, its time budget, its applier's error) is the run
server's (``scheduling.run_server.RunServer.check_end``)."""

from __future__ import annotations

import time

from nvflare.apis.fl_context import FLContext
from nvflare.edge.assessor import Assessment


class RunOutcome:
    """``assess`` and the run's end (see the module docstring)."""

    def _finish(self, status: str, reason: str, fl_ctx: FLContext) -> None:
        self.run_server.finish(status, reason, fl_ctx)

    def assess(self, fl_ctx: FLContext) -> Assessment:
        with self._lock:
            if self.outcome is not None:
                return Assessment.WORKFLOW_DONE
            s = self.schedule
            if s is None:
                return Assessment.CONTINUE
            if not s.version:
                if time.time() - self._waiting_since > self.device_wait_timeout:
                    self._finish("stopped", self._not_ready_reason(), fl_ctx)
                    return Assessment.WORKFLOW_DONE
                return Assessment.CONTINUE
            with self.applier.lock:  # the applier thread changes the schedule
                self._check_leaves(fl_ctx)
                if self.outcome is not None:
                    return Assessment.WORKFLOW_DONE
                bulk = self.links.error or self.links.required_failure
                if bulk:
                    self._finish("stopped", bulk, fl_ctx)
                else:
                    self.run_server.check_end(fl_ctx)
            return Assessment.WORKFLOW_DONE if self.outcome is not None else Assessment.CONTINUE

    def _not_ready_reason(self) -> str:
        wait = f"within --device-wait-timeout {self.device_wait_timeout:g} s"
        pool = self.schedule.pool
        if self.real_devices:
            return (
                f"only {len(pool)} real devices registered {wait}, and one selection needs "
                f"{self.selection_size}: start more devices (docs/real-devices.md) or lower "
                "--device-selection-size"
            )
        return f"only leaves {sorted(pool.leaves)} of {self.num_leaves} registered devices {wait}"

    def _check_leaves(self, fl_ctx: FLContext) -> None:
        lost = self.leaves.newly_lost()
        if not lost:
            return
        names = ", ".join(sorted(lost))
        if self.on_leaf_loss == "stop":
            self._finish(
                "stopped",
                f"leaf {names} sent nothing for {self.leaf_timeout:g} s (--leaf-timeout): lost "
                "(--on-leaf-loss stop); metrics.json keeps the versions made so far",
                fl_ctx,
            )
            return
        self.log_error(
            fl_ctx,
            f"leaf {names} lost: its in-flight devices count as failed, its devices are never "
            "selected again (--on-leaf-loss continue)",
        )
        for leaf in lost:
            self.links.forget(leaf)
        self.run_server.lose_leaves(lost)
