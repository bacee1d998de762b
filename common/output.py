"""Where a run's result files go: the results folder the job names, or else the server app's run folder."""

from __future__ import annotations

import os

from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext


def output_dir(results_dir: str, fl_ctx: FLContext) -> str:
    """``results_dir``, or the app's root folder when it is empty (an exported job run by ``nvflare simulator``);
    created if missing."""
    out = results_dir or fl_ctx.get_prop(FLContextKey.APP_ROOT)
    os.makedirs(out, exist_ok=True)
    return out
