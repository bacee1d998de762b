"""Vectorised local training: K simulated devices trained in lock-step by one batched step per iteration.

Why: a simulated edge device trains a tiny model (Cifar10ConvNet has 62k parameters) on batches of 32, so each
per-device step is a few dozen kernel launches of microseconds each; on a GPU the per-device engine
(``processors.training.train_local``) is bound by launch and Python overhead, not by arithmetic. Here the K
devices' parameters are stacked into ``[K, ...]`` tensors and ``torch.func.vmap`` over ``functional_call`` +
``torch.func.grad`` runs one forward/backward for all K devices (convolutions become grouped convolutions,
linear layers batched matmuls); Adam / SGD state lives on the same stacked tensors and is updated with
``torch._foreach_*`` ops (``processors.stacked_optimizer``), so one iteration costs the same number of launches
whatever K is.

Equivalence with the per-device engine: every device keeps its own CPU ``torch.Generator`` and its batches come
from ``batch_schedule(len(y_i), cfg, generators[i])``, exactly as ``train_local`` would draw them, so the result
equals K separate ``train_local`` calls up to floating-point summation order.

Unequal batch sizes: ``batch_schedule`` gives a device with fewer than ``batch_size`` samples batches of
``N_i`` samples. The group's batch is ``B = max_i b_i``; shorter batches are padded with the device's own sample
0 and masked: each device's loss is ``sum(ce * mask) / b_i``, the mean over its own real samples only, so
padded samples contribute exactly zero gradient.

Unequal step counts (``--local-epochs``: a device takes ``E x ceil(n_i / batch)`` steps, tail batches kept): the
group runs for its longest device's steps; a device that has finished takes all-masked steps and its parameters,
optimiser state and statistics are restored after each of them, so it stays exactly where its own last step left
it (``processors.group_schedule``). Its last-step reports come from its own last step.

Devices of different model versions (an asynchronous run's pending devices, ``simulation.fast_simulator``) train
in one group too: ``global_params`` is then one dict per device, and each device starts from, and reports its diff
against, its own version's weights (stacked like the parameters), with its own version's ``extras``. A group whose
devices all start from the same weights takes the broadcast path, so a one-version group's bits do not depend on
how its start weights were handed over.

Devices of different local settings (several runs' devices in one group, docs/packs.md): ``lrs`` gives each
device its own local learning rate (the optimiser's step scaled by a per-device column, in SGD with or without
momentum and in Adam), ``objective_values`` its own values of the objective's batched settings (FedProx's ``mu``,
``processors.objective.DeviceObjective.batched``: per-device 0-d tensors under ``vmap``). Both None, or one value
for every device, keep the one-setting group's bits. What cannot share a step (another model, batch size, local
work, optimiser): ``processors.step_groups`` splits the devices into groups that can.

Statistic trackers (``processors.models.stat_tracker``) are trained per device: each device has its own stacked
copy of their buffers, moved by its own (padding-free) batch statistics each iteration, and reported in its diff.
Other buffers (BatchNorm running statistics) are not supported: such models raise ``NotImplementedError``; train
them with the per-device engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from common.protocol import LOSS, LOSS_SQUARED
from processors import augment as augmentation
from processors.data.sources import normalize
from processors.device_rule import RuleRun
from processors.group_schedule import freeze, plan_group, restore
from processors.models.stat_tracker import collecting, tracker_buffer_names, trackers, untracked_buffers
from processors.objective import DeviceObjective, group_objective
from processors.precision import autocast, widened
from processors.privatize import clip_group
from processors.stacked_optimizer import StackedOptimizer, learning_rates
from processors.training import TrainingConfig, batch_schedule, copy_to_host, worker_model

# Gather image batches sample-major (see train_group); False: devices-major, as before (the tests compare the bits)
SAMPLE_MAJOR = True


class NotVectorizable(NotImplementedError, ValueError):
    """A model with buffers other than statistic trackers (BatchNorm's running statistics), which the vectorised
    engine does not keep per device. The one refusal: the config check, the leaf's planner and the engine itself
    raise it, with this message."""

    def __init__(self) -> None:
        super().__init__(
            "--engine vectorized cannot keep per-device BatchNorm statistics, which this model has; use --engine "
            "per-device (or auto, which picks it): the per-device engine (processors.training.train_local) keeps them"
        )


def check_vectorizable(model: nn.Module) -> None:
    """Refuse, naming the fix, a model the vectorised engine cannot train (``NotVectorizable``)."""
    if untracked_buffers(model):
        raise NotVectorizable()


Weights = dict[str, torch.Tensor]


def shared_start(global_params: Weights | Sequence[Weights], k: int) -> Weights | None:
    """The one dict every device starts from (``global_params`` itself, or a sequence of the same dict, or of
    equal tensors); None when the devices start from different weights."""
    if isinstance(global_params, dict):
        return global_params
    if len(global_params) != k:
        raise ValueError(f"{k} devices but {len(global_params)} start weights")
    first = global_params[0]
    if all(gp is first for gp in global_params):
        return first
    return None


def train_group(
    model_name: str,
    global_params: Weights | Sequence[Weights],
    device_data: list[tuple[torch.Tensor, torch.Tensor]],
    cfg: TrainingConfig,
    generators: list[torch.Generator],
    device: torch.device,
    pinned: bool = False,
    prepare: Callable[[torch.Tensor], torch.Tensor] = normalize,
    objective: DeviceObjective | None = None,
    extras: Weights | Sequence[Weights] | None = None,
    last_step: list[dict[str, torch.Tensor]] | None = None,
    rule: RuleRun | None = None,
    clip_norms: Sequence[float] | None = None,
    update_norms: list[float] | None = None,
    lrs: Sequence[float] | None = None,
    objective_values: Sequence[Mapping[str, float]] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Train K devices from ``global_params``, all at once; return each device's diff (trained - received) as
    float32 numpy arrays, the same keys, shapes and values as ``train_local`` would return.

    ``global_params``: the weights every device starts from, or one dict per device (devices of different model
    versions); ``extras`` likewise (one dict per device goes with one start dict per device).

    ``device_data[i]`` is device i's (stored inputs N_i x ..., int64 labels N_i), on ``device`` or on the CPU (each
    iteration's batch is then gathered there and moved over); ``prepare`` turns a stored batch into the model's
    input, as in ``train_local``; ``pinned``: see ``copy_to_host``;
    ``generators[i]`` is the CPU generator ``train_local`` would get for device i (it is advanced the same way);
    ``objective`` and ``extras``: the method's device hook, as in ``train_local`` (its ``loss`` runs under ``vmap``
    on each device's parameters); ``last_step``, when given, gets one dict per device with its last step's losses,
    as ``train_local`` measures them (``processors.reports``); ``rule``: the method's training rule, as in
    ``train_local`` (its hooks run under ``vmap`` on the devices' stacked tensors, ``processors.device_rule``);
    ``clip_norms``: each device's L2 clip norm (differential privacy: its parameters' diff is clipped under
    ``vmap``, its statistics' diffs zeroed, ``processors.privatize.clip_group``), and ``update_norms``, when given,
    receives each device's norm before clipping.

    ``lrs``: each device's local learning rate (None: ``cfg.local_lr`` for all); ``objective_values``: each
    device's values of ``objective``'s batched settings, e.g. ``[{"mu": 0.01}, {"mu": 0.1}]`` (None: the
    objective's own). A device's diff then equals ``train_local`` with its own lr and objective, up to
    floating-point summation order; equal values for every device give the bits of one setting.
    """
    if len(device_data) != len(generators):
        raise ValueError(f"{len(device_data)} devices but {len(generators)} generators")
    k = len(device_data)
    if k == 0:
        return []
    learning_rates(lrs, cfg.local_lr, k)  # refused before any work
    objective, varied = group_objective(objective, objective_values, k)
    device = torch.device(device)
    model = worker_model(model_name, device)
    check_vectorizable(model)
    model.train()
    names = [name for name, _ in model.named_parameters()]
    tracked = trackers(model)
    shared = shared_start(global_params, k)
    starts = [shared] if shared is not None else list(global_params)
    for start in starts:
        for name in names:
            if start[name].device != device:
                raise ValueError(f"global parameter {name} is on {start[name].device}, engine on {device}")

    # Every device's batch positions, drawn from its own generator exactly as train_local draws them.
    sizes = [len(y) for _, y in device_data]
    if min(sizes) == 0:
        raise ValueError(f"device {sizes.index(0)} has no samples")
    schedules = [batch_schedule(n, cfg, g) for n, g in zip(sizes, generators, strict=True)]
    plan = plan_group(sizes, schedules, generators, cfg.augment)  # pads unequal batches and step counts
    iters, batch = plan.iters, plan.batch
    x_all = torch.cat([x for x, _ in device_data]) if k > 1 else device_data[0][0]
    y_all = torch.cat([y for _, y in device_data]) if k > 1 else device_data[0][1]
    data_device = x_all.device
    # An elementwise ``prepare`` (the built-in standardisation) applied once to the group's samples gives every
    # batch the same bits as applying it to each batch, in fewer passes when the steps draw more samples than the
    # devices hold (crops pad the stored images, so --augment prepares each batch).
    prepared = (
        getattr(prepare, "elementwise", False)
        and not cfg.augment
        and data_device == device
        and iters * k * batch >= len(x_all)
    )
    if prepared:
        x_all = prepare(x_all)
    offsets, flips = plan.offsets, plan.flips
    if cfg.batches_on_device and cfg.augment:  # one copy, not one a step (the index tensors move once anyway)
        offsets, flips = offsets.to(device), flips.to(device)
    index, mask, counts = plan.index.to(data_device), plan.mask.to(device), plan.counts.to(device)
    last_steps = plan.steps - 1  # each device's own last step (where its reports are measured)
    if last_step is not None:
        last_step[:] = [{} for _ in range(k)]

    def forward(
        params: Weights, x, y, m, count, received_one, extras_one, values=None
    ) -> tuple[torch.Tensor, dict, torch.Tensor]:
        with collecting(tracked, m) as collector, autocast(cfg.precision, device):
            logits = functional_call(model, params, (x,))
        per_sample = F.cross_entropy(widened(logits), y, reduction="none")  # bf16: in float32
        loss = (per_sample * m).sum() / count
        if objective is not None:  # ``values``: this device's own batched settings, when they differ
            term = objective if values is None else objective.varied(values)
            loss = loss + term.loss(params, received_one, extras_one)
        return loss, collector.stats, per_sample

    if shared is not None:  # every device starts from the same weights: broadcast them
        received_by_name = {name: shared[name].detach() for name in names}
        shared_extras = extras[0] if extras is not None and not isinstance(extras, dict) else extras
        hook = (received_by_name, shared_extras or {})  # the same for every device: not batched
        device_args: tuple = ()
        # The stacked state of K modules all loaded with the global weights (what stack_module_state would give
        # for K copies, without building K modules).
        received = list(received_by_name.values())
        params = [p.unsqueeze(0).expand(k, *p.shape).clone() for p in received]
        received_stats = {name: shared[name].detach() for name in tracker_buffer_names(tracked)}
        stats = {name: r.unsqueeze(0).expand(k, *r.shape).clone() for name, r in received_stats.items()}
        start_params = [r.unsqueeze(0) for r in received]
        start_stats = {name: r.unsqueeze(0) for name, r in received_stats.items()}
    else:  # devices of different versions: each starts from (and is held to) its own version's weights
        received_by_name = {name: torch.stack([start[name].detach() for start in starts]) for name in names}
        hook = ()
        device_args = (received_by_name, _stacked_extras(extras, k))  # batched: one slice per device
        received = list(received_by_name.values())
        params = [r.clone() for r in received]
        start_stats = {
            name: torch.stack([start[name].detach() for start in starts]) for name in tracker_buffer_names(tracked)
        }
        stats = {name: r.clone() for name, r in start_stats.items()}
        start_params = received
    if rule is not None:  # set up from each device's own state, received weights and extras
        rule.begin_group(
            received_by_name, *(hook[1:] if shared is not None else device_args[1:]), shared is not None, k
        )

    if varied is not None:  # each device's own batched settings: one more batched argument, after the others
        device_args = (*device_args, {name: c.to(device, params[0].dtype) for name, c in varied.items()})

    def hooked(per_device: tuple) -> tuple:
        """``forward``'s hook arguments: the batched ones (or the broadcast ``hook``), then the varied values."""
        if varied is None:
            return per_device or hook
        return (*(per_device[:-1] or hook), per_device[-1])

    def device_loss(params: Weights, x, y, m, count, *per_device) -> tuple[torch.Tensor, dict]:
        loss, stats, _ = forward(params, x, y, m, count, *hooked(per_device))
        return loss, stats

    def reporting_loss(params: Weights, x, y, m, count, *per_device) -> tuple[torch.Tensor, tuple]:
        """The same step, whose aux also carries what the last step reports (no extra pass)."""
        loss, stats, per_sample = forward(params, x, y, m, count, *hooked(per_device))
        return loss, (stats, loss.detach(), per_sample.detach())

    # Images are gathered sample-major (batch x K x C x H x W) and batched along dim 1: a convolution over K
    # devices' weights is one grouped convolution of a (batch, K * C, H, W) input, which that layout already is (a
    # view, where devices-first needs a copy of every step's batch); the same values, so the same bits.
    sample_major = SAMPLE_MAJOR and len(x_all.shape) == 4
    in_dims = (0, 1 if sample_major else 0, 0, 0, 0, *(0 for _ in device_args))
    group_grad = vmap(grad(device_loss, has_aux=True), in_dims=in_dims)
    reporting_grad = vmap(grad(reporting_loss, has_aux=True), in_dims=in_dims)
    order = plan.index.transpose(1, 2).contiguous().to(data_device) if sample_major else index  # x's gather
    optimizer = StackedOptimizer(cfg, params, lrs, k)
    image_shape = x_all.shape[1:]

    for t in range(iters):
        xb, yb = x_all.index_select(0, order[t].view(-1)), y_all.index_select(0, index[t].view(-1))
        if data_device != device:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        if cfg.augment:
            draws = (offsets[t].transpose(0, 1), flips[t].t()) if sample_major else (offsets[t], flips[t])
            xb = augmentation.crop_flip(xb, draws[0].reshape(-1, 2), draws[1].reshape(-1))
        xb = (xb if prepared else prepare(xb)).view(*((batch, k) if sample_major else (k, batch)), *image_shape)
        yb = yb.view(k, batch)
        step_params = dict(zip(names, params, strict=True))
        ending = (last_steps == t).nonzero().view(-1).tolist() if last_step is not None else []
        if ending:  # only a step that reports carries the extra outputs
            grads_by_name, (batch_stats, losses, per_sample) = reporting_grad(
                step_params, xb, yb, mask[t], counts[t], *device_args
            )
            _record_last_step(last_step, losses, per_sample, mask[t], counts[t], ending)
        else:
            grads_by_name, batch_stats = group_grad(step_params, xb, yb, mask[t], counts[t], *device_args)
        if rule is not None:
            grads_by_name = rule.correct_group(step_params, grads_by_name)
        grads = [grads_by_name[name] for name in names]
        with torch.no_grad():
            frozen = None
            if plan.unequal and not bool(plan.active(t).all()):  # finished devices: this step must not move them
                inactive = (~plan.active(t)).nonzero().view(-1).to(device)
                state = [*params, *optimizer.state, *stats.values()]
                frozen = (state, inactive, freeze(state, inactive))
            for name, tracker in tracked.items():
                mean, var = batch_stats[name]
                tracker.update(stats[f"{name}.running_mean"], stats[f"{name}.running_var"], mean, var)
            optimizer.step(params, grads, t)
            if frozen is not None:
                restore(*frozen)

    if rule is not None:
        rule.end_group(dict(zip(names, params, strict=True)), received_by_name, shared is not None)
    with torch.no_grad():
        stacked = {name: p - r for name, p, r in zip(names, params, start_params, strict=True)}
        stacked |= {name: s - start_stats[name] for name, s in stats.items()}
        if clip_norms is not None:
            stacked, norms = clip_group(stacked, names, clip_norms)
            if update_norms is not None:
                update_norms[:] = norms
        diffs = copy_to_host(stacked, pinned)
    return [{name: d[i].copy() for name, d in diffs.items()} for i in range(k)]


def _record_last_step(
    out: list[dict[str, torch.Tensor]],
    losses: torch.Tensor,
    per_sample: torch.Tensor,
    m: torch.Tensor,
    counts,
    ending: list[int],
) -> None:
    """The last-step reports (``processors.reports``) of the devices ``ending`` at this step: each one's loss, and
    the mean of its real samples' squared cross-entropies (padding masked out, as in its loss)."""
    with torch.no_grad():
        squared = (per_sample.detach() ** 2 * m).sum(1) / counts
    for i in ending:
        out[i] = {LOSS: losses[i], LOSS_SQUARED: squared[i]}


def _stacked_extras(extras: Weights | Sequence[Weights] | None, k: int) -> Weights:
    """The method's extras of a mixed-version group, stacked per device (each device's own version's)."""
    if not extras:
        return {}
    if isinstance(extras, dict):
        return {name: e.unsqueeze(0).expand(k, *e.shape) for name, e in extras.items()}
    if len(extras) != k:
        raise ValueError(f"{k} devices but {len(extras)} extras")
    keys = set(extras[0])
    if any(set(e) != keys for e in extras):
        raise ValueError("the devices' versions carry different extras")
    return {name: torch.stack([e[name] for e in extras]) for name in sorted(keys)}
