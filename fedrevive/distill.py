"""FedReviveDistiller: turns a stale client update into (1 - beta) * delta + beta * delta_KD on the server.

Phases, by the current global version v (an update's staleness is tau = v - base_version, beta = beta(tau)):

* ``warm-up`` (v < distill_from_version): nothing runs on the server but bookkeeping; teachers are still
  buffered and class proportions estimated in ``observe_client_model``. The update passes through unchanged.
* ``generator-warm-up`` (distill_from_version <= v < kd_train_from_version): synthesis rounds fill the pool (see
  below); no student is trained, and a stale update is blended with a zero delta_KD, ``(1 - beta) * delta``, as both
  references do (``warmup_blend`` "zero"; "pass" leaves it unchanged).
* ``distill`` (v >= kd_train_from_version, beta > 0): a student initialised from the current global model is
  trained ``kd_iters`` Adam steps (lr ``kd_lr``, weight decay ``kd_weight_decay``) on pool images: in each step
  every teacher k gets its own ``synth_per_teacher`` images whose labels are drawn from its class proportions q_k,
  augmented, and the loss is the sum over teachers of KL(teacher || student) on them, over all their images.
  delta_KD = student - global (trainable parameters only), blended with beta.
* ``fresh`` (v >= kd_train_from_version, beta == 0, i.e. tau == 0): the blend would ignore delta_KD; nothing runs.
* ``no-teachers`` / ``empty-pool``: nothing to distil from yet; the update passes through unchanged.

A synthesis round (``fedrevive.synthesis``) runs for a stale update (tau > 0) from ``distill_from_version`` on, at
versions that are multiples of ``synth_every_versions`` (10: R2's paper-aligned interval; 1: every stale update,
as R1 and R2's table run). Its adversarial term is on from ``kd_train_from_version``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn as nn

from fedrevive.augment import PADDING, crop_and_flip
from fedrevive.config import FedReviveConfig
from fedrevive.staleness import beta as staleness_beta
from fedrevive.staleness import blend_update
from fedrevive.synthesis import Synthesizer, per_sample_kl
from fedrevive.teacher_batch import TeacherBatch, batches_teachers
from fedrevive.teachers import ProportionEstimator, Teacher, TeacherBuffer
from fedrevive.weights import frozen, load_weights, parameter_delta
from processors.precision import autocast, use_precision, widened


def kd_step(
    student: nn.Module,
    batches: list[tuple[Teacher, torch.Tensor]],
    optimizer: torch.optim.Optimizer,
    temperature: float,
    stabilize: Callable[[torch.Tensor, str], torch.Tensor] | None = None,
    precision: str = "fp32",
    teacher_batch: TeacherBatch | None = None,
) -> float:
    """One distillation step: each teacher on its own batch, KL(teacher || student) summed over all samples and
    divided by their number; returns that loss before the step. ``stabilize`` (``LossStabilizer``) may reject the
    loss: it becomes 0 and the step still runs, as in both references. ``precision``: the forward passes'
    (``processors.precision``); ``teacher_batch``: the same teachers stacked, so that they run in one pass and
    the student in one pass over every teacher's batch (the student is in eval mode: each sample's logits are
    its own), equal to the loop to rounding (batches of one size)."""
    total = sum(images.shape[0] for _, images in batches)
    device = batches[0][1].device
    if teacher_batch is not None:
        images = torch.stack([x for _, x in batches])  # teachers x N x C x H x W
        with autocast(precision, device):
            teacher_logits = widened(teacher_batch.logits_each(images))
            student_logits = widened(student(images.flatten(0, 1))).view(teacher_logits.shape)
        kl = [per_sample_kl(t, s, temperature).sum() for t, s in zip(teacher_logits, student_logits, strict=True)]
    else:
        kl = []
        for teacher, images in batches:
            with torch.no_grad(), autocast(precision, device):
                teacher_logits = widened(teacher.model(images))
            with autocast(precision, device):
                student_logits = widened(student(images))
            kl.append(per_sample_kl(teacher_logits, student_logits, temperature).sum())
    loss = None
    for term in kl:  # summed in teacher order, as before
        loss = term if loss is None else loss + term
    loss = loss / total
    if stabilize is not None:
        loss = stabilize(loss, "kd")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


class FedReviveDistiller:
    """Server-side state of FedRevive: teacher buffer, proportion estimates, generator and synthetic pool."""

    def __init__(
        self,
        cfg: FedReviveConfig,
        model_builder: Callable[[], nn.Module],
        device: torch.device,
        seed: int = 0,
        image_std: tuple[float, ...] | None = None,
        precision: str = "fp32",
    ):
        self.cfg = cfg
        self.model_builder = model_builder
        self.device = device
        self.precision = precision
        use_precision(precision, device)  # this process's TF32 switches (CUDA only)
        self.rng = torch.Generator().manual_seed(seed + 1)
        self.teachers = TeacherBuffer(cfg.teacher_buffer_size, model_builder, device)
        self.estimator = ProportionEstimator(cfg.num_classes, cfg.probe_temperature)
        model = model_builder()
        self.parameter_names = frozenset(name for name, _ in model.named_parameters())
        self.batched = batches_teachers(cfg.batched_teachers, device, model)  # fedrevive.teacher_batch
        self.synthesizer = Synthesizer(cfg, device, seed, image_std, precision)
        # One fixed probe batch: estimates of different clients are then comparable, and conv-mode teachers
        # get their feature-statistics reference from the same Gaussian noise (normalised image space).
        self.probe_noise = torch.randn(cfg.probe_samples, 3, 32, 32, generator=self.rng).to(device)

    def state_dict(self) -> dict:
        """Everything a resumed run needs to continue exactly: teachers, estimates, generator, pool, generators."""
        return {
            "rng": self.rng.get_state(),
            "probe_noise": self.probe_noise.cpu(),
            "teachers": self.teachers.state_dict(),
            "estimator": self.estimator.state_dict(),
            "synthesizer": self.synthesizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.rng.set_state(state["rng"])
        self.probe_noise = state["probe_noise"].to(self.device)
        self.teachers.load_state_dict(state["teachers"])
        self.estimator.load_state_dict(state["estimator"])
        self.synthesizer.load_state_dict(state["synthesizer"])

    def observe_client_model(
        self, client_id: str, weights: dict[str, np.ndarray], label_counts: np.ndarray | None = None
    ) -> None:
        """Buffer a returned client model as a teacher. Its class proportions: the label histogram its device
        reported (``class_proportions`` "true"), or the probe of the client's first two models ("estimate")."""
        teacher = self.teachers.add(client_id, weights, self.probe_noise)
        if self.cfg.class_proportions == "true":
            if label_counts is None:
                raise ValueError(
                    f"device {client_id} reported no label histogram, which --fr-class-proportions true needs; "
                    "use --fr-class-proportions estimate for devices that do not report one"
                )
            self.estimator.record(client_id, label_counts)
        else:
            self.estimator.observe(client_id, teacher.model, self.probe_noise)

    def phase(self, current_version: int, beta: float) -> str:
        if current_version < self.cfg.distill_from_version:
            return "warm-up"
        if len(self.teachers) == 0:
            return "no-teachers"
        if current_version < self.cfg.kd_train_from_version:
            return "generator-warm-up"
        return "distill" if beta > 0 else "fresh"

    def synthesizes(self, current_version: int, tau: int) -> bool:
        """Whether an update of staleness ``tau`` applied at ``current_version`` runs a synthesis round."""
        return (
            tau > 0
            and current_version >= self.cfg.distill_from_version
            and len(self.teachers) > 0
            and current_version % self.cfg.synth_every_versions == 0
        )

    def process_update(
        self,
        global_weights: dict[str, np.ndarray],
        delta: dict[str, np.ndarray],
        client_id: str,
        base_version: int,
        current_version: int,
    ) -> tuple[dict[str, np.ndarray], dict]:
        """Blend ``delta`` (trained from ``base_version``) with a distilled update, as the phase allows."""
        tau = max(0, current_version - base_version)
        b = staleness_beta(tau, self.cfg.s_max)
        phase = self.phase(current_version, b)
        info: dict = {"client_id": client_id, "tau": tau, "beta": 0.0, "phase": phase, "kd_seconds": 0.0}
        synthesize = self.synthesizes(current_version, tau)
        warmup_zero = phase == "generator-warm-up" and self.cfg.warmup_blend == "zero" and b > 0
        if not synthesize and phase != "distill":
            return self._warmup_blend(delta, b, info) if warmup_zero else (blend_update(delta, None, 0.0), info)

        start = time.perf_counter()
        global_model = self.frozen_model(global_weights)
        teachers = list(self.teachers)
        batch = TeacherBatch(teachers) if self.batched else None
        class_weights = self.teachers.class_weights(self.estimator)
        proportions = self.teachers.proportions(self.estimator)
        if synthesize:
            adversary = global_model if current_version >= self.cfg.kd_train_from_version else None
            synthesis_started = time.perf_counter()
            result = self.synthesizer.synthesize(teachers, class_weights, proportions, adversary, batch)
            info.update(gen_loss=result.loss, synthesized=True, synth_seconds=time.perf_counter() - synthesis_started)
        info.update(pool_size=len(self.synthesizer.pool), n_teachers=len(teachers))
        delta_kd = None
        if phase == "distill" and len(self.synthesizer.pool) == 0:
            info["phase"] = "empty-pool"
        elif phase == "distill":
            distill_started = time.perf_counter()
            delta_kd, losses = self.distill(global_model, global_weights, teachers, proportions, batch)
            info.update(beta=b, kd_loss_first=losses[0], kd_loss_last=losses[-1])
            info["distill_seconds"] = time.perf_counter() - distill_started
        if self.synthesizer.stabilize.rejected:  # only then: a run without rejections keeps its log's bits
            info["rejected_losses"] = dict(self.synthesizer.stabilize.rejected)
        info["kd_seconds"] = time.perf_counter() - start
        if warmup_zero:
            return self._warmup_blend(delta, b, info)
        return blend_update(delta, delta_kd, info["beta"]), info

    def _warmup_blend(self, delta: dict[str, np.ndarray], b: float, info: dict) -> tuple[dict[str, np.ndarray], dict]:
        """(1 - beta) * delta: the blend with a zero distilled update (parameters; statistics stay the client's)."""
        info["beta"] = b
        zero = {k: np.zeros_like(v) for k, v in delta.items() if k in self.parameter_names}
        return blend_update(delta, zero, b), info

    def distill(
        self,
        global_model: nn.Module,
        global_weights: dict[str, np.ndarray],
        teachers: list[Teacher],
        proportions: torch.Tensor,
        batch: TeacherBatch | None = None,
    ) -> tuple[dict[str, np.ndarray], list[float]]:
        """Train a copy of the global model on pool images; return (delta_KD, per-step losses). ``batch``: the
        teachers stacked, to run them in one pass."""
        student = copy.deepcopy(global_model)
        for p in student.parameters():
            p.requires_grad_(True)
        # Eval mode: BatchNorm normalises with the global model's statistics (the mean of the clients' real-data
        # statistics) instead of drifting to synthetic-batch statistics; delta_KD holds parameters only.
        student.eval()
        optimizer = torch.optim.Adam(student.parameters(), lr=self.cfg.kd_lr, weight_decay=self.cfg.kd_weight_decay)
        pool, losses = self.synthesizer.pool, []
        flips = (self.rng, PADDING, self.cfg.server_flip)
        for _ in range(self.cfg.kd_iters):
            batches = [
                (t, crop_and_flip(pool.sample_for(proportions[k], self.cfg.synth_per_teacher, self.rng)[0], *flips))
                for k, t in enumerate(teachers)
            ]
            losses.append(
                kd_step(
                    student,
                    batches,
                    optimizer,
                    self.cfg.kd_temperature,
                    self.synthesizer.stabilize,
                    self.precision,
                    batch,
                )
            )
        reference = {k: v for k, v in global_weights.items() if k in dict(student.named_parameters())}
        return parameter_delta(student, reference), losses or [float("nan")]

    def frozen_model(self, weights: dict[str, np.ndarray]) -> nn.Module:
        """A model of ``weights``, frozen: the global model as the student's start and the adversary."""
        return frozen(load_weights(self.model_builder().to(self.device), weights))
