"""A model slow to evaluate, for jobs whose server evaluation must outlast something (the watchdog's grace, the
protocol): a small convnet whose forward pass sleeps in eval mode only, so training is unaffected and every
evaluation on the server takes the seconds asked for. A job imports it as ``--model slow_model:SlowToEvaluate``."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

SLOW_MODEL = textwrap.dedent(
    '''
    import time

    import torch.nn as nn


    class SlowToEvaluate(nn.Module):
        """A small convnet whose forward pass in eval mode (the server's evaluation) sleeps {seconds} s."""

        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 15 * 15, 10))

        def forward(self, x):
            if not self.training:
                time.sleep({seconds})
            return self.net(x)
    '''
)


def slow_model_env(folder: Path, seconds: float) -> dict[str, str]:
    """Write ``slow_model.py`` (each evaluation sleeping ``seconds``) into ``folder``; the environment in which a job
    imports it."""
    (folder / "slow_model.py").write_text(SLOW_MODEL.format(seconds=seconds))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p))
