"""Teacher side of FedRevive: the buffer of recent client models and the server's class-proportion estimates.

Each teacher's class proportions are its client's label histogram, reported by the device (``record``, as the
authors' code feeds them), or estimated on the server (``observe``, as NVIDIA's port offers): Gaussian noise (in
normalised image space) through the client's first two uploaded models, their softened softmax outputs averaged;
a model trained on skewed labels is biased towards its frequent classes on uninformative input.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from fedrevive.feature_stats import Stats, has_statistics, record_reference
from fedrevive.weights import frozen, load_weights

ESTIMATE_UPLOADS = 2  # proportions come from a client's first two uploads, then stay fixed


@dataclass
class Teacher:
    client_id: str
    model: nn.Module  # eval mode, frozen
    reference: Stats | None  # conv-mode feature statistics reference; None for models that carry statistics


@torch.no_grad()
def probe_proportions(model: nn.Module, noise: torch.Tensor, temperature: float) -> np.ndarray:
    """Mean softmax(logits / T) of ``model`` over ``noise``: the estimated class proportions."""
    model.eval()
    probs = torch.softmax(model(noise) / temperature, dim=1)
    return probs.mean(dim=0).double().cpu().numpy()


class ProportionEstimator:
    """Per-client class proportions, averaged over the probes of its first ``ESTIMATE_UPLOADS`` models."""

    def __init__(self, num_classes: int, temperature: float):
        self.num_classes = num_classes
        self.temperature = temperature
        self._sums: dict[str, np.ndarray] = {}
        self._counts: dict[str, int] = {}

    def observe(self, client_id: str, model: nn.Module, noise: torch.Tensor) -> None:
        if self._counts.get(client_id, 0) >= ESTIMATE_UPLOADS:
            return
        probs = probe_proportions(model, noise, self.temperature)
        self._sums[client_id] = self._sums.get(client_id, 0.0) + probs
        self._counts[client_id] = self._counts.get(client_id, 0) + 1

    def record(self, client_id: str, label_counts: np.ndarray) -> None:
        """The client's true label histogram (its first report is kept: a device's data does not change)."""
        if client_id in self._counts:
            return
        counts = np.asarray(label_counts, dtype=np.float64)
        if counts.shape != (self.num_classes,):
            raise ValueError(f"label histogram of {client_id} has shape {counts.shape}, not ({self.num_classes},)")
        total = counts.sum()
        self._sums[client_id] = counts / total if total > 0 else np.full(self.num_classes, 1.0 / self.num_classes)
        self._counts[client_id] = 1

    def state_dict(self) -> dict:
        return {"sums": {k: np.asarray(v) for k, v in self._sums.items()}, "counts": dict(self._counts)}

    def load_state_dict(self, state: dict) -> None:
        self._sums = {k: np.asarray(v) for k, v in state["sums"].items()}
        self._counts = dict(state["counts"])

    def proportions(self, client_id: str) -> np.ndarray:
        """Estimated proportions (sum 1); uniform for a client never probed."""
        if client_id not in self._counts:
            return np.full(self.num_classes, 1.0 / self.num_classes)
        p = self._sums[client_id] / self._counts[client_id]
        return p / p.sum()


class TeacherBuffer:
    """The ``capacity`` most recent client models, as frozen eval-mode teachers (oldest evicted first)."""

    def __init__(self, capacity: int, model_builder: Callable[[], nn.Module], device: torch.device):
        self.model_builder = model_builder
        self.device = device
        self._teachers: deque[Teacher] = deque(maxlen=capacity)

    def add(self, client_id: str, weights: dict[str, np.ndarray], reference_input: torch.Tensor) -> Teacher:
        model = frozen(load_weights(self.model_builder().to(self.device), weights))
        # Models with BatchNorm or trackers carry their data statistics; others get a reference recorded on the
        # probe noise.
        reference = None if has_statistics(model) else record_reference(model, reference_input)
        teacher = Teacher(client_id, model, reference)
        self._teachers.append(teacher)
        return teacher

    def __len__(self) -> int:
        return len(self._teachers)

    def state_dict(self) -> list[dict]:
        """The buffered teachers, oldest first: client id, weights and feature-statistics reference."""
        return [
            {
                "client_id": t.client_id,
                "weights": {k: v.detach().cpu() for k, v in t.model.state_dict().items()},
                "reference": t.reference,
            }
            for t in self._teachers
        ]

    def load_state_dict(self, state: list[dict]) -> None:
        self._teachers.clear()
        for entry in state:
            model = self.model_builder().to(self.device)
            model.load_state_dict({k: v.to(self.device) for k, v in entry["weights"].items()})
            self._teachers.append(Teacher(entry["client_id"], frozen(model), entry["reference"]))

    def __iter__(self):
        return iter(self._teachers)

    def _stacked(self, estimator: ProportionEstimator) -> np.ndarray:
        return np.stack([estimator.proportions(t.client_id) for t in self._teachers])

    def proportions(self, estimator: ProportionEstimator) -> torch.Tensor:
        """n_teachers x num_classes: each teacher's estimated class proportions q_k (rows sum to 1)."""
        return torch.as_tensor(self._stacked(estimator), dtype=torch.float32, device=self.device)

    def class_weights(self, estimator: ProportionEstimator) -> torch.Tensor:
        """n_teachers x num_classes: each teacher's share of each class, normalised over teachers per class."""
        props = self._stacked(estimator) + 1e-8
        weights = props / props.sum(axis=0, keepdims=True)
        return torch.as_tensor(weights, dtype=torch.float32, device=self.device)
