"""What a sweep shows a person, at its end and with ``python -m jobs.sweep show DIR``: a table of every trial (a
trial that ended before its budget marked ``!``, with why below it), the best configuration as the command that
reproduces it, mean +- std over seeds of each cell, and the plots in the sweep's folder (``curves.png``: accuracy
vs simulated time of every trial, one colour per method, each named by method and trial in the legend, pruned ones
dashed and cut with an x, and the budget as a vertical line; ``bands.png``: mean +- std per method, with the
budget; Optuna's ``history.png`` and ``importances.png``).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import defaultdict

import optuna
from optuna.trial import TrialState

from jobs.seeds import mean_std
from jobs.sweep.objective import accuracy_by
from jobs.sweep.spec import SweepSpec, format_value
from jobs.sweep.study import best_trial, trial_runs
from jobs.sweep.trial import read_metrics


def _cell(value, width: int) -> str:
    text = format_value(value) if value is not None else "-"
    return text[:width].ljust(width)


def trial_table(study: optuna.Study) -> str:
    trials = study.get_trials(deepcopy=False)
    names = sorted({k for t in trials for k in t.params})
    private = any(t.user_attrs.get("epsilon") is not None for t in trials)  # differential privacy: its column
    head = ["#", "status", *names, "objective", "versions", "sim s", *(["epsilon"] if private else []), "wall s"]
    widths = [4, 10, *(max(9, len(n)) for n in names), 9, 8, 8, *([8] if private else []), 7]
    rows = [" ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    for t in trials:
        a = t.user_attrs
        status = t.state.name.lower() + ("*" if a.get("requeued_from") is not None else "")
        status += "!" if early_reasons(t) else ""
        values = [
            t.number,
            status,
            *(t.params.get(n) for n in names),
            t.value,
            a.get("versions"),
            a.get("sim_seconds"),
            *([a.get("epsilon")] if private else []),
            a.get("wall_seconds"),
        ]
        rows.append(" ".join(_cell(v, w) for v, w in zip(values, widths, strict=True)))
    if any(t.user_attrs.get("requeued_from") is not None for t in trials):
        rows.append("(* queued again after an interrupted sweep)")
    early = [f"  trial {t.number}{_shown(t)}: {why}" for t in trials for why in early_reasons(t)]
    if early:
        rows += ["(! ended before its budget: its objective is its last version's, no fair comparison)", *early]
    return "\n".join(rows)


def early_reasons(trial: optuna.trial.FrozenTrial) -> list[str]:
    """Why the trial's runs ended before their budget (``jobs.sweep.objective.ended_early``): one per such run."""
    runs = trial.user_attrs.get("runs") or [trial.user_attrs]
    return [
        "".join(f"{k}={format_value(v)}: " for k, v in r.get("repeat", {}).items()) + r["ended_early"]
        for r in runs
        if r.get("ended_early")
    ]


def _shown(trial: optuna.trial.FrozenTrial) -> str:
    params = ", ".join(f"{k}={format_value(v)}" for k, v in trial.params.items())
    return f" ({params})" if params else ""


