"""FedReviveConfig: every FedRevive constant in one place, with the paper's defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class FedReviveConfig:
    """Hyperparameters of FedRevive (Askin et al., arXiv 2511.00655).

    Defaults follow the authors' code (R1, ``research/fed-revive/codes``) and NVIDIA's port (NVFlare PR 5274) in
    the paper's main setting; ``synth_every_versions`` = 10 is that setting's generator schedule (the authors'
    simulator synthesises on every stale update: 1).
    """

    # Staleness blending: beta(tau) = 1 - 0.5 * (1 + cos(pi * tau / (2 * s_max))), clipped to [0, 1].
    s_max: float = 75.0
    # Teacher buffer: the c most recent returned client models.
    teacher_buffer_size: int = 8
    # Knowledge distillation of the server-side student.
    kd_iters: int = 10
    kd_temperature: float = 1.0
    kd_lr: float = 1e-4
    kd_weight_decay: float = 1e-5  # the student's Adam weight decay
    synth_per_teacher: int = 32  # pool images per teacher in a KD step, labels drawn from its class proportions
    # Class-conditional generator and its meta (Reptile) adaptation.
    synth_batch_size: int = 64  # images generated per synthesis round; the round's best batch joins the pool
    synth_every_versions: int = 10  # synthesise at versions that are multiples of this (stale updates only)
    gen_noise_dim: int = 256
    gen_width: int = 128  # the reference's ngf: channels at 32x32 (twice that at 8x8 and 16x16)
    gen_class_weight: float = 0.2  # generator input z + gen_class_weight * e_y
    gen_adapt_steps: int = 2
    gen_lr: float = 3e-3  # Adam lr of the generator's copy in a round
    gen_z_lr: float = 1e-3  # Adam lr of the round's z and class embeddings
    gen_meta_lr: float = 3e-3  # the persistent meta-Adam's lr (Reptile: gradient = persistent - adapted)
    bn_weight: float = 0.003  # feature-statistics matching (DeepInversion-style) weight
    adv_weight: float = 0.1  # adversarial student-teacher disagreement weight (maximised where they agree)
    pool_size: int = 16000  # synthetic images kept, FIFO eviction
    # Server-side class-proportion probe (Gaussian noise through a client's first two uploads).
    probe_temperature: float = 0.8
    probe_samples: int = 512
    # Warm-up schedule, in global model versions.
    distill_from_version: int = 50  # generator/pool warm up from here (beta still 0)
    kd_train_from_version: int = 100  # KD + blending, and the generator's adversarial term, from here
    num_classes: int = 10

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

    def to_dict(self) -> dict:
        return asdict(self)
