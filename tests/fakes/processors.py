"""A task processor that is not this project's: the smallest ``DeviceTaskProcessor`` a user could write."""

from nvflare.edge.simulation.device_task_processor import DeviceTaskProcessor


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
