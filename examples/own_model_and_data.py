"""Your own model and data through the Python API: FedBuff on 2 leaves x 20 devices with the paper's delays."""

import numpy as np
import torch.nn as nn

from jobs.api import run


class TinyNet(nn.Module):  # any nn.Module whose output is one score per class
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        return self.net(x)


if __name__ == "__main__":  # the job's processes import this file for TinyNet: keep the run below the guard
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 3000)
    features = (rng.normal(size=(3, 16))[labels] + rng.normal(size=(3000, 16))).astype(np.float32)
    result = run(
        "fedbuff",
        model=TinyNet,
        data=(features[:2500], labels[:2500], features[2500:], labels[2500:]),
        delays="paper",
        num_leaf_nodes=2,
        devices_per_leaf=20,
        device_selection_size=10,
        max_model_version=15,
        subset_size=50,
        local_iters=5,
        local_batch_size=16,
        local_lr=1e-2,
    )
    print(f"exit code {result.exit_code}, final accuracy {result.final_accuracy}, results in {result.output}")
