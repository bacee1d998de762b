"""Loss stabilisation of FedRevive's four losses (feature statistics, one-hot, adversarial, distillation).

Both references guard each loss the same way (R1 ``FastMetaSynthesizer._stabilize_loss``, R2
``DFKDReviver._stabilize``), each loss with its own window of accepted values:

* a non-finite value is rejected;
* once the window holds at least ``MIN_HISTORY`` (10) values, a value above ``FACTOR`` (3) x their mean is
  rejected, when that mean is positive (so a loss that is negative by construction, the adversarial term, is only
  ever rejected for being non-finite);
* an accepted value enters the window, which keeps the last ``WINDOW`` (20); a rejected one never does.

A rejected loss is not skipped: it becomes a zero that keeps its autograd graph, and the caller still runs its
backward pass and optimiser step, as both references do (Adam then moves by its momentum alone, and the KD
student's weight decay still applies). A non-finite value becomes a zero cut from the graph, so no gradient
reaches the parameters through it: where the references' zero (R2 ``nan_to_num``, R1 ``loss * 0``) can still pass
a NaN gradient upstream (0 x NaN), ours cannot; when it is the whole loss, Adam sees no gradient and leaves the
parameters as they are (the one difference, listed in ``docs/fedrevive-differences.md``).
"""

from __future__ import annotations

import torch

FACTOR = 3.0
MIN_HISTORY = 10
WINDOW = 20


class LossStabilizer:
    """Per-loss windows of accepted values; ``__call__`` returns the loss or its rejected zero."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.windows: dict[str, list[float]] = {}
        self.rejected: dict[str, int] = {}  # rejections per loss over the run, for the log

    def __call__(self, loss: torch.Tensor, name: str) -> torch.Tensor:
        """``loss`` (a 0-d tensor) if accepted, else a zero with the same graph (see the module docstring)."""
        if not self.enabled:
            return loss
        window = self.windows.setdefault(name, [])
        value = loss.item()
        if not torch.isfinite(loss):
            # a zero cut from the graph: upstream of a non-finite loss the local derivatives are non-finite too,
            # and 0 x NaN is NaN, so the references' zero (R2 nan_to_num, R1 loss * 0) can still carry a NaN
            # gradient into the parameters; this one carries none (a leaf, so a backward of it alone still runs)
            return self._reject(torch.zeros((), dtype=loss.dtype, device=loss.device, requires_grad=True), name)
        if len(window) >= MIN_HISTORY:
            mean = sum(window) / len(window)
            if mean > 0 and value > FACTOR * mean:
                return self._reject(loss * 0.0, name)
        window.append(value)
        del window[:-WINDOW]
        return loss

    def _reject(self, zero: torch.Tensor, name: str) -> torch.Tensor:
        self.rejected[name] = self.rejected.get(name, 0) + 1
        return zero

    def state_dict(self) -> dict:
        return {"windows": {k: list(v) for k, v in self.windows.items()}, "rejected": dict(self.rejected)}

    def load_state_dict(self, state: dict) -> None:
        self.windows = {k: list(v) for k, v in state.get("windows", {}).items()}
        self.rejected = dict(state.get("rejected", {}))
