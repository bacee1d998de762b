"""FedBuff with NVFlare's staleness weighting, as ``nvflare.edge.assessors.buff_model_manager.BuffModelManager``
with ``staleness_weight=True`` makes a version: current + global_lr * sum_i(w_i * diff_i) / n, where n counts the
buffered devices and w_i = 1 / (1 + sqrt(v_new - v_i)), v_new the version being made and v_i the one device i
trained (so a device that trained the current version counts 1 / 2).

The model's data statistics stay the mean of the devices' own (``aggregation.buffered_mean``), unweighted.

    PYTHONPATH=examples python jobs/pt_job_fedrevive.py --method fedbuff_nvflare_weighting:NVFlareWeightedFedBuff
"""

from __future__ import annotations

import math

import numpy as np

from aggregation.buffered_mean import BufferedMean
from aggregation.strategy import ModelHistory, Update
from jobs.methods import FedBuff


class NVFlareStalenessWeighting(BufferedMean):
    """BufferedMean whose parameter diffs are weighted by 1 / (1 + sqrt(v_new - v_base)) before the mean."""

    def add_update(self, update: Update, model: ModelHistory) -> None:
        w = np.float32(1.0 / (1.0 + math.sqrt(model.current_version + 1 - update.base_version)))
        stats = self.context.statistics
        diff = {k: v if k in stats else w * v for k, v in update.diff.items()}
        self.buffer(diff, update.count, update.base_version, model)


class NVFlareWeightedFedBuff(FedBuff):
    """FedBuff (its presets), each buffered update weighted by its staleness as NVFlare's BuffModelManager does."""

    name = ""  # a user's method is named by its import path
    strategy = NVFlareStalenessWeighting
