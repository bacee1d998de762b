"""Auto-tuner: measure, on this machine, the worker count a leaf should use and the ``--job-timeout`` it needs.

``python -m jobs.tune [job flags...]`` takes every flag of ``jobs/pt_job_fedavg.py`` (same parser) plus
tuner flags (``--trial-devices``, ``--max-workers``, ``--trial-cores``, ``--min-gain``, ``--skip-job-probe``,
``--probe-timeout``, ``--json``). It:

1. runs short trials: for worker counts 1, 2, 4, ... (up to a cap) it trains ``--trial-devices`` simulated
   devices for real (through the job's own task processor, ``jobs.run.components.make_task_processor``: its model,
   batch, optimizer, local iterations and each device's data partition) on a ``ThreadPoolExecutor`` of W workers,
   and measures devices per second and peak memory (process RSS sampled with psutil; on CUDA also
   ``torch.cuda.max_memory_allocated``). A branch stops at the first out-of-memory trial (recorded, not fatal)
   or when a trial gains less than ``--min-gain`` over the best so far;
2. measures how long a tiny real SimEnv job (same leaves and data, 1 trained version, 2 local iterations)
   takes from ``jobs.run.driver.run`` to the first device report of its slowest leaf, and recommends
   ``--job-timeout = max(60, 3 x that)``, rounded up;
3. prints a table and the recommended flags, and can write everything as JSON.

Pure logic (``worker_steps``, ``candidate_points``, ``explore``, ``recommend``, ``recommend_job_timeout``,
``format_table``) is separate from measurement (``PeakSampler``, ``make_device_trainer``, ``measure_trial``,
``probe_job_start``) so it is testable with fake trials.

Trials emulate one leaf: the job runs ``--num-leaf-nodes`` leaves on this host (sim / poc), so a trial is pinned
to one leaf's share of the cores (``--trial-cores``, default ``cores // leaves`` like the planner) and sets torch's
intra-op threads to ``max(1, cores // W)`` (``WorkerPlan.torch_threads``'s rule: oversubscribed OpenMP pools
made training 30x slower). Devices per second are therefore per leaf.

Search space: points are ``TrialPoint(workers, group_size)``; ``group_size`` is the number of devices one worker
trains together (1: the per-device engine; more: the vectorised engine, ``TrainingTaskProcessor.train_group``).
When the planner picks the vectorised engine, the tuner tries group size 1 and the planned group size, each a
branch of its own over worker counts, and recommends ``--engine`` and ``--group-size`` with the workers.
"""
