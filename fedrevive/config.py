"""FedReviveConfig: every FedRevive constant in one place, with the paper's defaults."""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass
from typing import Literal

WarmupBlend = Literal["zero", "pass"]
ClassProportions = Literal["true", "estimate"]
BatchedTeachers = Literal["auto", "on", "off"]
# FedRevive's own result file, per update (``aggregation.fedrevive_strategy``); ``jobs.methods.FedRevive`` declares it
LOG_FILE = "fedrevive_log.jsonl"
# its wall-clock fields (seconds of the whole server step, of the synthesis round, of the distillation): timing,
# which no seeded run repeats, so a comparison of two runs' logs leaves them out (``benchmarks/checks/same_bits.py``)
LOG_WALL_CLOCK = ("kd_seconds", "synth_seconds", "distill_seconds")


@dataclass(frozen=True)
class FedReviveConfig:
    """Hyperparameters of FedRevive (Askin et al., arXiv 2511.00655).

    Defaults follow the authors' code (R1, ``research/fed-revive/codes``) and NVIDIA's port (R2,
    ``research/fedrevive``) except ``synth_every_versions`` = 10: R2's "paper-aligned" interval, which R2 pairs with
    estimated proportions, while R1, R2's default and R2's table run synthesise on every stale update (1, what
    ``reproduce_fedrevive.py --scale paper`` sets; ``docs/fedrevive-differences.md``). Each field is a ``--fr-*``
    flag of the jobs.

    Attributes:
        s_max: staleness scale of the blend beta(tau) = 1 - 0.5 (1 + cos(pi tau / (2 s_max))), clipped to [0, 1].
        teacher_buffer_size: teachers kept: the c most recent returned client models.
        kd_iters: Adam steps of the server-side student per revived update.
        kd_temperature: temperature of the distillation's softmax.
        kd_lr: the student's Adam learning rate.
        kd_weight_decay: the student's Adam weight decay.
        synth_per_teacher: pool images per teacher in a KD step, labels drawn from its class proportions.
        synth_batch_size: images generated per synthesis round; the round's best batch joins the pool.
        synth_every_versions: synthesise at versions that are multiples of this (stale updates only; 1: every
            stale update, as R1 and R2's table run; 10: R2's paper-aligned interval).
        gen_noise_dim: the generator's noise dimension.
        gen_width: the generator's channels at 32x32 (twice that at 8x8 and 16x16; the reference's ngf).
        gen_class_weight: the generator's input is z + gen_class_weight * e_y.
        gen_adapt_steps: Adam steps of a synthesis round's generator copy.
        gen_lr: Adam learning rate of the generator's copy in a round.
        gen_z_lr: Adam learning rate of a round's z and class embeddings.
        gen_meta_lr: learning rate of the persistent meta-Adam (Reptile: gradient = persistent - adapted).
        bn_weight: weight of the feature-statistics matching term (DeepInversion style).
        adv_weight: weight of the adversarial student-teacher disagreement term (maximised where they agree).
        pool_size: synthetic images kept, first in first out.
        probe_temperature: softmax temperature of the class-proportion probe (Gaussian noise through a client's
            first two uploads).
        probe_samples: Gaussian-noise images of the class-proportion probe.
        distill_from_version: synthesis (generator and pool warm-up) starts at this global version; until then
            updates pass unchanged.
        kd_train_from_version: distillation and blending (revival), and the generator's adversarial term, start at
            this version.
        warmup_blend: what a stale update becomes between distill_from_version and kd_train_from_version: zero,
            (1 - beta) * delta, the blend with a zero distilled update, as both references do; pass, delta unchanged.
        class_proportions: each teacher's class proportions: true, the label histogram its device reports with its
            updates (as the authors' code and NVIDIA's port by default); estimate, the server's probe of the
            client's first two models with Gaussian noise (probe_samples, probe_temperature).
        num_classes: classes the generator synthesises (the data's).
        stabilize_losses: reject a non-finite feature, one-hot, adversarial or KD loss, or one above 3x the mean
            of its last (up to) 20 accepted values, as both references do (fedrevive.stabilize); a rejected
            loss counts as 0 and never enters its window.
        server_flip: the server's crop-and-flip of synthetic images (synthesis and distillation) also mirrors them,
            as both references do; off: crop only, for data whose classes are not mirror-symmetric (the devices'
            --augment is off there too).
        batched_teachers: the 8 teachers' forward passes in synthesis and distillation as one batched pass
            (torch.func.vmap over their stacked weights, fedrevive.teacher_batch) instead of one after another: on,
            off, or auto (on CUDA only). Equal to the loop to rounding, not bit for bit, so auto keeps a CPU run's
            bits; a model without data statistics always runs the loop.
    """

    s_max: float = 75.0
    teacher_buffer_size: int = 8
    kd_iters: int = 10
    kd_temperature: float = 1.0
    kd_lr: float = 1e-4
    kd_weight_decay: float = 1e-5
    synth_per_teacher: int = 32
    synth_batch_size: int = 64
    synth_every_versions: int = 10
    gen_noise_dim: int = 256
    gen_width: int = 128
    gen_class_weight: float = 0.2
    gen_adapt_steps: int = 2
    gen_lr: float = 3e-3
    gen_z_lr: float = 1e-3
    gen_meta_lr: float = 3e-3
    bn_weight: float = 0.003
    adv_weight: float = 0.1
    pool_size: int = 16000
    probe_temperature: float = 0.8
    probe_samples: int = 512
    distill_from_version: int = 50
    kd_train_from_version: int = 100
    warmup_blend: WarmupBlend = "zero"
    class_proportions: ClassProportions = "true"
    num_classes: int = 10
    stabilize_losses: bool = True
    server_flip: bool = True
    batched_teachers: BatchedTeachers = "auto"

    def __post_init__(self) -> None:
        if self.s_max <= 0:
            raise ValueError(f"s_max must be > 0, got {self.s_max}")
        counts = {
            "teacher_buffer_size": self.teacher_buffer_size,
            "synth_per_teacher": self.synth_per_teacher,
            "synth_batch_size": self.synth_batch_size,
            "synth_every_versions": self.synth_every_versions,
            "pool_size": self.pool_size,
            "gen_width": self.gen_width,
        }
        bad = [f"{k}={v}" for k, v in counts.items() if v < 1]
        if bad:
            raise ValueError(f"{', '.join(bad)}: must be >= 1")
        if self.kd_train_from_version < self.distill_from_version:
            raise ValueError("kd_train_from_version must be >= distill_from_version")
        if self.warmup_blend not in typing.get_args(WarmupBlend):
            raise ValueError(f"--fr-warmup-blend {self.warmup_blend!r}: use zero or pass")
        if self.class_proportions not in typing.get_args(ClassProportions):
            raise ValueError(f"--fr-class-proportions {self.class_proportions!r}: use true or estimate")
        if self.batched_teachers not in typing.get_args(BatchedTeachers):
            raise ValueError(f"--fr-batched-teachers {self.batched_teachers!r}: use auto, on or off")

    def to_dict(self) -> dict:
        return asdict(self)
