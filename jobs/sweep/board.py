"""``--tensorboard``: every trial's curves under one log dir, with its hyperparameters, so trials compare in
TensorBoard's HParams tab (``tensorboard --logdir DIR``).

One TensorBoard run per process of a trial (``0003``, or ``0003-seed1`` with repeats), written when the trial ends
(pruned ones too, cut where they were stopped):

* ``accuracy`` (step = version) and ``accuracy_vs_sim_ms`` (step = simulated milliseconds: TensorBoard's steps
  are whole numbers), read from the run's ``metrics.json``, and with compression or a bandwidth
  ``accuracy_vs_kb_up`` (step = kilobytes the fleet uploaded: ``jobs.tracking.series.bytes_step``), so trials
  that grid over ``compress`` compare by the bytes they sent;
* the hparams plugin's summaries (``torch.utils.tensorboard.summary.hparams``): the trial's parameters (its grid
  cell and searched values, a repeat's values) and its ``status`` (complete, pruned, fail), with the grid's and
  choices' values as discrete domains; the metrics ``sweep/objective`` (the trial's objective: with repeats, their
  mean) and ``sweep/run_objective`` (this process's own), written as scalars of the same run when it completed.
"""

from __future__ import annotations

import os

from jobs.sweep.objective import score
from jobs.sweep.spec import SweepSpec
from jobs.tracking.series import BYTES_METRIC, bytes_step

OBJECTIVE, RUN_OBJECTIVE = "sweep/objective", "sweep/run_objective"


def hparam_value(value):
    """TensorBoard's hparams take bool, int, float or str: anything else is shown as its text."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)


class Board:
    """Args:
    logdir: the log dir every trial's run goes under.
    spec: the sweep's spec (its objective, and its grid's and choices' values for the HParams tab's filters).
    """

    def __init__(self, logdir: str, spec: SweepSpec):
        self.logdir = os.path.abspath(os.path.expanduser(logdir))
        self.spec = spec
        discrete = dict(spec.grid) | dict(spec.repeat) | {p.name: list(p.values) for p in spec.search if p.values}
        self.domains = {k: [hparam_value(v) for v in values] for k, values in discrete.items()}
        self.domains["status"] = ["complete", "pruned", "fail"]

    def write_run(self, number: int, params: dict, run, state: str, value: float | None) -> str:
        """One ended process of trial ``number`` (a ``runner.Run``: its folder, repeat and records); its run's
        folder."""
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        path = os.path.join(self.logdir, getattr(run, "name", "") or os.path.basename(run.folder))
        hp = {k: hparam_value(v) for k, v in (dict(params) | dict(run.repeat)).items()} | {"status": state}
        # a domain of mixed types (1 and 0.5) is left out: TensorBoard wants each value of the hparam's own type
        domains = {k: v for k, v in self.domains.items() if k in hp and all(isinstance(d, type(hp[k])) for d in v)}
        own = score(self.spec.objective, run.records) if value is not None else None
        with SummaryWriter(log_dir=path) as writer:
            for r in run.records:
                if r.get("accuracy") is None:
                    continue
                writer.add_scalar("accuracy", r["accuracy"], r["version"])
                if r.get("sim_seconds") is not None:
                    writer.add_scalar("accuracy_vs_sim_ms", r["accuracy"], round(r["sim_seconds"] * 1000))
                if (kb := bytes_step(r)) is not None:  # compression or a bandwidth: accuracy per kB uploaded
                    writer.add_scalar(BYTES_METRIC, r["accuracy"], kb)
            exp, ssi, sei = hparams(hp, {OBJECTIVE: 0.0, RUN_OBJECTIVE: 0.0}, domains)
            for summary in (exp, ssi, sei):
                writer.file_writer.add_summary(summary)
            if value is not None:  # a pruned or failed trial has no objective: its row shows none
                writer.add_scalar(OBJECTIVE, value, 0)
                writer.add_scalar(RUN_OBJECTIVE, own if own is not None else value, 0)
        return path
