"""Our fixes to NVFlare's waits (``common.nvflare_private``), installed at the very start of each of NVFlare's
simulator processes instead of when their app's components load.

A SimEnv run's server process waits before any code of ours loads: its cell's internal listener sleeps 0.5 s
("to wait for listener ready"), and its poll for the server app's start sleeps 1 s at a time, the first sleeps
before our components (built while it sleeps) can shorten it. NVFlare reads the job's logging config at the very
start of each simulator process (``SimulatorRunner.setup``, ``simulator_worker.main``), and a logging config may
name a filter factory (``"()"``, ``logging.config``): the run's log config
(``jobs.run.environments.quiet_log_config``) names ``start_early``, which installs the fixes there. The processes,
their order and the wire are NVFlare's.

The garbage collector is paused here too (``common.startup_gc``): what follows in each of these processes is the
import of torch and of the job's components; our server's assessor resumes it at START_RUN, a leaf's runner once
its simulator is built.

Not done here, though tried: importing torch on a background thread from this point (to overlap the server's and
the workers' start-up waits) killed the simulator's server process at once ("Intel oneMKL FATAL ERROR: Cannot load
libtorch_cpu.so"), and gained nothing measurable in the workers, whose start-up is CPU work, not waits.
"""

from __future__ import annotations

import logging
import threading

from common import startup_gc

_started = threading.Event()


def start_early() -> logging.Filter:
    """The logging filter factory the run's log config names: installs our NVFlare fixes once per process (NVFlare
    may apply the config more than once); the filter passes every record."""
    if not _started.is_set():
        _started.set()
        startup_gc.pause()
        from common.nvflare_private import install_nvflare_fixes

        install_nvflare_fixes()
    return logging.Filter()
