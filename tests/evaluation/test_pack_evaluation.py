"""A pack's runs announce their versions on one server engine, whose contexts share NVFlare's sticky properties
(``tests/fakes/engine.StickyEngine``, as the real engine's): each run's evaluator takes its own run's version and
weights, even when the other run announces between a version's announcement and the evaluator's turn. (Read from
NVFlare's sticky ``CURRENT_ROUND`` and ``GLOBAL_MODEL``, a run's evaluator took the other run's, and a pack's run
lost a version's record: CI, ``tests/e2e/test_pack_runs.py``.)"""

from __future__ import annotations

import numpy as np
from nvflare.apis.fl_component import FLComponent
from nvflare.app_common.app_event_type import AppEventType

from aggregation.global_model import GlobalModel
from common.run_scope import PACK_RUN, mark
from evaluation.evaluator import GlobalModelEvaluator
from tests.fakes.engine import StickyEngine

MEAN = "aggregation.buffered_mean:BufferedMean"


class Interloper(FLComponent):
    """Run 1's server: when run 0 announces a version, run 1 announces its own first (its applier's thread, in a
    real pack, between run 0's announcement and run 0's evaluator)."""

    def __init__(self, model: GlobalModel, weights: dict, version: int):
        super().__init__()
        self.model, self.weights, self.version = model, weights, version

    def handle_event(self, event_type: str, fl_ctx) -> None:
        if event_type == AppEventType.GLOBAL_WEIGHTS_UPDATED and fl_ctx.get_prop(PACK_RUN) == 0 and self.version:
            version, self.version = self.version, 0
            self.model.start(self.weights, version, mark(fl_ctx.get_engine().new_context(), 1))


def test_each_runs_evaluator_takes_its_own_runs_version_when_the_other_run_announces_in_between():
    models = [GlobalModel(MEAN, bulk="wire"), GlobalModel(MEAN, bulk="wire")]
    weights = [{"w": np.zeros(3, np.float32)}, {"w": np.full(3, 7.0, np.float32)}]
    evaluators = [GlobalModelEvaluator("", {}, run=r) for r in (0, 1)]
    engine = StickyEngine(
        {"interloper": Interloper(models[1], weights[1], 7), "eval.r0": evaluators[0], "eval.r1": evaluators[1]}
    )
    models[0].start(weights[0], 1, mark(engine.new_context(), 0))
    taken = [[(item[0], item[1]["w"].tolist()) for item in e._waiting] for e in evaluators]  # submitted, not scored
    assert taken == [[(1, [0.0, 0.0, 0.0])], [(7, [7.0, 7.0, 7.0])]]
