"""Does the references' crop-and-flip augmentation help on the generated data? Centralised training of
cifar10_convnet on the hard generated data (``--synthetic-difficulty 1``), with and without ``--augment``.

The generated classes are smooth colour patterns that are not mirror-symmetric: a mirrored sample is no sample of
its class, so augmentation made for natural images (CIFAR-10, where a mirrored cat is a cat) only slows learning
here. This is why ``reproduce_fedrevive.py``'s cpu scale trains without it and its paper scale with it.

    python benchmarks/repro/augment_on_generated_data.py --steps 400
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from processors.data.sources import make_synthetic  # noqa: E402
from processors.models import build_model  # noqa: E402
from processors.training import TrainingConfig, evaluate_accuracy, train_local  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400, help="Adam steps of batch 32 at lr 1e-3")
    parser.add_argument("--train-size", type=int, default=4000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = make_synthetic(args.train_size, 1000, seed=0, difficulty=1.0)
    for augment in (False, True):
        torch.manual_seed(0)
        model = build_model("cifar10_convnet")
        start = {k: v.detach().clone() for k, v in model.state_dict().items()}
        cfg = TrainingConfig(local_iters=args.steps, local_lr=1e-3, augment=augment, compute_device="cpu")
        began = time.perf_counter()
        train_local(model, start, data.x_train, data.y_train, cfg, torch.Generator().manual_seed(1))
        print(
            f"augment {'on ' if augment else 'off'}: test accuracy {evaluate_accuracy(model, data.x_test, data.y_test):.3f}"
            f" ({time.perf_counter() - began:.1f} s)"
        )


if __name__ == "__main__":
    main()
