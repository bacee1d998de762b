"""The events and FLContext keys the result components use to hand a version's record along."""

from typing import NamedTuple

# fired by GlobalModelEvaluator after scoring a version; fl_ctx[VERSION_RECORD] is its record (a dict)
VERSION_EVALUATED = "edgesim.version_evaluated"
# fired by RunRecorder once the record is complete and written; fl_ctx[VERSION_RECORD], fl_ctx[SYSTEM_SAMPLES]
VERSION_RECORDED = "edgesim.version_recorded"
# fired by GlobalModelEvaluator when the run's outcome is decided, before the last version is evaluated:
# fl_ctx[VERSION_RECORD] is {"version"} and fl_ctx[VERSION_WEIGHTS] its weights (GlobalModelSaver saves them)
VERSION_MADE_LAST = "edgesim.version_made_last"
# fired by GlobalModelSaver after writing global_model.pt; fl_ctx[SAVED_VERSION] is the version it holds
MODEL_SAVED = "edgesim.model_saved"
# fired by SystemMonitorComponent at the end of the run; fl_ctx[SYSTEM_SUMMARY] is the summary with its warnings
SYSTEM_SUMMARY_READY = "edgesim.system_summary_ready"

VERSION_RECORD = "edgesim.version_record"
VERSION_WEIGHTS = "edgesim.version_weights"  # with VERSION_EVALUATED / VERSION_RECORDED / VERSION_MADE_LAST
SAVED_VERSION = "edgesim.saved_version"
SYSTEM_SAMPLES = "edgesim.system_samples"
SYSTEM_SUMMARY = "edgesim.system_summary"


class SystemStretch(NamedTuple):
    """The system samples of one version's interval (fl_ctx[SYSTEM_SAMPLES] with VERSION_RECORDED)."""

    samples: list  # raw samples, ``t`` in seconds since ``start_walltime``
    start_walltime: float | None
    aggregate: dict | None  # ``evaluation.utilisation.aggregate(samples)``
