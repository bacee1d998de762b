"""A pack's components take only their own run's events (``common.run_scope``): NVFlare hands every event to every
component, so run 1's evaluator must not score run 0's versions; a standalone job's components take every event."""

from __future__ import annotations

from nvflare.apis.fl_context import FLContext

from common.run_scope import mark, scoped


def test_a_run_scoped_handler_takes_only_its_runs_events():
    seen = []
    handlers = {run: scoped(run, lambda _e, _c, run=run: seen.append(run)) for run in (0, 1)}
    for fired_by in (0, 1, 1):
        ctx = mark(FLContext(), fired_by)
        for handler in handlers.values():
            handler("event", ctx)
    assert seen == [0, 1, 1]


def test_a_standalone_component_marks_nothing_and_takes_every_event():
    calls = []

    def handler(_e, _c):
        calls.append(1)

    assert scoped(None, handler) is handler
    ctx = mark(FLContext(), None)
    assert ctx.get_prop("edgesim_pack_run") is None
    scoped(0, handler)("event", ctx)  # an unmarked event is no run's: a pack's component leaves it
    assert calls == []
