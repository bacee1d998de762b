"""What the system monitor's samples say (``evaluation.monitor`` takes them): a ``metrics.json`` summary
(``summarize``, one line of it: ``format_summary``), the figures of one stretch such as a model version's interval
(``aggregate``, flattened by ``system_fields``), a progress-bar string (``format_status``), TensorBoard scalars
(``write_tensorboard``) and warnings about an under-used GPU (``diagnose``, rules documented there).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

GB = 1024**3

DEFAULT_LOW_UTIL_THRESHOLD = 30.0  # percent GPU utilisation below which the GPU counts as under-used
DEFAULT_LOW_UTIL_WINDOW = 10  # consecutive samples that must all be under the threshold before we warn
CPU_SATURATED_PERCENT = 85.0  # mean host CPU above this over the low window: the run is CPU-bound


# -- diagnosis ---------------------------------------------------------------------------------------------------------
def diagnose(
    samples: Sequence[dict[str, Any]],
    context: dict[str, Any],
    threshold: float = DEFAULT_LOW_UTIL_THRESHOLD,
    window: int = DEFAULT_LOW_UTIL_WINDOW,
) -> list[str]:
    """Warnings when the GPU stayed under-used; empty when it was busy or there is no GPU data.

    Pass the samples taken during training. A sample is "low" when the busiest GPU's utilisation is below
    ``threshold`` percent; we warn only when at least ``window`` consecutive samples with GPU data are low, and judge
    the CPU over the longest such run. Each warning names what was measured, the likely bottleneck and the run flag
    that addresses it; only ``--compute-device cuda``, ``--engine vectorized`` and ``--num-workers N`` are ever
    suggested (no data-placement advice: the data lives on the compute device unless ``--profile conservative``
    keeps it on the CPU on purpose). Rules, checked on the
    ``context`` keys that are present (``compute_device``, ``engine``, ``num_workers``, ``cpu_cores``):

    * ``compute_device`` is ``cpu``: training runs on the CPU while a GPU idles -> ``--compute-device cuda``
      (the only warning then: the rules below assume GPU compute).
    * mean host CPU > 85%: CPU-bound, the host cannot feed the GPU -> ``--engine vectorized`` (far less CPU work per
      device) when another engine ran, else fewer workers competing for the cores (``--num-workers N``, N smaller).
    * ``engine`` is known and not ``vectorized`` (CPU not saturated): one small model per device cannot fill a GPU
      -> ``--engine vectorized``.
    * ``num_workers`` < 2 (CPU not saturated): devices are trained one at a time -> ``--num-workers N``, N >= 2.
    * none of the above: too little work in flight to fill the GPU -> more workers (``--num-workers N``).
    """
    window = max(1, window)
    run = _longest_low_run(samples, threshold)
    if len(run) < window:
        return []
    gpu_mean = sum(_max_util(s) for s in run) / len(run)
    cpus = [s["cpu_percent"] for s in run if s.get("cpu_percent") is not None]
    cpu_mean = sum(cpus) / len(cpus) if cpus else None
    cpu_text = f", host CPU {cpu_mean:.0f}%" if cpu_mean is not None else ""
    head = f"GPU utilisation stayed below {threshold:.0f}% for {len(run)} samples (mean {gpu_mean:.0f}%{cpu_text})"

    compute = str(context.get("compute_device") or "").lower()
    if compute == "cpu":
        return [f"{head}: training runs on the CPU while a GPU is idle; use --compute-device cuda."]

    engine = context.get("engine")
    vectorized = engine == "vectorized"
    num_workers = context.get("num_workers")
    cores = context.get("cpu_cores")
    warnings = []
    if cpu_mean is not None and cpu_mean > CPU_SATURATED_PERCENT:
        cores_text = f" ({cores} cores)" if cores else ""
        if not vectorized:
            fix = "use --engine vectorized, which trains a worker's devices together with far less CPU work per device"
        else:
            fewer = max(1, int(num_workers) // 2) if num_workers else 1
            fix = f"lower the number of workers competing for the cores (e.g. --num-workers {fewer})"
        warnings.append(f"{head}: CPU-bound, the host CPU{cores_text} is saturated and cannot feed the GPU; {fix}.")
        return warnings
    if engine is not None and not vectorized:
        warnings.append(
            f"{head}: the {engine} engine trains one small model per device and launches too little work to "
            "fill the GPU; use --engine vectorized."
        )
    if num_workers is not None and num_workers < 2:
        suggest = max(2, min(int(cores or 4), 8))
        warnings.append(
            f"{head}: num_workers={num_workers}, devices are trained one at a time; "
            f"raise it with --num-workers {suggest}."
        )
    if not warnings:
        more = max(2, 2 * int(num_workers)) if num_workers else 4
        warnings.append(
            f"{head}: no host-side bottleneck was measured; too little work is in flight to fill the GPU; "
            f"train more devices at once with --num-workers {more}."
        )
    return warnings


def _max_util(sample: dict[str, Any]) -> float | None:
    utils = [g["util_percent"] for g in sample.get("gpus") or () if g.get("util_percent") is not None]
    return max(utils) if utils else None


def _longest_low_run(samples: Iterable[dict[str, Any]], threshold: float) -> list[dict[str, Any]]:
    """Longest run of consecutive GPU-bearing samples whose busiest GPU is below ``threshold`` (no-GPU samples skip)."""
    best: list[dict[str, Any]] = []
    current: list[dict[str, Any]] = []
    for s in samples:
        util = _max_util(s)
        if util is None:
            continue
        if util < threshold:
            current.append(s)
            if len(current) > len(best):
                best = current
        else:
            current = []
    return best


# -- summary, status, TensorBoard --------------------------------------------------------------------------------------
def _collect(samples: Sequence[dict[str, Any]]) -> tuple[list, list, list, dict[int, dict[str, Any]]]:
    """The non-null CPU %, RAM used and RAM total values of ``samples``, and per GPU index its name and its
    utilisation, VRAM used and VRAM total values (shared by ``summarize`` and ``aggregate``)."""
    cpus = [s["cpu_percent"] for s in samples if s.get("cpu_percent") is not None]
    rams = [s["ram_used_gb"] for s in samples if s.get("ram_used_gb") is not None]
    totals = [s["ram_total_gb"] for s in samples if s.get("ram_total_gb") is not None]
    per_gpu: dict[int, dict[str, Any]] = {}
    for s in samples:
        for g in s.get("gpus") or ():
            acc = per_gpu.setdefault(g["index"], {"name": g.get("name"), "utils": [], "mems": [], "totals": []})
            for key, field in (("utils", "util_percent"), ("mems", "mem_used_gb"), ("totals", "mem_total_gb")):
                if g.get(field) is not None:
                    acc[key].append(g[field])
    return cpus, rams, totals, per_gpu


def summarize(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Summary for ``metrics.json``: mean/peak CPU, peak RAM, and per GPU mean/peak utilisation and peak VRAM.

    GPU entries are ``None`` when no sample had GPU data; ``gpu_mem_used_gb_peak`` is the highest per-GPU peak.
    """
    cpus, rams, totals, per_gpu = _collect(samples)
    gpus = [
        {
            "index": i,
            "name": acc["name"],
            "util_percent_mean": round_or_none(_mean(acc["utils"]), 1),
            "util_percent_max": max(acc["utils"]) if acc["utils"] else None,
            "mem_used_gb_peak": max(acc["mems"]) if acc["mems"] else None,
            "mem_total_gb": acc["totals"][-1] if acc["totals"] else None,
        }
        for i, acc in sorted(per_gpu.items())
    ]
    vram_peaks = [g["mem_used_gb_peak"] for g in gpus if g["mem_used_gb_peak"] is not None]
    return {
        "num_samples": len(samples),
        "duration_s": samples[-1]["t"] if samples else 0.0,
        "cpu_percent_mean": round_or_none(_mean(cpus), 1),
        "cpu_percent_max": max(cpus) if cpus else None,
        "ram_used_gb_peak": max(rams) if rams else None,
        "ram_total_gb": max(totals) if totals else None,
        "gpus": gpus or None,
        "gpu_mem_used_gb_peak": max(vram_peaks) if vram_peaks else None,
    }


