"""How hard the synthetic dataset is: centralised training of a model on it, test accuracy per epoch.

Data that every method learns to 1.0 cannot rank FL methods. ``--synthetic-difficulty 1`` is calibrated with this
script so that centralised ``cifar10_convnet`` training ends where that model ends on CIFAR-10 (about 0.70-0.80):
all the training images, Adam (lr 1e-3), batch 64, the epochs given, evaluated on the test split after each epoch.

    python benchmarks/repro/calibrate_synthetic.py --difficulty 0 1 --epochs 10
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from processors.data.sources import make_synthetic  # noqa: E402
from processors.models import build_model  # noqa: E402


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        correct = sum(
            (model(x[i : i + 1000]).argmax(1) == y[i : i + 1000]).sum().item() for i in range(0, len(y), 1000)
        )
    model.train()
    return correct / len(y)


def train(difficulty: float, args) -> list[float]:
    data = make_synthetic(args.size, args.size // 5, args.seed, difficulty)
    x_train, x_test = data.prepare(data.x_train), data.prepare(data.x_test)
    torch.manual_seed(args.seed)
    model = build_model(args.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(args.seed)
    accuracies = []
    for _ in range(args.epochs):
        order = torch.randperm(len(data.y_train), generator=generator)
        for i in range(0, len(order), 64):
            idx = order[i : i + 64]
            loss = F.cross_entropy(model(x_train[idx]), data.y_train[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        accuracies.append(accuracy(model, x_test, data.y_test))
    return accuracies


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--difficulty", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--size", type=int, default=20000, help="training images (test: a fifth)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--model", default="cifar10_convnet")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    for difficulty in args.difficulty:
        started = time.time()
        acc = train(difficulty, args)
        print(
            f"difficulty {difficulty:g}: test accuracy by epoch {' '.join(f'{a:.3f}' for a in acc)} "
            f"(final {acc[-1]:.3f}, best {max(acc):.3f}; {time.time() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
