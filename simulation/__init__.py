"""The leaf process: its simulated devices, the workers that train them, and their wire to the server.

Runs in each leaf (NVFlare client) process: the worker planner (``planner``, ``leaf_plan``), the device simulator
(``fast_simulator``), its runner and channels (``leaf_runner``, ``leaf_channels``, ``leaf_gateway``), the trainer
contract (``trainer``), and the leaf's NVFlare executor and updater, which carry its devices' updates up and the
model versions they train down (``leaf_executor``, ``versioned_updater``; a relay runs them too, with
``bulk_relay``). The leaf's own fixes to NVFlare live in ``nvflare_private`` (the ones every process installs: in
``common.nvflare_private``).

The drop-in for existing NVFlare edge recipes runs in the user's driver: ``from jobs.drop_in import
use_fast_simulator``.
"""