def seed_groups(study: optuna.Study) -> dict[tuple, list[float]]:
    """Completed trials' values grouped by every parameter but the seed: a grid's cells, over their seeds."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        key = tuple(sorted((k, v) for k, v in t.params.items() if k != "seed"))
        groups[key].append(t.value)
    return dict(groups)


def cell_summary(study: optuna.Study) -> str:
    lines = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        values = t.user_attrs.get("values") or []
        if len(values) >= 2:  # a candidate with repeats: its value is their mean
            name = ", ".join(f"{k}={format_value(v)}" for k, v in t.params.items()) or "(all)"
            repeats = ", ".join(sorted({k for r in trial_runs(t) for k in r.get("repeat", {})}))
            lines.append(f"  trial {t.number} ({name}): {mean_std(values)} over {len(values)} runs ({repeats})")
    for key, values in sorted(seed_groups(study).items(), key=lambda kv: str(kv[0])):
        if len(values) < 2:
            continue
        name = ", ".join(f"{k}={format_value(v)}" for k, v in key) or "(all)"
        lines.append(f"  {name}: {mean_std(values)} over {len(values)} seeds")
    return "\n".join(["mean +- std per cell:", *lines]) if lines else ""


def format_report(study: optuna.Study, folder: str, objective: str) -> str:
    parts = [
        f"study {study.study_name} in {folder} (objective: {objective}, {study.direction.name.lower()})",
        trial_table(study),
    ]
    cells = cell_summary(study)
    if cells:
        parts.append(cells)
    best = best_trial(study)
    if best is not None:
        commands = [r.get("command") for r in trial_runs(best)]
        what = "it alone with" if len(commands) == 1 else f"its {len(commands)} runs (their mean) with"
        early = " (! it ended before its budget, see above)" if early_reasons(best) else ""
        parts.append(f"best: trial {best.number}, {objective} {format_value(best.value)}{early}; reproduce {what}:")
        parts += [f"  {c}" for c in commands]
    else:
        parts.append("best: no trial completed")
    return "\n".join(parts)


def trial_curves(study: optuna.Study, folder: str) -> list[tuple[optuna.trial.FrozenTrial, list[dict], str]]:
    """Every ended trial's curves: one per process (a candidate with repeats has one per repeat), each with the
    method its job ran (its ``metrics.json``'s config)."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        for run in trial_runs(t):
            metrics = read_metrics(os.path.join(folder, run.get("folder", "")))
            records = metrics.get("versions", [])
            if records:
                method = str((metrics.get("config") or {}).get("method", t.params.get("method", "")))
                out.append((t, [r for r in records if r.get("sim_seconds") is not None], method))
    return out


def plot_budget(spec: SweepSpec | None) -> float | None:
    """The budget the plots draw: the objective's, else the base flags' ``max-sim-time`` (None: neither)."""
    if spec is None:
        return None
    if spec.objective.metric == "accuracy_at":
        return spec.objective.budget
    limit = spec.base.get("max-sim-time")
    return float(limit) if isinstance(limit, (int, float)) and not isinstance(limit, bool) else None


def write_plots(study: optuna.Study, folder: str, spec: SweepSpec | None = None) -> list[str]:
    """The sweep's plots (their paths); Optuna's need at least one completed trial. ``spec``: the sweep's, for the
    budget line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    curves = trial_curves(study, folder)
    budget = plot_budget(spec)
    if curves:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        colours = _colours([(t.number, method) for t, _, method in curves], plt)
        for t, records, method in curves:
            xs, ys = [r["sim_seconds"] for r in records], [r["accuracy"] for r in records]
            pruned = t.state == TrialState.PRUNED
            label = f"{method} #{t.number}" + (" pruned" if pruned else " ended early" if early_reasons(t) else "")
            style = {"linestyle": "--" if pruned else "-", "alpha": 0.6 if pruned else 0.9}
            ax.plot(xs, ys, color=colours[(t.number, method)], label=label, **style)
            if pruned and xs:
                ax.plot(xs[-1], ys[-1], "kx")  # where the pruner cut it
        if budget is not None:
            ax.axvline(budget, color="k", linestyle=":", label=f"budget {budget:g} s")
        ax.set_xlabel("simulated seconds")
        ax.set_ylabel("accuracy")
        ax.set_title("every trial (dashed, x: pruned)")
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5), ncol=1 + len(curves) // 25)
        fig.tight_layout()
        written.append(_save(fig, folder, "curves.png"))
        written += _bands(curves, folder, plt, budget)
    with warnings.catch_warnings():  # Optuna's matplotlib plots are marked experimental; importances may be even
        warnings.simplefilter("ignore")
        written += _optuna_plots(study, folder)
    plt.close("all")
    return written


def _optuna_plots(study: optuna.Study, folder: str) -> list[str]:
    """Optuna's optimisation history and parameter importances (they need completed trials)."""
    written = []
    if study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        from optuna.visualization import matplotlib as ov

        written.append(_save(ov.plot_optimization_history(study).figure, folder, "history.png"))
        if len({k for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) for k in t.params}) and (
            len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) > 1
        ):
            try:
                written.append(_save(ov.plot_param_importances(study).figure, folder, "importances.png"))
            except (ValueError, RuntimeError):  # one value per parameter: no importance to compute
                pass
    return written


def _colours(trials: list[tuple[int, str]], plt) -> dict[tuple[int, str], tuple]:
    """A colour per (trial, method): one hue per method, a shade per trial of it."""
    hues = ("Blues", "Oranges", "Greens", "Reds", "Purples", "Greys", "YlOrBr", "BuGn")
    methods = sorted({m for _, m in trials})
    out = {}
    for i, method in enumerate(methods):
        mine = sorted({t for t, m in trials if m == method})
        cmap = plt.get_cmap(hues[i % len(hues)])
        for j, number in enumerate(mine):
            out[(number, method)] = cmap(0.9 - 0.45 * j / max(1, len(mine) - 1))
    return out


def _bands(curves, folder: str, plt, budget: float | None) -> list[str]:
    """Mean +- std of completed trials per method, on a common grid of simulated time (each curve held flat
    between its versions), and the budget."""
    import numpy as np

    by_method: dict[str, list[list[dict]]] = defaultdict(list)
    for t, records, method in curves:
        if t.state == TrialState.COMPLETE and records:
            by_method[method].append(records)
    if not by_method:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, runs in sorted(by_method.items()):
        end = min(r[-1]["sim_seconds"] for r in runs)
        grid = np.linspace(0.0, end, 50)
        ys = np.array([[_held(r, g) for g in grid] for r in runs])
        mean, std = ys.mean(axis=0), ys.std(axis=0)
        ax.plot(grid, mean, label=f"{method} ({len(runs)})")
        ax.fill_between(grid, mean - std, mean + std, alpha=0.2)
    if budget is not None:
        ax.axvline(budget, color="k", linestyle=":", label=f"budget {budget:g} s")
    ax.set_xlabel("simulated seconds")
    ax.set_ylabel("accuracy (newest version)")
    ax.legend()
    fig.tight_layout()
    return [_save(fig, folder, "bands.png")]


def _held(records: list[dict], seconds: float) -> float:
    accuracy = accuracy_by(records, seconds)
    return records[0]["accuracy"] if accuracy is None else accuracy


def _save(fig, folder: str, name: str) -> str:
    path = os.path.join(folder, name)
    fig.savefig(path, dpi=100)
    return path


def say(line: str) -> None:
    """A line above the bar (tqdm keeps the bar below it), or a plain line without one."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)


def make_bar(total: int, enabled: bool):
    """The bar over the trials, on a terminal only: in a log, its redraws would be noise (each trial's end is a
    line of its own anyway)."""
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: trials are forked from this process (see jobs.sweep.trial)
    return tqdm(
        total=total,
        desc="[sweep] trials",
        unit="trial",
        disable=not enabled or not sys.stderr.isatty(),
        file=sys.stderr,
        dynamic_ncols=True,
    )


def objective_words(spec: SweepSpec) -> str:
    o = spec.objective
    if o.metric == "accuracy_at":
        return f"accuracy at {o.budget:g} simulated s"
    if o.metric == "time_to_target":
        return f"simulated s to accuracy {o.target:g}"
    return "final accuracy"
