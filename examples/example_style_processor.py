"""A task processor written the way NVFlare's edge examples write theirs, knowing nothing of this project.

It stands for a user's own ``DeviceTaskProcessor`` in ``drop_in_recipe.py`` (and so in ``benchmarks/perf/bench_byo.py``
and the drop-in test): each task loads the dataset from disk, takes the device's subset, builds a ``DataLoader``,
trains its own small ConvNet (the classic CIFAR-10 tutorial network, as NVFlare's example) from the global weights
with Adam, and returns the weight difference as Python lists in a ``WEIGHT_DIFF`` DXO, as NVFlare's stock
aggregator expects. Nothing here sets torch
threads or knows how many devices train beside it: that is the simulator's job.

``write_dataset`` makes the file it reads (random CIFAR-shaped images whose label is a function of their mean
colour, so training has something to learn); there is no network here for the real CIFAR-10.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
import torch.nn.functional as F
from nvflare.apis.dxo import DXO, DataKind, from_dict
from nvflare.edge.simulation.device_task_processor import DeviceTaskProcessor
from nvflare.edge.web.models.job_response import JobResponse
from nvflare.edge.web.models.task_response import TaskResponse
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class TutorialConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def write_dataset(path: str, size: int = 10_000, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(size, 32, 32, 3), dtype=np.uint8)
    labels = (images.reshape(size, -1, 3).mean(axis=1) @ np.array([1.0, 2.0, 4.0]) // 45).astype(np.int64) % 10
    np.savez(path, x=images, y=labels)
    return path


class ExampleStyleProcessor(DeviceTaskProcessor):
    """Args:
    data_file: the ``.npz`` file ``write_dataset`` made.
    subset_size: samples per device.
    batch_size: local batch size.
    epochs: local epochs (subset_size / batch_size steps each).
    lr: Adam's learning rate.
    loader_workers: the DataLoader's ``num_workers`` (NVFlare's example uses 2).
    """

    def __init__(
        self,
        data_file: str,
        subset_size: int = 800,
        batch_size: int = 32,
        epochs: int = 1,
        lr: float = 1e-3,
        loader_workers: int = 0,
    ):
        DeviceTaskProcessor.__init__(self)
        self.data_file = data_file
        self.subset_size = subset_size
        self.batch_size = batch_size
        self.epochs = epochs
        self.lr = lr
        self.loader_workers = loader_workers

    def setup(self, job: JobResponse) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def _load_subset(self) -> TensorDataset:
        with np.load(self.data_file) as f:  # every task, as the example does
            x, y = f["x"], f["y"]
        device_id = self.device.device_id if self.device is not None else "device"
        rng = np.random.default_rng(zlib.crc32(device_id.encode()))
        idx = rng.choice(len(x), size=self.subset_size, replace=False)
        images = torch.from_numpy(x[idx]).permute(0, 3, 1, 2).float().div(255.0)
        return TensorDataset(images, torch.from_numpy(y[idx]))

    def train(self, global_model: dict) -> dict:
        loader = DataLoader(
            self._load_subset(), batch_size=self.batch_size, shuffle=True, num_workers=self.loader_workers
        )
        net = TutorialConvNet()
        net.load_state_dict(global_model)
        optimizer = torch.optim.Adam(net.parameters(), lr=self.lr)
        for _ in range(self.epochs):
            for inputs, labels in loader:
                optimizer.zero_grad()
                F.cross_entropy(net(inputs), labels).backward()
                optimizer.step()
        return {k: (v.numpy() - global_model[k].numpy()).tolist() for k, v in net.state_dict().items()}

    def process_task(self, task: TaskResponse) -> dict:
        model = from_dict(task.task_data)
        if not isinstance(model, DXO) or model.data_kind != DataKind.WEIGHTS:
            raise ValueError(f"expected a WEIGHTS DXO, got {type(model).__name__}")
        global_model = {k: torch.tensor(np.asarray(v)) for k, v in model.data.items()}
        return DXO(data_kind=DataKind.WEIGHT_DIFF, data={"dict": self.train(global_model)}).to_dict()
