"""SCAFFOLD and FedNova (``examples/scaffold.py``, ``examples/fednova.py``) against plain-PyTorch reference loops
written here from the papers' equations: the same devices, data, batch order and seeds, a few versions, the
methods' own code path (the job's task processor with both engines, the device state store, the strategies). A
device trains again in later versions, so SCAFFOLD's ``c_i`` must have been kept across its tasks."""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from aggregation.global_model import make_strategy
from aggregation.strategy import ServerContext, Update
from common.protocol import DEVICE_EXTRA_PREFIX, reports_of
from jobs.config import FederationConfig, JobConfig
from jobs.methods import method_of
from jobs.run_config import RunConfig
from processors import compute_context
from processors.data.config import DataConfig
from processors.data.sources import load_dataset
from processors.models import build_model, statistic_names
from processors.task_processor import TrainingTaskProcessor
from processors.training import TrainingConfig, batch_schedule
from tests.conftest import REPO

sys.path.insert(0, os.path.join(REPO, "examples"))
from fednova import FedNova, normaliser  # noqa: E402
from scaffold import Scaffold  # noqa: E402

MODEL = "cifar10_convnet"
DATA = DataConfig(synthetic_size=600, subset_size=40, dirichlet_alpha=0.5)
TRAIN = TrainingConfig(
    model=MODEL, local_iters=3, local_batch_size=16, local_lr=0.05, optimizer="sgd", compute_device="cpu"
)
SEED = 4
NUM_DEVICES = 6
# each version's selected devices: a group (the vectorised engine), then one device alone (the per-device one),
# and devices that trained before (their kept state)
ROUNDS = [["d#0", "d#1", "d#2"], ["d#1"], ["d#0", "d#1", "d#3"], ["d#1", "d#2"]]


class History:
    def __init__(self, weights):
        self.versions = {1: weights}

    @property
    def current_version(self):
        return max(self.versions)

    @property
    def current_weights(self):
        return self.versions[self.current_version]

    def weights_of(self, version):
        return self.versions[version]


def initial_weights() -> dict[str, np.ndarray]:
    torch.manual_seed(SEED)
    return {k: v.detach().numpy().copy() for k, v in build_model(MODEL).state_dict().items()}


def run_method(method, tmp_path, processor_args: dict) -> dict[str, np.ndarray]:
    """The method's code path: the task processor trains each version's devices, the strategy aggregates."""
    compute_context._global_params.clear()  # the process's converted versions: these runs reuse version numbers
    spec = method_of(method)
    federation = FederationConfig(num_leaf_nodes=1, devices_per_leaf=NUM_DEVICES, device_selection_size=3)
    cfg = JobConfig(spec.label, DATA, federation, TRAIN, run=RunConfig(output=str(tmp_path / "out")))
    strategy = make_strategy(spec.strategy_path, spec.strategy_args(cfg))
    statistics = frozenset(statistic_names(build_model(MODEL)))
    strategy.setup(ServerContext(MODEL, statistics, SEED, "cpu", str(tmp_path)))
    history = History(initial_weights())
    strategy.start(history.current_weights)
    processor = TrainingTaskProcessor(
        DATA.to_dict(),
        TRAIN.to_dict(),
        seed=SEED,
        reports=spec.reports(cfg),
        rule=spec.rule_path,
        rule_args=spec.rule_args(cfg),
        **processor_args,
    )
    selection = 0
    for devices in ROUNDS:
        version = history.current_version
        extras = {DEVICE_EXTRA_PREFIX + k: v for k, v in strategy.device_extras(history).items()}
        sent = history.current_weights | extras
        selections = list(range(selection, selection + len(devices)))
        selection += len(devices)
        diffs = processor.train_devices(devices, [sent] * len(devices), [version] * len(devices), selections)
        for device, diff in zip(devices, diffs, strict=True):
            reports = reports_of(diff)
            model_diff = {k: v for k, v in diff.items() if not k.startswith(DEVICE_EXTRA_PREFIX)}
            strategy.add_update(Update(device, version, 1, model_diff, 0, 0.0, reports), history)
        history.versions[version + 1] = strategy.make_version(history, 0.0)
    return history.current_weights


def device_data(device: str, version: int):
    """The device's samples and its batch order, as the job's data path gives them."""
    processor = TrainingTaskProcessor(DATA.to_dict(), TRAIN.to_dict(), seed=SEED)
    _, x, y, generator = processor._prepare(device, version)
    return x, y, batch_schedule(len(y), TRAIN, generator), load_dataset(DATA.spec(SEED)).prepare


