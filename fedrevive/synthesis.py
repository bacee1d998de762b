"""Synthetic data for FedRevive: the generator's meta-adaptation against the teachers, and the image pool.

One synthesis round, as the reference runs it (R1's ``FastMetaSynthesizer.synthesize``, NVIDIA's port):

1. ``synth_batch_size`` (64) target labels drawn from the mean of the teachers' class proportions; noise ``z`` and
   class embeddings drawn afresh from N(0, I);
2. a copy of the persistent generator, ``z`` and the embeddings are trained together ``gen_adapt_steps`` (2) Adam
   steps (lr ``gen_lr`` 3e-3 for the generator, ``gen_z_lr`` 1e-3 for ``z`` and the embeddings), each on an
   augmented view of the generated batch (``fedrevive.augment``);
3. Reptile through a meta-Adam: the persistent generator's gradient is (persistent - adapted copy) and a persistent
   Adam (lr ``gen_meta_lr``, betas 0.5/0.999) steps it, so the generator tracks the changing teachers;
4. the lowest-loss batch seen while adapting (un-augmented) joins a FIFO pool, from which distillation samples.

Generator loss, teachers weighted per sample by w_k(y) = q_k(y) / sum_t q_t(y), averaged over the batch:
    sum_k w_k CE(T_k(x), y) + bn_weight * sum_k mean(w_k) * feature-statistics mismatch_k
    - adv_weight * sum_k w_k KL(T_k(x) || S(x)) [argmax S(x) == argmax T_k(x)]
The adversarial term (only where student and teacher agree, so it seeks the student's blind spots without pushing
images off the teachers' classes) is on from ``kd_train_from_version``, as in NVIDIA's port. Each of the three terms
(and the distillation loss) passes the references' loss stabilisation first (``fedrevive.stabilize``).

The teachers run one after another, or in one batched pass (``fedrevive.teacher_batch``, equal to rounding); with
``--precision bf16`` the generator's and the models' forward passes run under bfloat16 autocast and each loss is
taken in float32 (``processors.precision``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from fedrevive.augment import PADDING, crop_and_flip
from fedrevive.config import FedReviveConfig
from fedrevive.feature_stats import FeatureStats
from fedrevive.generator import ConditionalGenerator
from fedrevive.stabilize import LossStabilizer
from fedrevive.teacher_batch import TeacherBatch
from fedrevive.teachers import Teacher
from processors.precision import autocast, widened


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

    def sample_for(
        self, proportions: torch.Tensor, n: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` images whose labels are drawn from ``proportions`` (one teacher's class proportions), each
        uniformly among the pool's images of its label; a label the pool lacks gets any pool image."""
        if self._size == 0:
            raise RuntimeError("the synthetic pool is empty")
        wanted = torch.multinomial(proportions.detach().cpu().double(), n, replacement=True, generator=generator)
        held = self._labels[: self._size].cpu()
        idx = torch.empty(n, dtype=torch.long)
        for label in wanted.unique().tolist():
            slots = (wanted == label).nonzero().view(-1)
            candidates = (held == label).nonzero().view(-1)
            if len(candidates) == 0:
                candidates = torch.arange(self._size)
            idx[slots] = candidates[torch.randint(0, len(candidates), (len(slots),), generator=generator)]
        idx = idx.to(self._images.device)
        return self._images[idx], self._labels[idx]


