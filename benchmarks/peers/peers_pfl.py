"""pfl-research's side of ``bench_peers.py``: one worker of ``torchrun --nproc_per_node=2`` (pfl's advice: a
process per core), training the shared work with pfl's own FedAvg and simulated backend.

Arguments: the work (JSON, ``bench_peers.work``) and the file rank 0 writes its times and final accuracy to.
Each user's dataset is that user's 50 samples of our job (``bench_peers.load_work``), local training is pfl's
(SGD, one epoch of batch 10 over 50 samples: 5 steps at lr 0.1), the server step is SGD at lr 1 on the averaged
update (plain FedAvg), and the initial weights are our job's. pfl samples each round's cohort itself.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.data.dataset import Dataset  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.data.sampling import get_user_sampler  # noqa: E402
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams  # noqa: E402
from pfl.metrics import Metrics, Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402

from benchmarks.peers.bench_peers import initial_net, load_work, test_accuracy, user_names  # noqa: E402


class PflNet(torch.nn.Module):
    """Our ``Cifar10ConvNet`` with the ``loss`` and ``metrics`` pfl's PyTorch model asks for."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)

    def loss(self, x, y, eval=False):  # noqa: A002 - pfl's keyword
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=False):  # noqa: A002
        self.eval() if eval else self.train()
        loss = F.cross_entropy(self(x), y, reduction="sum").item()
        return {"loss": Weighted(loss, len(y))}


class Times(TrainingProcessCallback):
    def __init__(self):
        self.ready = 0.0
        self.round_ends: list[float] = []

    def on_train_begin(self, *, model):
        self.ready = time.time()
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        self.round_ends.append(time.time())
        return False, Metrics()


def main() -> None:
    w, out = json.loads(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)  # one process per core
    data, users = load_work(w)
    names = user_names(w)

    def make_dataset(name):
        return Dataset(raw_data=list(users[name]), user_id=name)

    sampler = get_user_sampler("random", names)
    training = FederatedDataset(make_dataset, sampler, user_id_to_weight={n: w["samples"] for n in names})
    net = PflNet(initial_net(w))
    model = PyTorchModel(
        net, local_optimizer_create=torch.optim.SGD, central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0)
    )
    times = Times()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=w["rounds"],
            evaluation_frequency=w["rounds"] + 1,
            train_cohort_size=w["cohort"],
            val_cohort_size=0,
        ),
        backend=SimulatedBackend(training_data=training, val_data=training),
        model=model,
        model_train_params=NNTrainHyperParams(
            local_learning_rate=w["lr"], local_num_epochs=1, local_batch_size=w["batch"]
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=1000),
        callbacks=[times],
        send_metrics_to_platform=False,
    )
    if int(os.environ.get("RANK", "0")) == 0:
        result = {"ready": times.ready, "round_ends": times.round_ends, "accuracy": test_accuracy(net.net, data)}
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
