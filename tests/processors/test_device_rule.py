"""A method's training rule (``processors.device_rule``) runs unchanged in both engines, and the per-device state
store (``processors.device_state``) keeps only devices that trained, spills past its budget, and gives every task
retrained after a resume the state it started from the first time."""

from __future__ import annotations

import numpy as np
import torch

from common.result_files import DEVICE_STATE
from processors.data.sources import make_synthetic
from processors.device_rule import DeviceRule, RuleRun
from processors.device_state import DeviceStateStore
from processors.models import build_model
from processors.training import TrainingConfig, train_local, worker_model
from processors.training_vectorized import train_group
from scheduling import checkpoint

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


def train(store: DeviceStateStore, device: str, selections: list[int], reads: dict[int, float]) -> None:
    """Each task of ``selections`` reads the state it starts from and keeps a new one made from it."""
    for selection in selections:
        start = store.get(device, before=selection)
        reads[selection] = -1.0 if start is None else float(start["a"][0])
        store.put(device, selection, arrays(reads[selection] * 0.5 + selection))


def checkpoint_at(results, version: int, in_flight: list[int], selection_seq: int) -> None:
    schedule = {"in_flight": [{"selection_id": s} for s in in_flight], "selection_seq": selection_seq}
    checkpoint.write(str(results), {"meta": {"version": version}, "schedule": schedule})


def saved(results, device: str = "leaf_1") -> list[int]:
    return sorted(int(p.stem) for p in (results / DEVICE_STATE / device).glob("*.npz"))


def test_a_resume_retrains_every_task_from_the_state_it_started_from_and_old_states_are_dropped(tmp_path):
    before, after = [2, 4], [6, 10, 13, 17, 21]  # the device trains 5 times after the checkpoint
    assert checkpoint.selection_floor({"in_flight": [], "selection_seq": 9}) == 10  # none in flight: the next one
    reference, killed = tmp_path / "whole", tmp_path / "killed"
    expected: dict[int, float] = {}
    for results, reads in ((reference, expected), (killed, {})):
        store = DeviceStateStore(str(results / DEVICE_STATE), memory_budget=0, durable=True)
        train(store, "leaf#1", before, reads)
        assert store.floor() == 0 and saved(results) == before  # no checkpoint yet: nothing a resume could skip
        checkpoint_at(results, 3, in_flight=[6, 9], selection_seq=9)  # the device in flight with selection 6
        train(store, "leaf#1", after, reads)
        assert store.floor() == 6
        # kept: the newest state below the floor (what selection 6 starts from), and every one from the floor on
        assert saved(results) == [4, *after]
    # the killed run stops here; resumed, the server issues selections 6, 10, ... again, with the same ids
    resumed: dict[int, float] = {}
    again = DeviceStateStore(str(killed / DEVICE_STATE), memory_budget=10**6, durable=True, fresh=False)
    train(again, "leaf#1", after[:3], resumed)
    assert saved(killed) == [4, 6, 10, 13]  # the killed run's later tasks are gone: the resumed run redoes them
    checkpoint_at(killed, 5, in_flight=[17], selection_seq=17)  # the resumed run's own checkpoint
    train(again, "leaf#1", after[3:], resumed)
    assert resumed == {s: expected[s] for s in after}  # every retrained task read what it read the first time
    assert saved(killed) == [13, 17, 21]  # below the new floor, only what selection 17 starts from
    # a fresh run in the same folder starts every device anew
    assert DeviceStateStore(str(killed / DEVICE_STATE), memory_budget=0, durable=True).get("leaf#1") is None
    assert not (killed / DEVICE_STATE / "leaf_1").exists()
