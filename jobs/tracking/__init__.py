"""Experiment trackers (``--tracking``): the driver's copy of a run in MLflow or W&B, through their own clients.

The run's results stay the server's (``evaluation``: ``metrics.json``, ``events.jsonl``, the model, the plot and,
for ``tensorboard``, its ``tensorboard/`` folder); the driver follows them and logs them to each tracker
(``jobs.tracking.run_tracking``), so a tracker never runs inside an NVFlare process and never touches a result
file. ``choice`` reads the flag; ``params`` and ``series`` say what is logged; ``mlflow_run`` and ``wandb_run`` log
it. docs/tracking.md is the user's guide.
"""
