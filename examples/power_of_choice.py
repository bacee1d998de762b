"""Power-of-choice selection (Cho, Wang and Joshi 2022, "Towards Understanding Biased Client Selection in
Federated Learning", AISTATS) as a method of one's own, in one file: FedBuff whose replacements are chosen by
their loss, not uniformly.

At each selection of m devices, d = ceil(choices x m) candidates are drawn uniformly among the idle online ones,
and the m with the highest local loss are selected. The loss is the one each device reported with its last
applied update (the paper's communication-free variant, rpow-d: no extra round trip to ask candidates for their
loss on the current model); a device never trained yet counts as the highest (it is explored first). Ties are
broken by the schedule's seeded generator, so the run repeats bit for bit from its seed.

    PYTHONPATH=examples python jobs/pt_job_fedrevive.py --method power_of_choice:PowerOfChoice --poc-choices 3 ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from common.protocol import LOSS
from jobs.methods import FedBuff
from scheduling.selection import Candidate, SelectionPolicy


class HighestLoss(SelectionPolicy):
    """Of d = ceil(choices x m) uniform candidates, the m with the highest last reported loss."""

    needs = (LOSS,)

    def __init__(self, choices: float = 2.0):
        self.choices = choices

    def sample_size(self, count: int, idle: int) -> int:
        return min(idle, math.ceil(self.choices * count))

    def select(
        self, candidates: list[Candidate], count: int, version: int, now: float, rng: np.random.Generator
    ) -> list[str]:
        order = rng.permutation(len(candidates))  # a seeded tie-break: equal losses, or devices never trained
        loss = [candidates[i].reports.get(LOSS, math.inf) for i in order]
        ranked = sorted(range(len(order)), key=lambda j: -loss[j])  # stable: the permutation breaks ties
        return [candidates[order[j]].device for j in ranked[:count]]


@dataclass(frozen=True)
class PowerOfChoiceSettings:
    """Power-of-choice selection.

    Attributes:
        choices: candidates drawn per device selected (d / m, at least 1; 1: uniform selection).
    """

    choices: float = 2.0

    def __post_init__(self) -> None:
        if not self.choices >= 1:
            raise ValueError(f"--poc-choices {self.choices}: must be >= 1 (d candidates for m devices, d >= m)")


class PowerOfChoice(FedBuff):
    """FedBuff whose devices are selected by power of choice (the highest last loss of d candidates)."""

    name = ""  # a user's method is named by its import path
    selection = HighestLoss
    settings = PowerOfChoiceSettings
    flag_prefix = "poc"

    def selection_args(self, cfg) -> dict:
        return {"choices": cfg.method_settings.choices}
