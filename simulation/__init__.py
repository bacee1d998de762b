"""Device-simulation engine that runs on each leaf client: planner, clock, simulator, runner, monitor.

``from simulation import use_fast_simulator`` is the drop-in for existing NVFlare edge recipes
(``simulation.drop_in``); it is imported on first use, so the leaf's and server's own imports stay light.
"""

_DROP_IN = ("use_fast_simulator", "DropInOptions")


def __getattr__(name: str):
    if name in _DROP_IN:
        from simulation import drop_in

        return getattr(drop_in, name)
    raise AttributeError(f"module 'simulation' has no attribute {name!r}")


__all__ = list(_DROP_IN)
