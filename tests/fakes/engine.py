"""A stand-in for NVFlare's engine: delivers fired events to components and finds components by id.

Component tests use it to run NVFlare ``FLComponent`` event handlers together, in one process, without a job.
"""

from __future__ import annotations

from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_constant import ReservedKey
from nvflare.apis.fl_context import FLContext, FLContextManager
from nvflare.apis.shareable import Shareable
from nvflare.apis.utils.event import fire_event_to_components

from common.protocol import NEW_VERSION, NEW_WEIGHTS


class EventEngine:
    def __init__(self, components: dict[str, FLComponent]):
        self.components = components
        self.aux_sent: list[tuple[list[str], str]] = []  # (targets, topic) of every aux request sent

    def send_aux_request(self, targets, topic, request, timeout, fl_ctx, optional=False, secure=False) -> dict:
        self.aux_sent.append((list(targets), topic))
        return {}

    def fire_event(self, event_type: str, fl_ctx: FLContext) -> None:
        fire_event_to_components(event_type, list(self.components.values()), fl_ctx)

    def get_component(self, component_id: str):
        return self.components.get(component_id)

    def new_context(self) -> FLContext:
        ctx = FLContext()
        ctx.set_prop(ReservedKey.ENGINE, self, private=True, sticky=False)
        return ctx


def child_reports(assessor, engine: EventEngine, child: str, report: Shareable) -> Shareable:
    """``child`` (a leaf or relay, by name) sends ``report`` to the server's ``assessor``; its reply."""
    ctx = engine.new_context()
    peer = FLContext()
    peer.set_prop(ReservedKey.IDENTITY_NAME, child, private=True, sticky=False)
    ctx.set_peer_context(peer)
    ok, reply = assessor.process_child_update(report, ctx)
    assert ok
    return reply


class StickyEngine(EventEngine):
    """An ``EventEngine`` whose contexts share sticky properties through NVFlare's ``FLContextManager``, as a real
    engine's do: a sticky property set on one context is what every context then reads."""

    def __init__(self, components: dict[str, FLComponent]):
        super().__init__(components)
        self.manager = FLContextManager(engine=self)

    def new_context(self) -> FLContext:
        return self.manager.new_context()


def announce(ctx: FLContext, version: int, weights: dict) -> None:
    """Put in ``ctx`` what the server's global model announces a version with, for its evaluator (the run's own,
    not sticky, copy: ``common.protocol``); the caller fires ``GLOBAL_WEIGHTS_UPDATED``."""
    ctx.set_prop(NEW_VERSION, version, private=True, sticky=False)
    ctx.set_prop(NEW_WEIGHTS, weights, private=True, sticky=False)
