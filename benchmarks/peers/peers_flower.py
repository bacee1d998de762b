"""Flower's side of ``bench_peers.py``: its Simulation Runtime (Ray, one CPU per client, as many clients at once as
there are cores), training the shared work with Flower's own ``FedAvg`` strategy and Message API.

Arguments: the work (JSON, ``bench_peers.work``) and the file the server writes its times and final accuracy to.
Each of the ``users`` SuperNodes is one user: partition ``i`` holds the samples of our job's device
``user_names(w)[i]`` (``bench_peers.load_work``); local training is 5 SGD steps of batch 10 at lr 0.1 from the
round's global weights; the server replaces the model with the mean of the returned models, weighted by their
sample counts (all equal: plain FedAvg, server learning rate 1); the initial weights are our job's. Flower samples
each round's cohort itself (``fraction_train`` = cohort / users). The times: ``ready`` when the strategy first
calls its evaluation (before round 1), a round's end each later call; the accuracy is computed once, after the
last round; ``unchanged_rounds`` counts the rounds whose global model equals the one before (every client of that
round failed: Flower logs the error and goes on), which ``bench_peers.py`` refuses to report as a result.

The apps are run from this module imported by name (``benchmarks.peers.peers_flower``), never from ``__main__``: Ray's
workers unpickle the client's functions by their module, and every client run from ``__main__`` failed with
"Can't get attribute 'actor_work' on <module '__main__'>" while the server went on with the initial model.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

from benchmarks.peers.bench_peers import initial_net, load_work, test_accuracy, user_names  # noqa: E402

WORK = json.loads(os.environ.get("BENCH_PEERS_WORK", "{}"))  # the work, for the Ray actors too


@functools.lru_cache(maxsize=1)
def actor_work():
    """The users' samples and a model to train in, once per Ray actor process."""
    torch.set_num_threads(1)  # one CPU per client
    _, users = load_work(WORK)
    return users, initial_net(WORK), user_names(WORK)


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    users, net, names = actor_work()
    x, y = users[names[int(context.node_config["partition-id"])]]
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    opt = torch.optim.SGD(net.parameters(), lr=WORK["lr"])
    net.train()
    for step in range(WORK["steps"]):
        batch = slice(step * WORK["batch"], (step + 1) * WORK["batch"])
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x[batch]), y[batch]).backward()
        opt.step()
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": MetricRecord({"num-examples": len(y)})})
    return Message(content=content, reply_to=msg)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    data, _ = load_work(WORK)
    net = initial_net(WORK)
    times = {"ready": 0.0, "round_ends": [], "accuracy": None, "unchanged_rounds": 0}
    previous: list = []

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        now = time.time()
        current = arrays.to_numpy_ndarrays()
        if previous and all(a.shape == b.shape and (a == b).all() for a, b in zip(current, previous, strict=True)):
            times["unchanged_rounds"] += 1
        previous[:] = current
        if server_round == 0:
            times["ready"] = now
            return None
        times["round_ends"].append(now)
        if server_round == WORK["rounds"]:
            net.load_state_dict(arrays.to_torch_state_dict())
            times["accuracy"] = test_accuracy(net, data)
        return None

    strategy = FedAvg(
        fraction_train=WORK["cohort"] / WORK["users"],
        fraction_evaluate=0.0,
        min_train_nodes=WORK["cohort"],
        min_available_nodes=WORK["users"],
    )
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(net.state_dict()),
        num_rounds=WORK["rounds"],
        evaluate_fn=evaluate,
    )
    with open(os.environ["BENCH_PEERS_OUT"], "w") as f:
        json.dump(times, f)


if __name__ == "__main__":
    from benchmarks.peers import peers_flower as apps  # by module name, so Ray's workers can unpickle the client

    cores = os.cpu_count() or 1
    run_simulation(
        server_app=apps.server,
        client_app=apps.client,
        num_supernodes=WORK["users"],
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": cores}},
    )
