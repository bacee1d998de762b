"""Synthetic data for FedRevive: the generator's meta-adaptation against the teachers, and the image pool.

Each synthesis round copies the persistent generator, trains the copy ``gen_adapt_steps`` Adam steps on a fixed
batch of noise / target labels, then moves the persistent generator part of the way to the copy (Reptile), so it
tracks the changing teachers without being re-trained from scratch. The lowest-loss batch seen while adapting
joins a FIFO pool, from which knowledge distillation samples.

Generator loss (per round, teachers weighted per sample by their share of the sample's target class):
    weighted CE(teachers, target) + bn_weight * feature-statistics mismatch - adv_weight * weighted KL(teacher || student)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from fedrevive.config import FedReviveConfig
from fedrevive.feature_stats import FeatureStats
from fedrevive.generator import ConditionalGenerator
from fedrevive.teachers import Teacher


class SyntheticPool:
    """Bounded FIFO store of synthetic images and their target labels (oldest overwritten first)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._images: torch.Tensor | None = None
        self._labels: torch.Tensor | None = None
        self._next = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        images, labels = images.detach(), labels.detach()
        if self._images is None:  # allocated on first use, on the images' device
            self._images = images.new_empty((self.capacity, *images.shape[1:]))
            self._labels = labels.new_empty((self.capacity,))
        for start in range(0, images.shape[0], self.capacity):  # a batch bigger than the pool keeps its tail
            chunk_x, chunk_y = images[start : start + self.capacity], labels[start : start + self.capacity]
            n = chunk_x.shape[0]
            idx = (self._next + torch.arange(n, device=self._images.device)) % self.capacity
            self._images[idx] = chunk_x
            self._labels[idx] = chunk_y
            self._next = (self._next + n) % self.capacity
            self._size = min(self.capacity, self._size + n)

    def state_dict(self) -> dict:
        # only the filled rows: a pool filling up (the usual case for a long while) checkpoints what it holds
        images = None if self._images is None else self._images[: self._size].clone()  # a view would save it all
        labels = None if self._labels is None else self._labels[: self._size].clone()
        return {"images": images, "labels": labels, "next": self._next, "size": self._size}

    def load_state_dict(self, state: dict) -> None:
        self._images = self._labels = None
        if state["images"] is not None:
            self._images = state["images"].new_empty((self.capacity, *state["images"].shape[1:]))
            self._labels = state["labels"].new_empty((self.capacity,))
            self._images[: state["size"]] = state["images"]
            self._labels[: state["size"]] = state["labels"]
        self._next, self._size = state["next"], state["size"]

    def sample(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if self._size == 0 or self._images is None or self._labels is None:
            raise RuntimeError("the synthetic pool is empty")
        idx = torch.randint(0, self._size, (n,), generator=generator).to(self._images.device)
        return self._images[idx], self._labels[idx]


def weighted_kl(
    teacher_logits: list[torch.Tensor], student_logits: torch.Tensor, sample_weights: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Mean over samples of sum_k w[k, i] * KL(softmax(t_k / T) || softmax(s / T)), scaled by T^2.

    ``sample_weights`` is n_teachers x batch (each column sums to 1).
    """
    log_s = F.log_softmax(student_logits / temperature, dim=1)
    total = student_logits.new_zeros(())
    for k, t_logits in enumerate(teacher_logits):
        log_t = F.log_softmax(t_logits / temperature, dim=1)
        kl = (log_t.exp() * (log_t - log_s)).sum(dim=1)
        total = total + (sample_weights[k] * kl).mean()
    return total * temperature**2


@dataclass
class SynthesisResult:
    images: torch.Tensor
    labels: torch.Tensor
    loss: float


class Synthesizer:
    """Persistent generator + pool; ``synthesize`` runs one meta-adaptation round and fills the pool."""

    def __init__(self, cfg: FedReviveConfig, device: torch.device, seed: int = 0):
        self.cfg = cfg
        self.device = device
        with torch.random.fork_rng(devices=[]):  # seeded init without disturbing the caller's RNG
            torch.manual_seed(seed)
            self.generator = ConditionalGenerator(cfg.gen_noise_dim, cfg.num_classes, cfg.gen_width).to(device)
        self.pool = SyntheticPool(cfg.pool_size)
        self.rng = torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict:
        return {"generator": self.generator.state_dict(), "pool": self.pool.state_dict(), "rng": self.rng.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.load_state_dict(state["generator"])
        self.pool.load_state_dict(state["pool"])
        self.rng.set_state(state["rng"])

    def generator_loss(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        teachers: list[Teacher],
        class_weights: torch.Tensor,
        student: nn.Module | None,
    ) -> torch.Tensor:
        sample_weights = class_weights[:, labels]  # n_teachers x batch
        ce = images.new_zeros(())
        stat_loss = images.new_zeros(())
        teacher_logits = []
        for k, teacher in enumerate(teachers):
            with FeatureStats(teacher.model, teacher.reference) as fs:
                logits = teacher.model(images)
            teacher_logits.append(logits)
            ce = ce + (sample_weights[k] * F.cross_entropy(logits, labels, reduction="none")).mean()
            stat_loss = stat_loss + fs.loss()
        loss = ce + self.cfg.bn_weight * stat_loss / len(teachers)
        if student is not None and self.cfg.adv_weight > 0:
            # Maximise disagreement: images the student already imitates well teach it nothing.
            disagreement = weighted_kl(teacher_logits, student(images), sample_weights, self.cfg.kd_temperature)
            loss = loss - self.cfg.adv_weight * disagreement
        return loss

    def synthesize(
        self, teachers: list[Teacher], class_weights: torch.Tensor, student: nn.Module | None
    ) -> SynthesisResult:
        cfg = self.cfg
        n = cfg.synth_per_teacher * len(teachers)
        z = torch.randn(n, cfg.gen_noise_dim, generator=self.rng).to(self.device)
        labels = torch.randint(0, cfg.num_classes, (n,), generator=self.rng).to(self.device)

        fast = copy.deepcopy(self.generator).train()
        optimizer = torch.optim.Adam(fast.parameters(), lr=cfg.gen_lr, betas=(0.5, 0.999))
        best: SynthesisResult | None = None
        for _ in range(max(1, cfg.gen_adapt_steps)):
            images = fast(z, labels)
            loss = self.generator_loss(images, labels, teachers, class_weights, student)
            if best is None or loss.item() < best.loss:
                best = SynthesisResult(images.detach(), labels, loss.item())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        self._reptile_update(fast)
        assert best is not None
        self.pool.add(best.images, best.labels)
        return best

    @torch.no_grad()
    def _reptile_update(self, fast: nn.Module) -> None:
        lr = self.cfg.gen_reptile_lr
        for slow_p, fast_p in zip(self.generator.parameters(), fast.parameters(), strict=True):
            slow_p.add_(fast_p - slow_p, alpha=lr)
        for slow_b, fast_b in zip(self.generator.buffers(), fast.buffers(), strict=True):
            if slow_b.is_floating_point():  # BatchNorm running stats move like the weights
                slow_b.add_(fast_b - slow_b, alpha=lr)
            else:
                slow_b.copy_(fast_b)
