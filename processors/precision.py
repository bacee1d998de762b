"""The numerics training and FedRevive's server compute in (``--precision``): one rule for every engine.

* ``fp32`` (the default): full float32, TF32 off in cuDNN's convolutions and cuBLAS's matrix products (torch lets
  cuDNN use TF32 by default on Ampere and later; with it a grouped device was 5% from the same device alone on an
  H200, ``processors.device.full_float32``).
* ``tf32``: float32 storage, TF32 tensor cores for convolutions and matrix products, as plain PyTorch runs
  convolutions by default on these GPUs (both FedRevive references run so). On a CPU the same as ``fp32``.
* ``bf16``: the forward passes under ``torch.autocast`` in bfloat16 (on CUDA and on the CPU); the weights, their
  gradients and the optimiser's state stay float32, and each loss, the statistic trackers' moments and FedRevive's
  feature statistics are taken in float32 from the bfloat16 activations. No loss scaling: bfloat16 has float32's
  exponent range. What autocast leaves in float32 runs with TF32 off.

Each is deterministic on a given machine where float32 is (a seeded run repeats bit for bit); each changes the
bits against the others. Which one a GPU should default to is decided by measurement (GPU_FIX_NOTES.md,
``benchmarks/repro/paper_seed.py --new "--precision bf16"``); until then every default is ``fp32``, so a run's bits on
the CPU are what they were.
"""

from __future__ import annotations

import contextlib

import torch

from processors.device import full_float32


def use_precision(precision: str, device: torch.device) -> None:
    """Set this process's TF32 switches for ``precision`` on a CUDA ``device`` (process-wide: every thread of it
    computes so); on the CPU nothing."""
    if device.type != "cuda":
        return
    if precision == "tf32":
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        full_float32()


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Around a forward pass: bfloat16 autocast on ``device`` for ``bf16``; nothing otherwise (the same bits)."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def flushed_denormals(on: bool):
    """Around a task's training: with ``on``, this thread takes and makes float32 denormals as zero
    (``TrainingConfig.flush_denormal``), and keeps them again after; without, nothing (the same bits). The setting
    is the calling thread's (the CPU's control register), so it holds for torch's work on this thread: all of it
    when torch runs one intra-op thread."""
    if not on:
        yield
        return
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


LOW_PRECISION = (torch.bfloat16, torch.float16)


def widened(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when autocast made it bfloat16 (or half); any other tensor as it is (float32 and float64
    keep their bits)."""
    return t.float() if t.dtype in LOW_PRECISION else t
