"""The server's fix to NVFlare 2.9 (fix 9 of ``docs/nvflare-upstream.md``): the simulator's server notices a
finished run sooner. Checked by ``tests/simulation/test_nvflare_private.py`` and, for the body it relies on,
``tests/simulation/test_nvflare_guard.py``."""

from __future__ import annotations

from common.nvflare_private import in_simulator

NVFLARE_RELIED_ON = {  # bodies whose behaviour a fix depends on (the fix's number)
    "nvflare.private.fed.server.fed_server.FederatedServer.start_run": "7768d4955024a4c5",  # 9
}
SIMULATOR_ENGINE_CHECK = 0.25  # seconds between the simulator server's checks for a finished run (NVFlare: 3)


def quick_engine_checks(engine) -> None:
    """The simulator's server checks every ``SIMULATOR_ENGINE_CHECK`` seconds whether its run has finished (fix 9);
    a no-op outside the simulator, or for an engine without NVFlare's ``FederatedServer``. Call at START_RUN."""
    server = getattr(engine, "server", None)
    if in_simulator() and server is not None and hasattr(server, "check_engine_frequency"):
        server.check_engine_frequency = min(server.check_engine_frequency, SIMULATOR_ENGINE_CHECK)
