"""Per-device vs. vectorised local training: samples/second for groups of K simulated devices.

Each device: ``--model`` (Cifar10ConvNet by default; ``resnet18``, the FedRevive paper's), ``--iters`` iterations (``--optimizer``, Adam by default) of batch ``--batch-size`` on ``--samples`` synthetic
images. The per-device engine is a loop of ``train_local`` reusing one model; the vectorised engine is one
``train_group`` call for all K devices. Both get identically seeded generators, so they train the same batches;
the maximum |difference| of their diffs is printed as a sanity check.

    .venv/bin/python benchmarks/perf/bench_engine.py --device auto --ks 1,8,32,100 --iters 25

The line ``speedup: <X>x`` is vectorised over per-device for the largest K; ``trackers: <X>x`` is the vectorised
engine's time with the model's statistic trackers over its time with them replaced by identities (what recording
the devices' data statistics costs; models whose trackers are top-level modules only); the last line,
``augment: <X>x``, is its time with local augmentation (``--augment``: crop and flip) over its time without;
``dp: <X>x`` and ``local dp: <X>x`` its time with DP's clipping (``processors.privatize``), and with local noise
too (the median of each round's ratio, the sides' order rotating), after a line giving DP's own operations alone;
``compress: <X>x`` its step followed by ``--compress-with``'s compressor (``topk:0.01`` with error feedback by
default: ``processors.compress.CompressionHost.apply``, as the task processor runs it after the engine) over its
step alone (the median of each round's ratio; issue 60's goal: at most 1.15x), printed with every model.
All ratios are measured alternately in the same run.

    .venv/bin/python benchmarks/perf/bench_engine.py --model resnet18 --ks 1,4 --iters 2 --batch-size 8 --samples 32

``--precision fp32|tf32|bf16`` trains both engines at that precision (``processors.precision``; the floor printed
by ``benchmarks/repro/paper_seed.py`` too); ``--no-extras`` leaves out the tracker and augmentation ratios. The device-step
levers, each off by default until a GPU measures it (``TrainingConfig``): ``--channels-last`` and ``--compile
MODE`` (the per-device engine), ``--batches-on-device`` (both).

``--model char_lstm`` (LEAF's Shakespeare LSTM) trains on generated text (``processors.data.text``: windows of
``--window`` characters, LEAF's 80 by default) instead of images; the tracker and augmentation ratios are skipped
(it has neither).

    .venv/bin/python benchmarks/perf/bench_engine.py --device cpu --model char_lstm --ks 1,4 --iters 3 --batch-size 10

``--unequal``: what unequal devices cost the vectorised engine. K devices (the largest of ``--ks``) hold sample
counts drawn from a long-tailed (log-normal, sigma ``--unequal-sigma``) distribution of mean ``--samples`` and train
``--epochs`` epochs over their own data (``--local-epochs``; tail batches kept), so their step counts differ and the
group runs masked until its largest device is done (``processors.group_schedule``). It prints samples/second of
the per-device engine and of the vectorised engine on those devices, and of the vectorised engine on K equal
devices holding the mean count (the same work), then ``unequal: <X>x``, the equal group's rate over the unequal
one's (what unequal sizes cost), and the share of the unequal group's lanes (steps x K x batch) that hold a real
sample. Alternated, best of ``--repeats`` (at least 3).

    .venv/bin/python benchmarks/perf/bench_engine.py --unequal --ks 32 --samples 120 --epochs 1

``--floor-batches 10,32``: the vectorised engine against the serial floor of ``benchmarks/peers/bench_peers.py`` (plain
PyTorch, no framework: each device's data standardised once beforehand, then per device ``load_state_dict``, a
fresh optimiser and its steps one after another), the largest K devices trained on the same batches
(``batch_schedule``) at each of these batch sizes, alternated, best of ``--repeats`` (at least 3). One line per
batch size, ``floor batch <b>: ... grouped <X>x the floor``. Issue 34's work (25 devices a process, one thread,
5 SGD steps at lr 0.1, 50 samples):

    .venv/bin/python benchmarks/perf/bench_engine.py --device cpu --threads 1 --ks 1,25 --iters 5 --samples 50 \
        --optimizer sgd --lr 0.1 --batch-size 10 --floor-batches 10,32 --repeats 7 --cpu-time

Over 400 lines: the engine's every side cost (trackers, augmentation, differential privacy, unequal devices, the
serial floor) is measured by this one command, alternating with the plain engine in the same run, so each ratio
the docs and the GPU lease quote comes from one run.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.dp_noise import GaussianNoise  # noqa: E402
from processors.data.sources import Dataset, make_synthetic, normalize  # noqa: E402
from processors.data.text import VOCAB_SIZE, WINDOW, make_synthetic_text  # noqa: E402
from processors.device import full_float32, resolve_device  # noqa: E402
from processors.models import build_model  # noqa: E402
from processors.models.stat_tracker import trackers  # noqa: E402
from processors.precision import use_precision  # noqa: E402
from processors.privatize import clip_group, local_noise  # noqa: E402

SECURE_NOISE = GaussianNoise("secure")  # the default source of a DP run
from processors.training import TrainingConfig, batch_schedule, train_local, worker_model  # noqa: E402
from processors.training_vectorized import train_group  # noqa: E402

MODEL = "cifar10_convnet"
# Dense FP32 (non-tensor-core) peak, TFLOP/s, matched against the CUDA device name.
FP32_PEAK_TFLOPS = {"H200": 67.0, "H100": 67.0, "A100": 19.5, "L40S": 91.6, "A10": 31.2, "L4": 30.3, "V100": 15.7}


def flops_per_sample(device: torch.device, batch: int, window: int = WINDOW) -> float:
    """Forward + backward FLOPs of one training sample, counted by torch.utils.flop_counter (the LSTM's fused
    kernel, which it does not count, as the planner counts it)."""
    from torch.utils.flop_counter import FlopCounterMode

    if MODEL == "char_lstm":
        from simulation.planner import training_mflops

        return training_mflops(build_model(MODEL), (window,)) * 1e6
    model = build_model(MODEL).to(device)
    x = normalize(torch.zeros(batch, 3, 32, 32, dtype=torch.uint8, device=device))
    y = torch.zeros(batch, dtype=torch.int64, device=device)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / batch


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, tflops in FP32_PEAK_TFLOPS.items():
        if key in name:
            return tflops * 1e12
    return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_data(ds, devices: int, samples: int, seed: int, device: torch.device) -> list[tuple]:
    """Each device's (inputs, labels): ``samples`` drawn without replacement from ``ds``'s training set, the
    draws seeded by ``seed``; the one way every engine benchmark gives its devices data."""
    picker = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(devices):
        idx = torch.randperm(len(ds.y_train), generator=picker)[:samples].to(device)
        data.append((ds.x_train.index_select(0, idx), ds.y_train.index_select(0, idx)))
    return data


PREPARE = normalize  # the stored batch -> the model's input (token ids pass unchanged)


def run_per_device(global_params, data, cfg, device):
    model = worker_model(MODEL, device)
    gens = [torch.Generator().manual_seed(i) for i in range(len(data))]
    return [
        train_local(model, global_params, x, y, cfg, g, prepare=PREPARE) for (x, y), g in zip(data, gens, strict=True)
    ]


def run_vectorized(global_params, data, cfg, device):
    gens = [torch.Generator().manual_seed(i) for i in range(len(data))]
    return train_group(MODEL, global_params, data, cfg, gens, device, prepare=PREPARE)


CLOCK = time.perf_counter  # --cpu-time: time.process_time


def timed(fn, device, *args):
    sync(device)
    start = CLOCK()
    out = fn(*args, device)
    sync(device)
    return CLOCK() - start, out


def best_of(repeats: int, fn, device, *args):
    runs = [timed(fn, device, *args) for _ in range(max(repeats, 1))]
    return min(t for t, _ in runs), runs[-1][1]


def main() -> None:
    global MODEL, PREPARE, CLOCK
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--model", default=MODEL, choices=["cifar10_convnet", "resnet18", "char_lstm"])
    parser.add_argument("--window", type=int, default=WINDOW, help="char_lstm: characters per sample")
    parser.add_argument("--ks", default="1,8,32,100", help="comma-separated group sizes")
    parser.add_argument("--iters", type=int, default=25, help="local iterations per device")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    parser.add_argument("--lr", type=float, default=None, help="local learning rate (default: TrainingConfig's)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--cpu-time", action="store_true", help="time by this process's CPU time (a shared machine)")
    parser.add_argument("--floor-batches", default="", help="compare with the serial floor at these batch sizes")
    parser.add_argument("--samples", type=int, default=350, help="samples per device")
    parser.add_argument("--repeats", type=int, default=1, help="time each engine this many times, keep the best")
    parser.add_argument("--unequal", action="store_true", help="measure unequal devices instead (see above)")
    parser.add_argument("--unequal-sigma", type=float, default=1.0, help="log-normal sigma of the sample counts")
    parser.add_argument("--epochs", type=int, default=1, help="local epochs with --unequal")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"], help="both engines'")
    parser.add_argument("--no-extras", action="store_true", help="leave out the tracker and augmentation ratios")
    parser.add_argument("--channels-last", action="store_true", help="the per-device engine in channels-last layout")
    parser.add_argument("--compile", default="off", choices=["off", "default", "reduce-overhead"])
    parser.add_argument("--batches-on-device", action="store_true", help="each task's batches copied over once")
    parser.add_argument("--compress-with", default="topk:0.01", help="the compress: line's compressor (with EF)")
    args = parser.parse_args()
    MODEL = args.model
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpu_time:
        CLOCK = time.process_time
    if args.unequal:
        unequal_cost(args)
        return

    device = resolve_device(args.device)
    use_precision(args.precision, device)  # the TF32 switches, as the task processor sets them
    ks = [int(k) for k in args.ks.split(",") if k.strip()]
    lr = {} if args.lr is None else {"local_lr": args.lr}
    cfg = TrainingConfig(
        model=MODEL,
        local_iters=args.iters,
        local_batch_size=args.batch_size,
        optimizer=args.optimizer,
        precision=args.precision,
        channels_last=args.channels_last,
        compile=args.compile,
        batches_on_device=args.batches_on_device,
        **lr,
    )

    pool = min(max(ks) * args.samples, 20000)
    text = MODEL == "char_lstm"
    if text:
        ds = Dataset(*make_synthetic_text(max(pool, 100), 100, 0, args.window), VOCAB_SIZE, None, None).to(device)
        PREPARE = ds.prepare
    else:
        ds = make_synthetic(max(pool, 100), 100, seed=0).to(device)
    data_all = device_data(ds, max(ks), args.samples, seed=1234, device=device)
    torch.manual_seed(0)
    global_params = {n: p.detach().to(device) for n, p in build_model(MODEL).state_dict().items()}

    fps = flops_per_sample(device, args.batch_size, args.window)
    peak = peak_flops(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    shown = f"{MODEL} ({args.window}-character windows)" if text else MODEL
    print(
        f"device {name}, {torch.get_num_threads()} thread(s); {shown}; {args.optimizer} lr {cfg.local_lr} "
        f"{args.iters} iters x batch {args.batch_size}; {args.samples} samples/device; "
        f"precision {args.precision}; channels-last {args.channels_last}; compile {args.compile}; "
        f"batches on device {args.batches_on_device}; clock: {'CPU time' if args.cpu_time else 'wall'}"
    )
    print(
        f"train FLOPs/sample (fwd+bwd) {fps / 1e6:.2f} MFLOP; FP32 peak {f'{peak / 1e12:.1f} TFLOP/s' if peak else 'n/a'}"
    )

    # warm-up: lazy imports, allocator, cuDNN algorithm choice, vmap caches
    for _ in range(2):
        run_per_device(global_params, data_all[:2], cfg, device)
        run_vectorized(global_params, data_all[:2], cfg, device)

    def pct(rate: float) -> str:
        return f"{100 * rate * fps / peak:.2f}%" if peak else "n/a"

    print(
        f"{'K':>5} {'per-device s/s':>15} {'vectorised s/s':>15} {'ratio':>7} {'peak% per-dev':>14} {'peak% vec':>10} {'max|diff|':>10}"
    )
    speedup = float("nan")
    for k in ks:
        data = data_all[:k]
        samples = k * args.iters * min(args.batch_size, args.samples)
        t_dev, out_dev = best_of(args.repeats, run_per_device, device, global_params, data, cfg)
        t_vec, out_vec = best_of(args.repeats, run_vectorized, device, global_params, data, cfg)
        err = max(float(np.abs(a[n] - b[n]).max()) for a, b in zip(out_dev, out_vec, strict=True) for n in a)
        rate_dev, rate_vec = samples / t_dev, samples / t_vec
        speedup = rate_vec / rate_dev
        print(
            f"{k:>5} {rate_dev:>15.0f} {rate_vec:>15.0f} {speedup:>6.2f}x {pct(rate_dev):>14} {pct(rate_vec):>10} {err:>10.2e}"
        )
    print(f"speedup: {speedup:.2f}x")
    for b in [int(v) for v in args.floor_batches.split(",") if v.strip()]:
        floor_cfg = TrainingConfig(**(cfg.to_dict() | {"local_batch_size": b}))
        floor_line(global_params, data_all[: max(ks)], floor_cfg, args.repeats)
    comp = compress_cost(global_params, data_all[: max(ks)], cfg, device, args.repeats, args.compress_with)
    print(
        f"vectorised K={max(ks)}: {comp['plain']:.3f} s, {comp['compressed']:.3f} s then {args.compress_with} with "
        f"error feedback (best of each); the compressor alone {1e3 * comp['ops']:.1f} ms "
        f"({comp['ops'] / comp['plain']:.2%} of the step)"
    )
    print(f"compress: {comp['ratio']:.3f}x")
    if text or args.no_extras:  # no statistic trackers, no image augmentation (or not asked for)
        return
    if all("." not in name for name in trackers(worker_model(MODEL, device))):
        with_trackers, without = tracker_cost(global_params, data_all[: max(ks)], cfg, device, args.repeats)
        print(f"vectorised K={max(ks)}: {with_trackers:.3f} s with statistic trackers, {without:.3f} s without")
        print(f"trackers: {with_trackers / without:.3f}x")
    augmented, plain = augment_cost(global_params, data_all[: max(ks)], cfg, device, args.repeats)
    print(f"vectorised K={max(ks)}: {augmented:.3f} s with crop-and-flip augmentation, {plain:.3f} s without")
    print(f"augment: {augmented / plain:.3f}x")
    cost = dp_cost(global_params, data_all[: max(ks)], cfg, device, args.repeats)
    print(
        f"vectorised K={max(ks)}: {cost['plain']:.3f} s, {cost['central']:.3f} s clipped (DP), "
        f"{cost['local']:.3f} s clipped and noised (best of each)"
    )
    print(
        f"DP's own work for these {max(ks)} devices: clipping {1e3 * cost['clip_ops']:.1f} ms, local noise "
        f"{1e3 * cost['noise_ops']:.1f} ms, against {cost['plain']:.3f} s of training "
        f"({(cost['clip_ops'] + cost['noise_ops']) / cost['plain']:.2%})"
    )
    print(f"dp: {cost['central_ratio']:.3f}x\nlocal dp: {cost['local_ratio']:.3f}x")


def dp_cost(global_params, data, cfg, device, repeats: int) -> dict[str, float]:
    """The vectorised engine with DP's clipping, with clipping and local noise, and without: each side's best
    time, and each DP side's median ratio over the plain run of the same round (``central_ratio``,
    ``local_ratio``). The sides' order rotates every round, so that a machine whose speed drifts within a round
    (this project's shared VMs) does not favour the side that runs first. ``clip_ops`` and ``noise_ops``: the
    best time of DP's own operations alone on the same devices' diffs (``processors.privatize``), which bound what
    DP can cost whatever the noise."""
    names = [n for n, _ in worker_model(MODEL, device).named_parameters()]

    def clipped(params, d, c, dev, noised=False):
        gens = [torch.Generator().manual_seed(i) for i in range(len(d))]
        diffs = train_group(MODEL, params, d, c, gens, dev, prepare=PREPARE, clip_norms=[1.0] * len(d))
        return [local_noise(x, names, 1.0, SECURE_NOISE, f"d{i}", 2) for i, x in enumerate(diffs)] if noised else diffs

    runs = {"central": clipped, "local": functools.partial(clipped, noised=True), "plain": run_vectorized}
    order = list(runs)
    times: dict[str, list[float]] = {k: [] for k in runs}
    diffs = None
    for r in range(max(repeats, 3)):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            seconds, out = timed(runs[name], device, global_params, data, cfg)
            times[name].append(seconds)
            diffs = out if name == "plain" else diffs
    stacked = {n: torch.stack([torch.as_tensor(d[n]) for d in diffs]).to(device) for n in diffs[0]}
    norms = [1.0] * len(diffs)
    clip_ops = min(timed(lambda dev: clip_group(stacked, names, norms), device)[0] for _ in range(5))
    noise_ops = min(
        timed(lambda dev: [local_noise(x, names, 1.0, SECURE_NOISE, f"d{i}", 2) for i, x in enumerate(diffs)], device)[
            0
        ]
        for _ in range(5)
    )

    def ratio(side: str) -> float:
        return statistics.median(a / b for a, b in zip(times[side], times["plain"], strict=True))

    best = {side: min(t) for side, t in times.items()}
    return best | {
        "central_ratio": ratio("central"),
        "local_ratio": ratio("local"),
        "clip_ops": clip_ops,
        "noise_ops": noise_ops,
    }


def compress_cost(global_params, data, cfg, device, repeats: int, compress: str) -> dict[str, float]:
    """The vectorised engine's step followed by ``compress`` with error feedback, as the task processor runs it
    (``CompressionHost.apply`` on the diffs the engine returns, the residuals kept in a ``DeviceStateStore`` and
    added back the next round), against the step alone: each side's best time, the median of each round's ratio
    (``ratio``; the sides' order alternates, as in ``dp_cost``) and the best time of the compressor alone on the
    step's diffs (``ops``)."""
    import tempfile

    from processors.compress import CompressionHost

    folder = tempfile.mkdtemp(prefix="bench_engine_ef_")
    settings = {"compress": compress, "error_feedback": True, "state": {"dir": folder}}
    host = CompressionHost(settings, seed=0)
    ids = [f"d{i}" for i in range(len(data))]
    version = iter(range(10**9))

    def apply(diffs):
        v = next(version)
        return host.apply(diffs, ids, [v] * len(diffs), [None] * len(diffs))

    def compressed(params, d, c, dev):
        return apply(run_vectorized(params, d, c, dev))

    runs = {"compressed": compressed, "plain": run_vectorized}
    times: dict[str, list[float]] = {k: [] for k in runs}
    diffs = None
    for r in range(max(repeats, 3)):
        for name in list(runs)[r % 2 :] + list(runs)[: r % 2]:
            seconds, out = timed(runs[name], device, global_params, data, cfg)
            times[name].append(seconds)
            diffs = out if name == "plain" else diffs
    ops = min(timed(lambda dev: apply(diffs), device)[0] for _ in range(5))
    ratio = statistics.median(a / b for a, b in zip(times["compressed"], times["plain"], strict=True))
    return {side: min(t) for side, t in times.items()} | {"ratio": ratio, "ops": ops}


def run_floor(global_params, data, cfg, device, prepared=None):
    """``bench_peers.py``'s serial floor on the engines' batches: each device's data standardised beforehand
    (``prepared``, made untimed), then ``load_state_dict``, a fresh optimiser and its steps, one device after
    another; the diffs as the engines return them."""
    net = FLOOR_NET.setdefault(device, build_model(MODEL).to(device))
    out = []
    for i, (x, y) in enumerate(prepared):
        net.load_state_dict(global_params)
        opt = cfg.make_optimizer(net.parameters())
        net.train()
        for positions in batch_schedule(len(y), cfg, torch.Generator().manual_seed(i)):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x[positions]), y[positions]).backward()
            opt.step()
        out.append({k: (v - global_params[k]).cpu().numpy() for k, v in net.state_dict().items()})
    return out


