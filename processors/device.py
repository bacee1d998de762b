"""The one place that decides which torch device simulated devices train on (the "compute device").

``auto`` means CUDA when present, else CPU. Asking for CUDA explicitly on a machine without it is an
error, never a silent fallback to the CPU.
"""

from __future__ import annotations

import torch


def resolve_device(name: str | None = "auto") -> torch.device:
    """Turn a user's device string (``auto``, ``cpu``, ``cuda``, ``cuda:1``) into a ``torch.device``."""
    if name in (None, "", "auto"):
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"--compute-device {name} asked for CUDA, but torch.cuda.is_available() is False "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). "
                "Use --compute-device cpu, or install a CUDA build of torch and check the driver with nvidia-smi."
            )
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"--compute-device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible.")
        # always with its index: torch's memory calls refuse a bare "cuda", and cuda != cuda:0 when devices compare
        device = torch.device("cuda", index)
    elif device.type != "cpu":
        raise ValueError(f"--compute-device {name}: unsupported device type {device.type!r}; use auto, cpu or cuda[:N]")
    return device


def full_float32() -> None:
    """Train in full float32 on CUDA: no TF32 in cuDNN's convolutions or cuBLAS's matrix products. torch lets cuDNN
    use TF32 by default on Ampere and later, and with it a grouped device no longer equals the same device trained
    alone (``benchmarks/checks/gpu_equivalence.py``; the figures: GPU_FIX_NOTES.md), so the engines would disagree and a
    seed's curve would depend on the grouping."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
