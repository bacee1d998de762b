"""A job process's start-up without Python's cyclic garbage collector.

Every process of a SimEnv run (the driver, NVFlare's simulator server, each leaf's worker) starts by importing
torch, NVFlare and this project: millions of objects, none of them garbage, which the collector walks again and
again as they are made (its cost: "The figures behind rules in the code", PERFORMANCE_OPTIMIZATION.md). ``pause`` stops the collector before those imports and ``resume`` starts it again once the
process is built (the driver once its modules are loaded, the server at START_RUN, a leaf when its simulator
starts, after ``gc.freeze``). Reference counting frees memory as before; only cycles wait for ``resume``.
"""

from __future__ import annotations

import gc


def pause() -> None:
    """Stop the cyclic collector for the imports to come (``resume`` starts it again)."""
    gc.disable()


def resume(freeze: bool = False) -> None:
    """Start the collector again; ``freeze``: first move every object made so far out of its reach for good
    (``gc.freeze``: a process's modules are never garbage, and later collections need not walk them)."""
    if freeze:
        gc.freeze()
    gc.enable()
