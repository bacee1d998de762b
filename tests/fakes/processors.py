"""Fake task processors: one that is not this project's (the smallest ``DeviceTaskProcessor`` a user could
write), and the job's own whose every task raises from some model version on."""

from nvflare.edge.simulation.device_task_processor import DeviceTaskProcessor

from processors.task_processor import TrainingTaskProcessor


class UsersProcessor(DeviceTaskProcessor):
    def __init__(self, lr: float = 0.1):
        DeviceTaskProcessor.__init__(self)
        self.lr = lr

    def setup(self, job):
        pass

    def shutdown(self):
        pass

    def process_task(self, task):
        return {}


class FailingTrainer(TrainingTaskProcessor):
    """The job's own processor with a bug from model version ``fail_from`` on: every task of such a version
    raises, in either engine (as every device did on the first GPU run). Plugged in through the engine's
    ``trainer`` option (``jobs.engine_config.EngineConfig``)."""

    fail_from = 1

    def _check(self, versions: list[int]) -> None:
        if max(versions) >= self.fail_from:
            raise RuntimeError(f"a bug in the fake trainer: version {max(versions)} cannot be trained")

    def train(self, device_id: str, model_data: dict, version: int, selection: int | None = None):
        self._check([version])
        return super().train(device_id, model_data, version, selection)

    def train_group(self, device_ids: list[str], model_data, version, selections: list[int] | None = None):
        self._check([version] if isinstance(version, int) else list(version))
        return super().train_group(device_ids, model_data, version, selections)


class FailingFromVersion2Trainer(FailingTrainer):
    """Trains version 1 (so a version is made and checkpointed), then fails every task."""

    fail_from = 2
