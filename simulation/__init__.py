"""The leaf process: its simulated devices, the workers that train them, and their wire to the server.

Runs in each leaf (NVFlare client) process: the worker planner (``planner``, ``leaf_plan``), the device simulator
(``fast_simulator``), its runner and channels (``leaf_runner``, ``leaf_channels``, ``leaf_gateway``), the trainer
contract (``trainer``), and the leaf's NVFlare executor and updater, which carry its devices' updates up and the
model versions they train down (``leaf_executor``, ``versioned_updater``; a relay runs them too). Every private
NVFlare name the project touches, in any process, lives in ``nvflare_private``.

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