def per_sample_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(t / T) || softmax(s / T)) of each sample, scaled by T^2."""
    log_t = F.log_softmax(teacher_logits / temperature, dim=1)
    log_s = F.log_softmax(student_logits / temperature, dim=1)
    return (log_t.exp() * (log_t - log_s)).sum(dim=1) * temperature**2


@dataclass
class SynthesisResult:
    images: torch.Tensor
    labels: torch.Tensor
    loss: float


class Synthesizer:
    """Persistent generator, its meta-optimizer and the pool; ``synthesize`` runs one round and fills the pool."""

    def __init__(
        self,
        cfg: FedReviveConfig,
        device: torch.device,
        seed: int = 0,
        image_std: tuple[float, ...] | None = None,
        precision: str = "fp32",
    ):
        self.cfg = cfg
        self.device = device
        self.precision = precision
        with torch.random.fork_rng(devices=[]):  # seeded init without disturbing the caller's RNG
            torch.manual_seed(seed)
            self.generator = ConditionalGenerator(cfg.gen_noise_dim, cfg.num_classes, cfg.gen_width, image_std)
            self.generator.to(device)
        self.meta_optimizer = torch.optim.Adam(self.generator.parameters(), lr=cfg.gen_meta_lr, betas=(0.5, 0.999))
        self.pool = SyntheticPool(cfg.pool_size)
        self.rng = torch.Generator().manual_seed(seed)
        # one per server: the four losses' windows span synthesis rounds and KD steps, as in both references
        self.stabilize = LossStabilizer(cfg.stabilize_losses)

    def state_dict(self) -> dict:
        return {
            "generator": self.generator.state_dict(),
            "meta_optimizer": self.meta_optimizer.state_dict(),
            "pool": self.pool.state_dict(),
            "rng": self.rng.get_state(),
            "stabilizer": self.stabilize.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.generator.load_state_dict(state["generator"])
        self.meta_optimizer.load_state_dict(state["meta_optimizer"])
        self.pool.load_state_dict(state["pool"])
        self.rng.set_state(state["rng"])
        self.stabilize.load_state_dict(state.get("stabilizer", {}))  # checkpoints before it: empty windows

    def generator_loss(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        teachers: list[Teacher],
        class_weights: torch.Tensor,
        student: nn.Module | None,
        batch: TeacherBatch | None = None,
    ) -> torch.Tensor:
        """The loss of a (augmented) batch; ``student`` None leaves the adversarial term out; ``batch``: the same
        teachers stacked, to run them in one pass."""
        sample_weights = class_weights[:, labels]  # n_teachers x batch
        ce = images.new_zeros(())
        stat_loss = images.new_zeros(())
        teacher_logits, features = self._teachers_on(images, teachers, batch)
        for k in range(len(teacher_logits)):
            ce = ce + (sample_weights[k] * F.cross_entropy(teacher_logits[k], labels, reduction="none")).mean()
            stat_loss = stat_loss + sample_weights[k].mean() * features[k]
        # each term stabilised as the references do: a term whose weight is 0 is neither used nor tracked
        if self.cfg.bn_weight > 0:
            stat_loss = self.stabilize(stat_loss, "feature")
        loss = self.stabilize(ce, "one_hot") + self.cfg.bn_weight * stat_loss
        if student is not None and self.cfg.adv_weight > 0:
            with autocast(self.precision, images.device):
                student_logits = widened(student(images))
            agree_with = student_logits.argmax(dim=1)
            adversarial = images.new_zeros(())
            for k, logits in enumerate(teacher_logits):
                agree = (logits.argmax(dim=1) == agree_with).float()
                kl = per_sample_kl(logits, student_logits, self.cfg.kd_temperature)
                adversarial = adversarial + (sample_weights[k] * kl * agree).mean()
            # the references stabilise the signed term, -KL (<= 0): its window mean is never positive, so only a
            # non-finite value is rejected (negation is exact, so an accepted term keeps its bits)
            adversarial = -self.stabilize(-adversarial, "adversarial")
            loss = loss - self.cfg.adv_weight * adversarial
        return loss

    def _teachers_on(
        self, images: torch.Tensor, teachers: list[Teacher], batch: TeacherBatch | None
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each teacher's float32 logits on ``images`` and its feature-statistics mismatch, in buffer order: one
        teacher after another, or all in one pass (``batch``)."""
        with autocast(self.precision, images.device):
            if batch is not None:
                logits, features = batch.logits_and_feature_loss(images)
                return list(widened(logits).unbind(0)), list(features.unbind(0))
            out: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
            for teacher in teachers:
                with FeatureStats(teacher.model, teacher.reference) as fs:
                    out[0].append(widened(teacher.model(images)))
                out[1].append(fs.loss())
            return out

    def synthesize(
        self,
        teachers: list[Teacher],
        class_weights: torch.Tensor,
        proportions: torch.Tensor,
        student: nn.Module | None,
        batch: TeacherBatch | None = None,
    ) -> SynthesisResult:
        """One round (module docstring). ``proportions``: n_teachers x classes; ``student``: the adversarial
        term's student, or None; ``batch``: the teachers stacked, to run them in one pass."""
        cfg = self.cfg
        n = cfg.synth_batch_size
        labels = torch.multinomial(proportions.mean(dim=0).cpu().double(), n, replacement=True, generator=self.rng)
        labels = labels.to(self.device)
        z = torch.randn(n, cfg.gen_noise_dim, generator=self.rng).to(self.device).requires_grad_()
        embeddings = torch.randn(cfg.num_classes, cfg.gen_noise_dim, generator=self.rng).to(self.device)
        embeddings.requires_grad_()

        fast = copy.deepcopy(self.generator).train()
        optimizer = torch.optim.Adam(
            [{"params": fast.parameters()}, {"params": [z, embeddings], "lr": cfg.gen_z_lr}],
            lr=cfg.gen_lr,
            betas=(0.5, 0.999),
        )
        best: SynthesisResult | None = None
        for _ in range(max(1, cfg.gen_adapt_steps)):
            with autocast(self.precision, z.device):
                images = widened(fast(z, labels, embeddings, cfg.gen_class_weight))  # the pool keeps float32
            augmented = crop_and_flip(images, self.rng, PADDING, cfg.server_flip)
            loss = self.generator_loss(augmented, labels, teachers, class_weights, student, batch)
            if best is None or loss.item() < best.loss:
                best = SynthesisResult(images.detach(), labels, loss.item())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        self._meta_step(fast)
        assert best is not None
        self.pool.add(best.images, best.labels)
        return best

    def _meta_step(self, fast: nn.Module) -> None:
        """Reptile through the persistent meta-Adam: gradient = persistent - adapted (parameters only; the
        generator's BatchNorm always normalises with batch statistics, its running buffers are never used)."""
        self.meta_optimizer.zero_grad(set_to_none=True)
        for slow_p, fast_p in zip(self.generator.parameters(), fast.parameters(), strict=True):
            slow_p.grad = slow_p.detach() - fast_p.detach()
        self.meta_optimizer.step()
