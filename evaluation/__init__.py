"""The server process, its results: evaluate each global model and record the run, one concern per NVFlare component.

The chain of one evaluated version (events in ``evaluation.events``)::

    global model --GLOBAL_WEIGHTS_UPDATED--> GlobalModelEvaluator --VERSION_EVALUATED--> RunRecorder
        --VERSION_RECORDED--> ProgressReporter, TensorBoardWriter, GlobalModelSaver

``SystemMonitorComponent`` samples the machine; the recorder reads its figures for each version, and at the end
of the run it fires SYSTEM_SUMMARY (recorded, printed). ``RunRecorder`` is the one writer of ``metrics.json``.
"""