FLOOR_NET: dict = {}


def floor_line(global_params, data, cfg, repeats: int = 7) -> None:
    """Grouped (one ``train_group`` of all the devices) against the serial floor and the per-device engine at
    ``cfg``'s batch size: best of alternated runs, one line."""
    device = data[0][0].device
    prepared = [(PREPARE(x), y) for x, y in data]  # the floor's data, standardised once (untimed)
    times: dict[str, list[float]] = {"grouped": [], "floor": [], "per-device": []}
    outs = {}
    for _ in range(2):  # warm-up at this batch size
        run_vectorized(global_params, data[:2], cfg, device)
        run_floor(global_params, data[:2], cfg, device, prepared[:2])
    for _ in range(max(repeats, 3)):
        t, outs["grouped"] = timed(run_vectorized, device, global_params, data, cfg)
        times["grouped"].append(t)
        t, outs["floor"] = timed(lambda *a: run_floor(*a, prepared), device, global_params, data, cfg)
        times["floor"].append(t)
        times["per-device"].append(timed(run_per_device, device, global_params, data, cfg)[0])
    best = {k: min(v) for k, v in times.items()}
    err = max(float(np.abs(a[n] - b[n]).max()) for a, b in zip(outs["floor"], outs["grouped"], strict=True) for n in a)
    print(
        f"floor batch {cfg.local_batch_size}: K={len(data)}, grouped {best['grouped']:.4f} s, serial floor "
        f"{best['floor']:.4f} s, per-device engine {best['per-device']:.4f} s, max|diff| {err:.1e}: "
        f"grouped {best['floor'] / best['grouped']:.2f}x the floor"
    )