def aggregate(samples: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """One sample-like dict for a stretch of samples (e.g. one model version's interval), ``None`` for no samples.

    CPU and per-GPU utilisation are means, RAM and per-GPU VRAM use are peaks; ``gpus`` is ``None`` when no sample
    had GPU data. ``format_status`` accepts the result; ``num_samples`` says how many samples it covers.
    """
    if not samples:
        return None
    cpus, rams, totals, per_gpu = _collect(samples)
    gpus = [
        {
            "index": i,
            "name": acc["name"],
            "util_percent": round_or_none(_mean(acc["utils"]), 1),
            "mem_used_gb": max(acc["mems"]) if acc["mems"] else None,
            "mem_total_gb": max(acc["totals"]) if acc["totals"] else None,
        }
        for i, acc in sorted(per_gpu.items())
    ]
    return {
        "t": samples[-1]["t"],
        "num_samples": len(samples),
        "cpu_percent": round_or_none(_mean(cpus), 1),
        "ram_used_gb": max(rams) if rams else None,
        "ram_total_gb": max(totals) if totals else None,
        "gpus": gpus or None,
    }


def system_fields(stretch: dict[str, Any] | None) -> dict[str, Any]:
    """Flat figures of an ``aggregate`` for a ``metrics.json`` record; GPU fields are ``None`` without GPU data.

    ``gpu_util_percent`` is the mean utilisation of the busiest GPU; ``vram_used_gb`` / ``vram_total_gb`` add up
    the GPUs' peak use and memory (one GPU: its own figures). All values are ``None`` for no samples.
    """
    stretch = stretch or {}
    gpus = stretch.get("gpus") or []
    utils = [g["util_percent"] for g in gpus if g.get("util_percent") is not None]
    mems = [g["mem_used_gb"] for g in gpus if g.get("mem_used_gb") is not None]
    mem_totals = [g["mem_total_gb"] for g in gpus if g.get("mem_total_gb") is not None]
    return {
        "gpu_util_percent": max(utils) if utils else None,
        "vram_used_gb": round_or_none(sum(mems), 3) if mems else None,
        "vram_total_gb": round_or_none(sum(mem_totals), 3) if mem_totals else None,
        "cpu_percent": stretch.get("cpu_percent"),
        "ram_used_gb": stretch.get("ram_used_gb"),
        "ram_total_gb": stretch.get("ram_total_gb"),
        "num_samples": stretch.get("num_samples", 0),
    }


def format_summary(summary: dict[str, Any] | None) -> str:
    """One line for a ``summarize`` result, e.g. ``GPU0 mean 62% (max 97%), VRAM peak 3.1/80.0 GB | CPU mean 45%
    (max 90%) | RAM peak 6.2/24.0 GB | 120 samples over 60 s``; GPU parts left out when unknown, ``""`` for none."""
    if not summary or not summary.get("num_samples"):
        return ""
    parts = []
    for g in summary.get("gpus") or ():
        text = f"GPU{g['index']}"
        if g.get("util_percent_mean") is not None:
            text += f" mean {g['util_percent_mean']:.0f}% (max {g['util_percent_max']:.0f}%)"
        if g.get("mem_used_gb_peak") is not None and g.get("mem_total_gb") is not None:
            text += f", VRAM peak {g['mem_used_gb_peak']:.1f}/{g['mem_total_gb']:.1f} GB"
        parts.append(text)
    if summary.get("cpu_percent_mean") is not None:
        parts.append(f"CPU mean {summary['cpu_percent_mean']:.0f}% (max {summary['cpu_percent_max']:.0f}%)")
    if summary.get("ram_used_gb_peak") is not None and summary.get("ram_total_gb") is not None:
        parts.append(f"RAM peak {summary['ram_used_gb_peak']:.1f}/{summary['ram_total_gb']:.1f} GB")
    parts.append(f"{summary['num_samples']} samples over {summary.get('duration_s') or 0:.0f} s")
    return " | ".join(parts)


def format_status(sample: dict[str, Any] | None) -> str:
    """``GPU 87% | VRAM 3.1/80.0 GB | CPU 45% | RAM 6.2/24.0 GB``; GPU parts left out when unknown.

    With several GPUs each gets ``GPU<i> 87% VRAM 3.1/80.0 GB``. ``None`` (no sample yet) gives ``""``.
    """
    if not sample:
        return ""
    parts = []
    gpus = sample.get("gpus") or []
    for g in gpus:
        gpu_parts = []
        if g.get("util_percent") is not None:
            gpu_parts.append(f"{g['util_percent']:.0f}%")
        if g.get("mem_used_gb") is not None and g.get("mem_total_gb") is not None:
            gpu_parts.append(f"VRAM {g['mem_used_gb']:.1f}/{g['mem_total_gb']:.1f} GB")
        if not gpu_parts:
            continue
        if len(gpus) == 1:  # the compact form: "GPU 87% | VRAM 3.1/80.0 GB"
            parts.extend(["GPU " + p if p.endswith("%") else p for p in gpu_parts])
        else:
            parts.append(f"GPU{g['index']} " + " ".join(gpu_parts))
    if sample.get("cpu_percent") is not None:
        parts.append(f"CPU {sample['cpu_percent']:.0f}%")
    if sample.get("ram_used_gb") is not None and sample.get("ram_total_gb") is not None:
        parts.append(f"RAM {sample['ram_used_gb']:.1f}/{sample['ram_total_gb']:.1f} GB")
    return " | ".join(parts)


def write_tensorboard(
    samples: Sequence[dict[str, Any]],
    writer: Any,
    prefix: str = "system/",
    start_walltime: float | None = None,
) -> int:
    """Write each sample as scalars on a ``SummaryWriter``-like ``writer`` (anything with ``add_scalar``).

    Tags: ``{prefix}cpu_percent``, ``{prefix}ram_used_gb``, ``{prefix}gpu{i}/util_percent``,
    ``{prefix}gpu{i}/mem_used_gb``. The step is the sample time in whole seconds since the monitor started; with
    ``start_walltime`` (``SystemMonitor.start_walltime``) the walltime is exact, so TensorBoard's "relative" axis shows
    sub-second sample times. Unknown (``None``) values are skipped. Returns the number of scalars written.
    """
    written = 0
    for s in samples:
        step = int(round(s["t"]))
        walltime = start_walltime + s["t"] if start_walltime is not None else None
        values: list[tuple[str, Any]] = [("cpu_percent", s.get("cpu_percent")), ("ram_used_gb", s.get("ram_used_gb"))]
        for g in s.get("gpus") or ():
            values.append((f"gpu{g['index']}/util_percent", g.get("util_percent")))
            values.append((f"gpu{g['index']}/mem_used_gb", g.get("mem_used_gb")))
        for tag, value in values:
            if value is None:
                continue
            writer.add_scalar(f"{prefix}{tag}", float(value), global_step=step, walltime=walltime)
            written += 1
    return written


# -- helpers -----------------------------------------------------------------------------------------------------------
def clean_gpu(g: dict[str, Any]) -> dict[str, Any]:
    return {
        "index": int(g["index"]),
        "name": g.get("name"),
        "util_percent": round_or_none(g.get("util_percent"), 1),
        "mem_used_gb": round_or_none(g.get("mem_used_gb"), 3),
        "mem_total_gb": round_or_none(g.get("mem_total_gb"), 3),
    }


def round_or_none(value: Any, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
