"""Sweeps and hyperparameter search on simulated time: ``python -m jobs.sweep SPEC`` (``cli``) or
``jobs.api.sweep``. A YAML spec (``spec``) names the base flags, a grid, a search space, the objective (``objective``)
and the trials; an Optuna study (``study``: TPE, a patient Hyperband or median pruner, RDB storage, resumable) drives
trials that each run the job's own command line in a process of their own (``trial``), packed onto the cores by
``runner`` (a candidate repeated over seeds scored and pruned on their mean), or sent as jobs to a running
deployment (``deployment``); ``report`` prints the table and the best command and draws the plots, ``board`` writes
TensorBoard's runs and hparams. docs/sweeps.md has the detail.
"""
