"""FedReviveConfig: every FedRevive constant in one place, with the paper's defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class FedReviveConfig:
    """Hyperparameters of FedRevive (Askin et al., arXiv 2511.00655).

    Defaults follow the paper where it states a value; ``gen_lr`` and ``gen_reptile_lr`` are our choices
    (the usual FastDFKD-style values), see the field comments.
    """

    # Staleness blending: beta(tau) = 1 - 0.5 * (1 + cos(pi * tau / (2 * s_max))), clipped to [0, 1].
    s_max: float = 75.0
    # Teacher buffer: the c most recent returned client models.
    teacher_buffer_size: int = 8
    # Knowledge distillation of the server-side student.
    kd_iters: int = 10
    kd_temperature: float = 1.0
    kd_lr: float = 1e-4
    synth_per_teacher: int = 32  # synthetic images per teacher in a generator / KD batch
    # Class-conditional generator and its meta (Reptile) adaptation.
    gen_noise_dim: int = 256
    gen_width: int = 64  # DCGAN base width (channels at 32x32); the 32x32 convs dominate synthesis cost
    gen_adapt_steps: int = 2
    gen_lr: float = 1e-3  # Adam lr of the fast copy; the common DFKD value
    gen_reptile_lr: float = 0.5  # persistent <- persistent + lr * (adapted - persistent); our choice
    bn_weight: float = 0.003  # feature-statistics matching (DeepInversion-style) weight
    adv_weight: float = 0.1  # adversarial teacher-student disagreement weight (maximised)
    pool_size: int = 16000  # synthetic images kept, FIFO eviction
    # Server-side class-proportion probe (Gaussian noise through a client's first two uploads).
    probe_temperature: float = 0.8
    probe_samples: int = 512
    # Warm-up schedule, in global model versions.
    distill_from_version: int = 50  # generator/pool warm up from here (beta still 0)
    kd_train_from_version: int = 100  # KD + blending from here
    num_classes: int = 10

    def __post_init__(self) -> None:
        if self.s_max <= 0:
            raise ValueError(f"s_max must be > 0, got {self.s_max}")
        if self.teacher_buffer_size < 1 or self.synth_per_teacher < 1 or self.pool_size < 1:
            raise ValueError("teacher_buffer_size, synth_per_teacher and pool_size must be >= 1")
        if self.kd_train_from_version < self.distill_from_version:
            raise ValueError("kd_train_from_version must be >= distill_from_version")

    def to_dict(self) -> dict:
        return asdict(self)
