"""Which run of a pack an event is about (``docs/packs.md``): NVFlare hands every event to every component of the
job, so in a pack each run's server components (its run server, global model, evaluator, recorder, model saver)
mark the contexts they fire on with their run (``mark``) and take only their own run's events (``scoped``).

A standalone job's components have no run (``None``): they mark nothing and take every event, as before.
"""

from __future__ import annotations

from collections.abc import Callable

from nvflare.apis.fl_context import FLContext

PACK_RUN = "edgesim_pack_run"  # the FLContext property naming the run an event is about


def mark(fl_ctx: FLContext, run: int | None) -> FLContext:
    """Name ``run`` on ``fl_ctx`` (nothing for a standalone job's ``None``); returns ``fl_ctx``."""
    if run is not None:
        fl_ctx.set_prop(PACK_RUN, run, private=True, sticky=False)
    return fl_ctx


def scoped(run: int | None, handler: Callable) -> Callable:
    """``handler`` for ``run``'s events only (every event when ``run`` is None); a handler that takes one marks the
    context it is given, so what it fires is about its run too."""
    if run is None:
        return handler

    def handle(event: str, fl_ctx: FLContext) -> None:
        if fl_ctx.get_prop(PACK_RUN) == run:
            handler(event, fl_ctx)

    return handle
