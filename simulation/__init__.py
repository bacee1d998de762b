"""Simulated devices and simulated time. The leaf's side: the worker planner (``planner``, ``leaf_plan``), the
simulator (``fast_simulator``), its runner and channels (``leaf_runner``, ``leaf_channels``, ``leaf_gateway``) and the
trainer contract (``trainer``). The server's time model: the event schedule (``schedule``), the device pool
(``device_pool``), the reference trace (``event_reference``) and the planner of a dry run (``timeline``).

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