def long_tailed_sizes(k: int, mean: int, sigma: float, seed: int = 0) -> list[int]:
    """K sample counts from a log-normal of the given mean (at least 2 each): a few large devices, many small."""
    rng = np.random.default_rng(seed)
    draws = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size=k)
    return [max(2, int(round(v))) for v in draws]


def unequal_cost(args) -> None:
    """The ``--unequal`` measurement (module docstring)."""
    device = resolve_device(args.device)
    full_float32()
    k = max(int(v) for v in args.ks.split(",") if v.strip())
    sizes = long_tailed_sizes(k, args.samples, args.unequal_sigma)
    mean = max(2, round(sum(sizes) / k))
    cfg = TrainingConfig(model=MODEL, local_epochs=args.epochs, local_batch_size=args.batch_size)
    ds = make_synthetic(max(sum(sizes), k * mean, 100), 100, seed=0).to(device)

    def slices(counts):
        out, start = [], 0
        for n in counts:
            out.append((ds.x_train[start : start + n], ds.y_train[start : start + n]))
            start += n
        return out

    unequal, equal = slices(sizes), slices([mean] * k)
    torch.manual_seed(0)
    global_params = {n: p.detach().to(device) for n, p in build_model(MODEL).state_dict().items()}
    steps = [cfg.steps(n) for n in sizes]
    lanes = max(steps) * k * min(args.batch_size, max(sizes))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"device {name}; {MODEL}; K={k}; {args.epochs} epoch(s), batch {args.batch_size}; samples per device: "
        f"min {min(sizes)}, median {int(np.median(sizes))}, mean {sum(sizes) / k:.0f}, max {max(sizes)}; "
        f"steps: min {min(steps)}, max {max(steps)}"
    )
    for _ in range(2):  # warm-up
        run_vectorized(global_params, unequal[:2], cfg, device)
        run_per_device(global_params, unequal[:2], cfg, device)
    times: dict[str, list[float]] = {"per-device": [], "vectorised": [], "equal": []}
    out = {}
    for _ in range(max(args.repeats, 3)):
        times["per-device"].append(timed(run_per_device, device, global_params, unequal, cfg)[0])
        t, out["vec"] = timed(run_vectorized, device, global_params, unequal, cfg)
        times["vectorised"].append(t)
        times["equal"].append(timed(run_vectorized, device, global_params, equal, cfg)[0])
    out_dev = run_per_device(global_params, unequal, cfg, device)
    err = max(float(np.abs(a[n] - b[n]).max()) for a, b in zip(out_dev, out["vec"], strict=True) for n in a)
    work_unequal, work_equal = sum(cfg.work(n) for n in sizes), k * cfg.work(mean)
    rates = {
        "per-device": work_unequal / min(times["per-device"]),
        "vectorised": work_unequal / min(times["vectorised"]),
        "equal": work_equal / min(times["equal"]),
    }
    print(f"{'engine':>28} {'samples/s':>10}")
    print(f"{'per-device, unequal':>28} {rates['per-device']:>10.0f}")
    print(f"{'vectorised, unequal (masked)':>28} {rates['vectorised']:>10.0f}")
    print(f"{'vectorised, equal (mean)':>28} {rates['equal']:>10.0f}")
    print(f"max|diff| per-device vs vectorised (unequal): {err:.2e}")
    print(f"real samples in the unequal group's lanes: {100 * work_unequal / lanes:.1f}%")
    print(f"vectorised over per-device, unequal: {rates['vectorised'] / rates['per-device']:.2f}x")
    print(f"unequal: {rates['equal'] / rates['vectorised']:.2f}x")


def augment_cost(global_params, data, cfg, device, repeats: int) -> tuple[float, float]:
    """Best-of times of the vectorised engine with and without local augmentation, alternating."""
    configs = {True: TrainingConfig(**(cfg.to_dict() | {"augment": True})), False: cfg}
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(max(repeats, 3)):
        for augment, c in configs.items():
            times[augment].append(timed(run_vectorized, device, global_params, data, c)[0])
    return min(times[True]), min(times[False])


def tracker_cost(global_params, data, cfg, device, repeats: int) -> tuple[float, float]:
    """Best-of times of the vectorised engine with the model's trackers and with them swapped for identities,
    alternating so that machine noise hits both alike."""
    model = worker_model(MODEL, device)
    tracked = trackers(model)  # top-level modules in the convnet, so setattr by name swaps them
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for _ in range(max(repeats, 3)):
            for keep in (True, False):
                for name, module in tracked.items():
                    setattr(model, name, module if keep else torch.nn.Identity())
                times[keep].append(timed(run_vectorized, device, global_params, data, cfg)[0])
    finally:
        for name, module in tracked.items():
            setattr(model, name, module)
    return min(times[True]), min(times[False])


if __name__ == "__main__":
    main()
