"""A method's training rule (``processors.device_rule``) runs unchanged in both engines, and the per-device state
store (``processors.device_state``) keeps only devices that trained, spills past its budget, and gives a task
retrained after a resume the state it started from the first time."""

from __future__ import annotations

import numpy as np
import torch

from processors.data.sources import make_synthetic
from processors.device_rule import DeviceRule, RuleRun
from processors.device_state import KEEP_DURABLE, DeviceStateStore
from processors.models import build_model
from processors.training import TrainingConfig, train_local, worker_model
from processors.training_vectorized import train_group

MODEL = "cifar10_convnet"
CPU = torch.device("cpu")
CFG = TrainingConfig(model=MODEL, local_iters=3, local_batch_size=16, local_lr=0.05, optimizer="adam")


class Drift(DeviceRule):
    """Adds the device's kept drift to every gradient, reports the trained parameters' norm and keeps a new drift
    (a function of the training): exercises every hook, under vmap and not."""

    keeps_state = True
    reports = ("norm",)

    def initial_state(self, received, extras):
        return {n: received[n] * 0 + 0.01 for n in received}

    def before(self, received, extras, state):
        return {n: state[n] + extras["shift"] for n in received}

    def step(self, params, grads, ctx):
        return {n: g + ctx[n] for n, g in grads.items()}

    def after(self, params, received, ctx):
        norm = sum(((p - received[n]) ** 2).sum() for n, p in params.items())
        return {"norm": norm}, {n: (params[n] - received[n]) * 0.5 for n in params}


def test_a_rule_gives_the_same_diffs_reports_and_states_in_both_engines():
    data = make_synthetic(200, 50, seed=5)
    torch.manual_seed(3)
    params = {k: v.detach().clone() for k, v in build_model(MODEL).state_dict().items()}
    extras = {"shift": torch.tensor(0.002)}
    devices = [(data.x_train[i * 40 : (i + 1) * 40], data.y_train[i * 40 : (i + 1) * 40]) for i in range(3)]
    rng = np.random.default_rng(0)
    kept = {n: rng.normal(0, 0.01, v.shape).astype(np.float32) for n, v in build_model(MODEL).named_parameters()}
    states = [None, kept, None]  # a device's first task, and one with kept state
    model = worker_model(MODEL, CPU)
    one = []
    for i, (x, y) in enumerate(devices):
        run = RuleRun(Drift(), [states[i]])
        diff = train_local(model, params, x, y, CFG, torch.Generator().manual_seed(i), extras=extras, rule=run)
        one.append((diff, run.reports[0], run.new_states[0]))
    group = RuleRun(Drift(), states)
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    diffs = train_group(MODEL, params, devices, CFG, gens, CPU, extras=extras, rule=group)
    # devices of different versions (an asynchronous leaf's group): each its own start dict and extras, stacked
    mixed = RuleRun(Drift(), states)
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    starts, own_extras = [dict(params) for _ in range(3)], [dict(extras) for _ in range(3)]
    mixed_diffs = train_group(MODEL, starts, devices, CFG, gens, CPU, extras=own_extras, rule=mixed)
    plain = train_local(model, params, *devices[0], CFG, torch.Generator().manual_seed(0), extras=extras)
    for i, (diff, reports, state) in enumerate(one):
        for run, run_diffs in ((group, diffs), (mixed, mixed_diffs)):
            for name, d in diff.items():
                np.testing.assert_allclose(run_diffs[i][name], d, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(run.reports[i]["norm"], reports["norm"], rtol=1e-4)
            for name, s in state.items():
                np.testing.assert_allclose(run.new_states[i][name], s, rtol=1e-4, atol=1e-7)
    # the rule changed training, and the kept state changed it again
    assert not np.allclose(plain["fc3.weight"], one[0][0]["fc3.weight"])
    assert not np.allclose(one[0][0]["fc3.weight"], one[1][0]["fc3.weight"])


def arrays(value: float) -> dict[str, np.ndarray]:
    return {"a": np.full(1000, value, dtype=np.float32)}  # 4000 bytes


def test_the_store_holds_only_devices_that_trained_and_spills_past_its_budget(tmp_path):
    store = DeviceStateStore(str(tmp_path), memory_budget=10_000, durable=False)
    assert store.get("leaf#0") is None and store.devices() == 0 and store.disk_bytes() == 0
    for d in range(5):
        store.put(f"leaf#{d}", d, arrays(d))
    assert store.memory_bytes() <= 10_000 and store.spills == 3 and store.devices() == 5
    assert store.disk_bytes() > 3 * 4000  # the three least recently used went to disk
    for d in range(5):  # every device's newest state, from memory or disk
        assert store.get(f"leaf#{d}")["a"][0] == d
    store.put("leaf#0", 9, arrays(9.0))  # a newer state supersedes the spilled one
    assert store.get("leaf#0")["a"][0] == 9.0 and len(list((tmp_path / "leaf_0").glob("*.npz"))) <= 1


def test_a_retrained_task_starts_from_the_state_it_started_from_before_even_after_a_resume(tmp_path):
    store = DeviceStateStore(str(tmp_path), memory_budget=0, durable=True)
    for selection in (3, 7, 12):  # the device's tasks
        start = store.get("leaf#1", before=selection)
        store.put("leaf#1", selection, arrays(selection if start is None else start["a"][0] + selection))
    assert store.get("leaf#1", before=12)["a"][0] == 10.0  # what task 12 started from: 3 + 7
    # a resumed run: a new store on the same folder; the checkpoint had selection 7 in flight
    again = DeviceStateStore(str(tmp_path), memory_budget=10**6, durable=True, fresh=False)
    assert again.get("leaf#1", before=7)["a"][0] == 3.0
    again.put("leaf#1", 7, arrays(10.0))
    assert not (tmp_path / "leaf_1" / "12.npz").exists()  # the killed run's later task: the resumed run redoes it
    assert again.get("leaf#1", before=12)["a"][0] == 10.0
    for selection in range(20, 20 + 2 * KEEP_DURABLE):
        again.put("leaf#1", selection, arrays(selection))
    assert len(list((tmp_path / "leaf_1").glob("*.npz"))) == KEEP_DURABLE
    # a fresh run in the same folder starts every device anew
    assert DeviceStateStore(str(tmp_path), memory_budget=0, durable=True).get("leaf#1") is None
    assert not (tmp_path / "leaf_1").exists()
