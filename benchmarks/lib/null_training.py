"""A job whose devices return a fixed diff at once, everything else real (NVFlare's processes and wire, the
schedule, the applier, the strategy): the protocol's ceiling, for ``bench_protocol.py --null-training``.

    python benchmarks/lib/null_training.py fedavg    FLAGS   # as jobs/pt_job_fedavg.py FLAGS
    python benchmarks/lib/null_training.py fedrevive FLAGS   # as jobs/pt_job_fedrevive.py FLAGS (--method fedbuff ...)

The trainer is plugged in through the engine's ``trainer`` option (no flag; ``jobs.engine_config.EngineConfig``):
``NullTrainer`` is the job's own ``TrainingTaskProcessor`` (its plan, its data, its model's shapes) with the
training replaced by a diff made once per process. The diff's arrays are read-only, so a consumer that wrote into
a device's diff would fail here rather than corrupt the next device's.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from common.protocol import DEVICE_EXTRA_PREFIX  # noqa: E402
from processors.task_processor import TrainingTaskProcessor  # noqa: E402

NULL_TRAINER = "benchmarks.lib.null_training:NullTrainer"
JOBS = {"fedavg": "fedavg", "fedrevive": None}  # the job script it stands for -> job_main's method


class NullTrainer(TrainingTaskProcessor):
    """Every device's diff is the same small fixed one (seeded by the run's seed), returned without training."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.reports:
            raise ValueError(f"the null trainer measures no reports; the method asks for {self.reports}")
        self._diff: dict[str, np.ndarray] | None = None

    def _fixed_diff(self, weights: dict) -> dict[str, np.ndarray]:
        if self._diff is None:
            rng = np.random.default_rng(self.seed)
            diff = {}
            for name, value in weights.items():
                if name.startswith(DEVICE_EXTRA_PREFIX):
                    continue
                array = (1e-3 * rng.standard_normal(np.shape(value))).astype(np.float32)
                array.setflags(write=False)
                diff[name] = array
            self._diff = diff
        return dict(self._diff)

    def train(
        self, device_id: str, model_data: dict, version: int, selection: int | None = None
    ) -> dict[str, np.ndarray]:
        return self._fixed_diff(model_data)

    def train_group(
        self, device_ids: list[str], model_data, version, selections: list[int] | None = None
    ) -> list[dict[str, np.ndarray]]:
        first = model_data if isinstance(model_data, dict) else model_data[0]
        return [self._fixed_diff(first) for _ in device_ids]


def main(argv: list[str]) -> int:
    from jobs.cli import job_main

    if not argv or argv[0] not in JOBS:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(JOBS)}}} FLAGS (the flags of jobs/pt_job_<job>.py)")
    return job_main(__doc__, argv[1:], method=JOBS[argv[0]], hidden={"trainer": NULL_TRAINER})


if __name__ == "__main__":
    from jobs.run.process_guard import exit_now

    exit_now(main(sys.argv[1:]))
