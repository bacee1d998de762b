"""Local training of one simulated device, pfl-research style: one model object reused per worker thread,
global weights copied in place, data resident on ``DEVICE`` (or, with the conservative utilisation profile, kept
on the CPU with each batch moved over).

The returned WEIGHT_DIFF is ``trained - received``, both on the same device, moved to the CPU as float32
numpy arrays (numpy, not Python lists: NVFlare's debug f-strings print lists in full, which costs ~0.1 s
per device). It covers the parameters and the data statistics (``processors.models.statistic_names``: BatchNorm
running mean / variance): a device starts from the global model's statistics, as from its weights, and reports how
its own data moved them, so the server's model evaluates and distils with statistics of real client data.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from processors import augment as augmentation
from processors.data.sources import normalize
from processors.device_rule import RuleRun
from processors.local_work import epoch_schedule
from processors.models import build_model, statistic_names
from processors.objective import DeviceObjective
from processors.precision import autocast, widened
from processors.privatize import clip_one
from processors.reports import last_step_losses
from processors.training_config import TrainingConfig


def batch_schedule(num_samples: int, cfg: TrainingConfig, generator: torch.Generator) -> list[torch.Tensor]:
    """Positions (into a device's own samples) of each local iteration's batch: epochs of a fresh
    permutation, cut into batches, for exactly ``local_iters`` iterations (full batches only); or, with
    ``local_epochs``, that many epochs with their tail batches (``processors.local_work.epoch_schedule``)."""
    if cfg.local_epochs:
        return epoch_schedule(num_samples, cfg.local_batch_size, cfg.local_epochs, generator)
    batches: list[torch.Tensor] = []
    order = torch.empty(0, dtype=torch.int64)
    batch = min(cfg.local_batch_size, num_samples)
    while len(batches) < cfg.local_iters:
        if len(order) < batch:
            order = torch.randperm(num_samples, generator=generator)
        batches.append(order[:batch])
        order = order[batch:]
    return batches


_worker = threading.local()


def worker_model(model_name: str, device: torch.device) -> nn.Module:
    """This thread's reusable model instance (built once per worker, not per task)."""
    cache = getattr(_worker, "models", None)
    if cache is None:
        cache = _worker.models = {}
    key = (model_name, str(device))
    if key not in cache:
        cache[key] = build_model(model_name).to(device)
    return cache[key]


_host = threading.local()


def copy_to_host(tensors: dict[str, torch.Tensor], pinned: bool = False) -> dict[str, np.ndarray]:
    """``tensors`` as numpy arrays on the CPU (each its own copy).

    ``pinned`` (CUDA only; ignored on the CPU): through this thread's reusable pinned host buffers with
    ``non_blocking`` copies on the current stream, which is then synchronised before numpy reads the buffers. A
    worker training on its own stream thus waits for its own copies only, while other workers keep computing.
    """
    first = next(iter(tensors.values()), None)
    if not pinned or first is None or first.device.type != "cuda":
        return {name: t.cpu().numpy() for name, t in tensors.items()}
    cache = getattr(_host, "pinned", None)
    if cache is None:
        cache = _host.pinned = {}
    staged = {}
    for name, t in tensors.items():
        key = (name, tuple(t.shape), t.dtype)
        buf = cache.get(key)
        if buf is None:
            buf = cache[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        buf.copy_(t, non_blocking=True)
        staged[name] = buf
    torch.cuda.current_stream(first.device).synchronize()
    return {name: buf.numpy().copy() for name, buf in staged.items()}


def train_local(
    model: nn.Module,
    global_params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    cfg: TrainingConfig,
    generator: torch.Generator,
    pinned: bool = False,
    prepare: Callable[[torch.Tensor], torch.Tensor] = normalize,
    objective: DeviceObjective | None = None,
    extras: dict[str, torch.Tensor] | None = None,
    last_step: dict[str, torch.Tensor] | None = None,
    rule: RuleRun | None = None,
    clip_norm: float | None = None,
    update_norm: list[float] | None = None,
) -> dict[str, np.ndarray]:
    """Train ``model`` from ``global_params`` on one device's samples; return its diff (parameters and statistics).

    ``global_params`` holds the global model's full state (parameters and buffers), on the model's device; the
    data is on it too, or on the CPU (each batch is then indexed there and moved over). ``prepare`` turns a
    stored batch into the model's input (``Dataset.prepare``; the default standardises uint8 images with
    CIFAR-10's statistics). ``objective`` (the method's device hook, ``processors.objective``) adds its term to
    each step's loss, with the server's ``extras``. The diff is computed on the model's device, then copied out
    (``copy_to_host``, through pinned buffers when ``pinned``). ``last_step``, when given, receives the last
    step's losses (``processors.reports.last_step_losses``), for the device's reports. ``rule`` (the method's
    training rule, ``processors.device_rule``) sets up from the received weights, corrects each step's gradients
    before the optimiser takes them, and keeps the device's reports and new state after the last step.
    ``clip_norm`` (differential privacy, ``processors.privatize``): the parameters' diff is clipped to this L2
    norm and the statistics' diffs are zeroed before they leave the compute device; ``update_norm``, when given,
    receives the parameters' norm before clipping.
    """
    device = next(model.parameters()).device
    shared = dict(model.named_parameters()) | {name: model.get_buffer(name) for name in statistic_names(model)}
    with torch.no_grad():
        for name, t in shared.items():
            src = global_params.get(name)
            if src is None:
                raise ValueError(
                    f"the global weights lack {name}: the server must send the model's whole "
                    "state_dict (parameters and data statistics)"
                )
            if src.device != device:
                raise ValueError(f"global weight {name} is on {src.device}, model on {device}")
            t.copy_(src)
        for name, b in model.named_buffers():  # counters (num_batches_tracked), as the global model has them
            if name not in shared and name in global_params:
                b.copy_(global_params[name])
    model.train()
    optimizer = cfg.make_optimizer(model.parameters())
    if objective is not None or rule is not None:
        params = dict(model.named_parameters())
        received = {name: global_params[name] for name in params}
    if rule is not None:
        rule.begin(received, extras or {})
    data_device = x.device
    schedule = batch_schedule(len(y), cfg, generator)
    if cfg.augment:  # drawn after the schedule, from the same generator: as the vectorised engine draws them
        offsets, flips = augmentation.draw(len(schedule), len(schedule[0]) if schedule else 0, generator)
    if cfg.batches_on_device and schedule and len({len(p) for p in schedule}) == 1:  # one copy, not one a step
        schedule = list(torch.stack(schedule).to(data_device).unbind(0))
        if cfg.augment:
            offsets, flips = offsets.to(device), flips.to(device)
    layout = channels_last_layout(model, cfg.channels_last)
    forward = compiled(model, cfg.compile)
    for step, positions in enumerate(schedule):
        positions = positions.to(data_device, non_blocking=True)
        xb, yb = x.index_select(0, positions), y.index_select(0, positions)
        if data_device != device:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        if cfg.augment:  # a tail batch (--local-epochs) takes the first of its step's draws
            xb = augmentation.crop_flip(xb, offsets[step, : len(positions)], flips[step, : len(positions)])
        inputs = prepare(xb)
        if layout is not None and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=layout)
        with autocast(cfg.precision, device):  # bf16: the forward pass only; weights, grads, state in float32
            logits = forward(inputs)
        logits = widened(logits)  # the loss in float32 (bf16 logits); float32 and float64 as they are
        loss = F.cross_entropy(logits, yb)
        if objective is not None:
            loss = loss + objective.loss(params, received, extras or {})
        if last_step is not None and step == len(schedule) - 1:  # read from this step's logits: no extra pass
            last_step.update(last_step_losses(logits, yb, loss))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if rule is not None:
            _correct(params, rule)
        optimizer.step()
    if rule is not None:
        rule.end(params, received)
    with torch.no_grad():  # (contiguous: a channels-last weight's diff too, so the arrays are plain C order)
        diff = {name: (t.detach() - global_params[name]).contiguous() for name, t in shared.items()}
        if clip_norm is not None:
            diff, norm = clip_one(diff, [name for name, _ in model.named_parameters()], clip_norm)
            if update_norm is not None:
                update_norm.append(norm)
        return copy_to_host(diff, pinned)


def compiled(model: nn.Module, mode: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model`` itself (``off``), or this worker's ``torch.compile`` of it in ``mode``, made once: it runs the
    model's own parameters and buffers, so weights copied into the model reach it."""
    if mode == "off":
        return model
    cache = getattr(_worker, "compiled", None)
    if cache is None:
        cache = _worker.compiled = {}
    key = (id(model), mode)
    if key not in cache:
        cache[key] = torch.compile(model, mode=mode, dynamic=False)
    return cache[key]


def channels_last_layout(model: nn.Module, on: bool) -> torch.memory_format | None:
    """Put ``model``'s 4-d weights in channels-last layout (``on``) or back in the default one, once per change
    (a worker's model is reused by every task); the batches' layout to match, or None for the default."""
    if getattr(model, "_edgesim_channels_last", False) != on:
        model.to(memory_format=torch.channels_last if on else torch.contiguous_format)
        model._edgesim_channels_last = on
    return torch.channels_last if on else None


def _correct(params: dict[str, torch.Tensor], rule: RuleRun) -> None:
    """The rule's correction of this step's gradients, put where the optimiser reads them."""
    with torch.no_grad():
        corrected = rule.correct({n: p.detach() for n, p in params.items()}, {n: p.grad for n, p in params.items()})
        for name, p in params.items():
            p.grad = corrected[name]


class Scores(NamedTuple):
    """A model's test figures: top-1 accuracy and the mean cross-entropy (the loss devices train on)."""

    accuracy: float
    loss: float


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 1000,
    prepare: Callable[[torch.Tensor], torch.Tensor] = normalize,
) -> Scores:
    """Accuracy and loss of ``model`` on stored inputs (``prepare``d on the fly, as in ``train_local``)."""
    model.eval()
    device = next(model.parameters()).device
    correct, loss = 0, 0.0
    for start in range(0, len(y), batch_size):
        xb = prepare(x[start : start + batch_size].to(device))
        yb = y[start : start + batch_size].to(device)
        logits = model(xb)
        correct += (logits.argmax(1) == yb).sum().item()
        loss += F.cross_entropy(logits.float(), yb, reduction="sum").item()
    return Scores(correct / max(len(y), 1), loss / max(len(y), 1))


def evaluate_accuracy(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 1000,
    prepare: Callable[[torch.Tensor], torch.Tensor] = normalize,
) -> float:
    """Top-1 accuracy of ``model`` on stored inputs (``evaluate``'s)."""
    return evaluate(model, x, y, batch_size, prepare).accuracy
