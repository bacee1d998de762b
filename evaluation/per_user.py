"""Per-user test accuracy, as LEAF evaluates: each test user's own accuracy, and their spread over the users.

Where the dataset keeps each user's test samples together (``processors.data.users``: LEAF's test files, TFF's,
a Hugging Face dataset's held-out tenth), the evaluator scores every test sample once, as for the global accuracy
(the same batches, so the same figure), and also counts each user's. The record's ``per_user`` gives the spread:
the users scored, and their accuracy's min, 10th percentile, median, 90th percentile, max and mean (the
unweighted mean over users; the global accuracy weighs users by their test samples).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@torch.no_grad()
def per_user_accuracy(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    offsets: np.ndarray,
    prepare: Callable[[torch.Tensor], torch.Tensor],
    batch_size: int = 1000,
) -> tuple[float, float, dict]:
    """(global accuracy, global loss, the per-user spread) of ``model``; user ``u``'s test samples are
    ``offsets[u]`` up to ``offsets[u + 1]`` (samples past the last offset count for the global figures only)."""
    model.eval()
    device = next(model.parameters()).device
    hits, loss = [], 0.0
    for start in range(0, len(y), batch_size):
        xb = prepare(x[start : start + batch_size].to(device))
        yb = y[start : start + batch_size].to(device)
        logits = model(xb)
        hits.append((logits.argmax(1) == yb).cpu())
        loss += F.cross_entropy(logits.float(), yb, reduction="sum").item()
    correct = torch.cat(hits).numpy() if hits else np.zeros(0, dtype=bool)
    accuracy, loss = int(correct.sum()) / max(len(y), 1), loss / max(len(y), 1)
    sizes = np.diff(offsets)
    scored = sizes > 0
    if not scored.any():
        return accuracy, loss, {"users": 0}
    per_user = np.add.reduceat(correct[: offsets[-1]].astype(np.int64), offsets[:-1][scored]) / sizes[scored]
    spread = {"users": int(scored.sum()), "mean": float(per_user.mean())}
    for name, q in (("min", 0), ("p10", 10), ("median", 50), ("p90", 90), ("max", 100)):
        spread[name] = float(np.percentile(per_user, q))
    return accuracy, loss, {k: round(v, 5) if isinstance(v, float) else v for k, v in spread.items()}
