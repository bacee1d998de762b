"""FedProx (Li et al. 2020, "Federated Optimization in Heterogeneous Networks"): FedAvg whose devices minimise
their loss plus the proximal term mu / 2 * ||w - w_global||^2. A method's device hook
(``processors.objective.DeviceObjective``), run by both training engines; the server is FedAvg's.

    PYTHONPATH=examples python jobs/pt_job_fedrevive.py --method fedprox:FedProx --prox-mu 0.1 ...
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.methods import FedAvg
from processors.objective import DeviceObjective


class ProximalTerm(DeviceObjective):
    """mu / 2 * sum over parameters of ||w - w_global||^2 (pure tensor code: it also runs under vmap). ``mu`` is
    batched: devices of runs with different mu share a vectorised group (``DeviceObjective.batched``)."""

    batched = ("mu",)

    def __init__(self, mu: float = 0.01):
        self.mu = mu

    def loss(self, params, received, extras):
        return 0.5 * self.mu * sum(((p - received[name]) ** 2).sum() for name, p in params.items())


@dataclass(frozen=True)
class FedProxSettings:
    """FedProx's proximal term.

    Attributes:
        mu: the weight of the proximal term (0: FedAvg).
    """

    mu: float = 0.01

    def __post_init__(self) -> None:
        if not self.mu >= 0:
            raise ValueError(f"--prox-mu {self.mu}: must be >= 0 (0: plain FedAvg)")


class FedProx(FedAvg):
    """Synchronous FedAvg with FedProx's proximal term on every device."""

    name = ""  # a user's method is named by its import path
    objective = ProximalTerm
    settings = FedProxSettings
    flag_prefix = "prox"

    def objective_args(self, cfg) -> dict:
        return {"mu": cfg.method_settings.mu}
