"""A device's local training settings (``TrainingConfig``), without importing torch: part of ``jobs.config``, so
building and checking a configuration (the flags, ``--help``, a refused value) does not load torch; what needs it
(the model's import in ``validate``, the optimiser) imports it when called. The training itself:
``processors.training`` and ``processors.training_vectorized``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Literal

from common.choices import ConfigError, check_choice, check_positive
from processors.model_names import AUTO, auto_model, check_model_name

if TYPE_CHECKING:
    import torch

Optimizer = Literal["adam", "sgd"]
Precision = Literal["fp32", "tf32", "bf16"]  # processors.precision
Compile = Literal["off", "default", "reduce-overhead"]  # torch.compile's modes (processors.training)
FlushDenormal = Literal["auto", "on", "off"]  # processors.precision.flushed_denormals
DEFAULT_LOCAL_ITERS = 25


@dataclass(frozen=True)
class TrainingConfig:
    """Local training of one simulated device. Defaults: the FedRevive paper's reference FedAvg client (Adam,
    lr 3e-4, 25 iterations of batch 32); a model's preset (``processors.model_names``) replaces the batch size,
    learning rate and optimizer the user does not give.

    Attributes:
        model: ``auto`` (the dataset's model: cifar10_convnet for cifar10 and synthetic, femnist_cnn for FEMNIST
            and TFF's EMNIST, char_lstm for Shakespeare and synthetic-text, word_lstm for StackOverflow; a job's
            config resolves it, processors.model_names), ``cifar10_convnet``, ``resnet18`` (the FedRevive paper's:
            statistic trackers, no BatchNorm), ``resnet18_bn``, ``femnist_cnn`` (LEAF's FEMNIST CNN, 1 x 28 x 28
            images, 62 classes), ``char_lstm`` (LEAF's Shakespeare next-character LSTM, for token-id data),
            ``word_lstm`` (TFF's StackOverflow next-word LSTM), or an ``nn.Module`` class as
            ``package.module:Class`` (``processors.models``).
        local_iters: optimizer steps per task (unless --local-epochs is given).
        local_epochs: passes over the device's own samples per task instead of --local-iters (0: off; the tail
            batch is kept, so a device with n samples takes ceil(n / batch) steps per epoch; processors.local_work).
        local_batch_size: samples per step (a device with fewer samples uses them all).
        local_lr: local learning rate.
        optimizer: the local optimizer.
        momentum: SGD momentum (no flag: ``jobs.api`` only).
        compute_device: torch device that trains: ``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``.
        augment: each local batch randomly cropped (padding 4) and flipped, as the FedRevive references train
            their clients (``processors.augment``; 32 x 32 natural images only; ``reproduce_fedrevive.py`` turns
            it on at the paper's scale).
        precision: the numerics of training and of FedRevive's server (processors.precision): fp32, full float32
            with TF32 off; tf32, TF32 tensor cores for convolutions and matrix products on CUDA (plain PyTorch's
            default for convolutions, as the FedRevive references run; on a CPU the same as fp32); bf16, forward
            passes under bfloat16 autocast, with the weights and the optimiser's state in float32.
        batches_on_device: each task's batch positions and crop-and-flip draws go to the compute device in one copy
            before its steps, instead of one small copy a step (no host transfer inside a task's steps; the same
            bits). Off until a GPU measures it (GPU_FIX_NOTES.md).
        channels_last: the per-device engine's model and batches in channels-last memory format (the layout
            cuDNN's tensor-core convolutions prefer); equal to the default layout to rounding. The vectorised
            engine ignores it. Off until a GPU measures it.
        compile: the per-device engine's model under torch.compile: off; default; reduce-overhead (CUDA graphs:
            a task's steps have one static batch shape with --local-iters). Compiled once per worker; equal to
            the eager model to rounding (fused kernels). The vectorised engine ignores it. Off until a GPU
            measures it.
        flush_denormal: whether, on the CPU, float32 values below the normal range (about 1.2e-38) are taken and
            made as zero while a task trains (``torch.set_flush_denormal``, the training thread's own setting; it
            covers the whole step when a worker trains on one thread, the CPU plan's default with as many workers
            as cores): auto, on for a run with --dp (its noisy weights drive activations and gradients there,
            which the CPU otherwise computes at its slow denormal speed), off otherwise; on; off. It changes a
            run's bits only where such a value reaches a result. CUDA's kernels ignore it.
    """

    model: str = AUTO
    local_iters: int = DEFAULT_LOCAL_ITERS
    local_epochs: int = 0
    local_batch_size: int = 32
    local_lr: float = 3e-4
    optimizer: Optimizer = "adam"
    momentum: float = 0.0
    compute_device: str = "auto"
    augment: bool = False
    precision: Precision = "fp32"
    batches_on_device: bool = False
    channels_last: bool = False
    compile: Compile = "off"
    flush_denormal: FlushDenormal = "auto"

    def __post_init__(self) -> None:
        check_positive({"--local-iters": self.local_iters, "--local-batch-size": self.local_batch_size})
        check_positive({"--local-lr": self.local_lr}, integer=False)
        if self.local_epochs < 0:
            raise ConfigError(f"--local-epochs {self.local_epochs}: must be >= 0 (0: train --local-iters steps)")
        if self.local_epochs and self.local_iters != DEFAULT_LOCAL_ITERS:
            raise ConfigError(
                f"--local-epochs {self.local_epochs} and --local-iters {self.local_iters}: give one unit of local "
                "work, epochs over each device's own data or a fixed number of steps, not both"
            )
        check_choice("--optimizer", self.optimizer, Optimizer)
        check_choice("--precision", self.precision, Precision)
        check_choice("--compile", self.compile, Compile)
        check_choice("--flush-denormal", self.flush_denormal, FlushDenormal)
        try:
            check_model_name(self.model)
        except ValueError as ex:
            raise ConfigError(str(ex)) from ex

    def validate(self) -> None:
        """Import the model it names (a user's ``package.module:Class``); ``ConfigError`` naming the fix. ``auto``
        must have been resolved by then (a job's build, ``jobs.build``)."""
        from processors.models import model_class  # torch: only when a run is about to start

        try:
            model_class(self.model)
        except ValueError as ex:
            raise ConfigError(str(ex)) from ex

    def resolved(self, dataset: str) -> TrainingConfig:
        """This config with ``auto`` replaced by the model of ``dataset`` (``processors.model_names.auto_model``), for a
        task processor made outside a job: a job's build (``jobs.build``) has resolved it once already."""
        if self.model != AUTO:
            return self
        return replace(self, model=auto_model(dataset))

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        import torch

        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.local_lr)
        return torch.optim.SGD(params, lr=self.local_lr, momentum=self.momentum)

    def flushes_denormals(self, private: bool) -> bool:
        """Whether a task flushes denormals (``flush_denormal``; ``private``: the run has DP on)."""
        return self.flush_denormal == "on" or (self.flush_denormal == "auto" and private)

    def to_dict(self) -> dict:
        return asdict(self)

    def steps(self, num_samples: int) -> int:
        """Optimizer steps a device holding ``num_samples`` samples takes per task: ``E x ceil(n / batch)`` with
        ``--local-epochs E`` (the tail batch kept), else ``T`` (``processors.local_work`` says why)."""
        if self.local_epochs > 0:
            return self.local_epochs * math.ceil(num_samples / self.local_batch_size)
        return self.local_iters

    def work(self, num_samples: int) -> int:
        """Samples a device holding ``num_samples`` samples trains on per task, counted over its steps: ``E x n``,
        or ``T x min(batch, n)``."""
        if self.local_epochs > 0:
            return self.local_epochs * num_samples
        return self.local_iters * min(self.local_batch_size, num_samples)
