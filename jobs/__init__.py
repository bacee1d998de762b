"""What a user runs, and the top of the layers.

Here: the job entry points (``pt_job_fedavg.py``, ``pt_job_fedrevive.py``), the Python API (``api``), the methods
(``methods``), the config (``config``), the command line built from it (``cli``) and what may change on
``--resume`` (``resume``). Below, by concern: ``jobs.run`` (the run pipeline), ``jobs.deploy`` (deployments on
this machine or across hosts, ``python -m jobs.deploy``) and ``jobs.tune`` (the worker tuner,
``python -m jobs.tune``)."""
