"""The run pipeline, from a ``JobConfig`` to results in ``--output``: ``plan`` (workers, leaves, checks),
``components`` and ``recipe`` (the NVFlare job), ``environments`` (SimEnv / PocEnv / ProdEnv), ``driver`` (runs it,
with ``process_guard`` and ``watchdog``), ``remote`` (following a job on a deployment), ``outputs`` and ``results``
(the output folder and the end-of-run report)."""