def local_sgd(x0: dict, device: str, version: int, correction: dict | None) -> tuple[dict, int]:
    """Plain local SGD from ``x0`` (``y <- y - lr * (g + correction)``); the trained parameters and the steps."""
    x, y, schedule, prepare = device_data(device, version)
    model = build_model(MODEL)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in x0.items()})
    params = dict(model.named_parameters())
    for positions in schedule:
        loss = F.cross_entropy(model(prepare(x[positions])), y[positions])
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for (name, p), g in zip(params.items(), grads, strict=True):
                p -= TRAIN.local_lr * (g + (correction[name] if correction else 0))
    return {n: p.detach().numpy().copy() for n, p in params.items()}, len(schedule)


def scaffold_reference() -> dict[str, np.ndarray]:
    """SCAFFOLD, option II (Karimireddy et al. 2020, Algorithm 1), eta_g = 1."""
    x = initial_weights()
    names = [n for n, _ in build_model(MODEL).named_parameters()]
    c = {n: torch.zeros(x[n].shape) for n in names}
    c_i: dict[str, dict] = {}
    for version, devices in enumerate(ROUNDS, start=1):
        delta_y, delta_c = [], []
        for d in devices:
            ci = c_i.get(d, {n: torch.zeros(x[n].shape) for n in names})
            y, k = local_sgd(x, d, version, {n: c[n] - ci[n] for n in names})
            new_ci = {
                n: ci[n] - c[n] + (torch.from_numpy(x[n]) - torch.from_numpy(y[n])) / (k * TRAIN.local_lr)
                for n in names
            }
            delta_y.append({n: y[n] - x[n] for n in names})
            delta_c.append({n: new_ci[n] - ci[n] for n in names})
            c_i[d] = new_ci
        x = x | {n: x[n] + np.mean([dy[n] for dy in delta_y], axis=0) for n in names}
        c = {n: c[n] + sum(dc[n] for dc in delta_c) / NUM_DEVICES for n in names}
    return x


def fednova_reference() -> dict[str, np.ndarray]:
    """FedNova (Wang et al. 2020, eq. 6-7 with plain SGD: a_i = tau_i), p_i = n_i / n, eta_g = 1."""
    x = initial_weights()
    names = [n for n, _ in build_model(MODEL).named_parameters()]
    for version, devices in enumerate(ROUNDS, start=1):
        trained = [local_sgd(x, d, version, None) for d in devices]
        n = np.array([len(device_data(d, version)[1]) for d in devices], dtype=np.float64)
        p = n / n.sum()
        a = np.array([normaliser(k, 0.0) for _, k in trained])
        tau_eff = float((p * a).sum())
        x = x | {
            n_: x[n_] + tau_eff * sum(p[i] * (trained[i][0][n_] - x[n_]) / a[i] for i in range(len(devices)))
            for n_ in names
        }
    return x


def close(ours: dict, reference: dict) -> None:
    """The parameters (the references train no statistic trackers; the strategies average them as FedAvg does)."""
    for name, _ in build_model(MODEL).named_parameters():
        ref = reference[name]
        np.testing.assert_allclose(ours[name], ref, rtol=1e-4, atol=2e-5, err_msg=name)


def test_scaffold_matches_the_papers_equations_with_its_state_in_memory_or_on_disk(tmp_path):
    reference = scaffold_reference()
    for memory_mb in (256.0, 0.0):  # every device's state in memory; all of it on disk, read back each task
        folder = tmp_path / f"state-{memory_mb}"
        state = {"dir": str(folder), "memory_mb": memory_mb, "durable": memory_mb == 0, "fresh": True}
        close(run_method(Scaffold, tmp_path, {"device_state": state}), reference)
        assert len(os.listdir(folder) if folder.exists() else []) == (
            4 if memory_mb == 0 else 0
        )  # one folder per device that trained
    # the correction mattered: FedAvg from the same start ends elsewhere
    plain = run_method("fedavg", tmp_path, {})
    assert max(float(np.abs(plain[n] - reference[n]).max()) for n, _ in build_model(MODEL).named_parameters()) > 1e-4


def test_fednova_matches_the_papers_equations(tmp_path):
    close(run_method(FedNova, tmp_path, {}), fednova_reference())
