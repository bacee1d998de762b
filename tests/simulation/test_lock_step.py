"""A pack's lock-step on a leaf (``simulation.leaf_channels.GatewayChannel``, docs/packs.md): release n of every run
is handed to the workers only once it is complete (every run has made n releases or ended, and every device of it
has its model), so a release never reaches the workers in parts and the groups, hence every diff's bits, depend on
the runs' schedules, not on when each run's messages reach the leaf. ``first_missing`` is the leaf's part of
"complete": the lowest release with a selected device whose model has not come yet."""

from __future__ import annotations

from simulation.leaf_channels import GatewayChannel
from simulation.leaf_gateway import GatewayTask, LeafWork
from simulation.run_tables import first_missing

WEIGHTS = {"w": 0}


class ScriptedGateway:
    """Hands out the scripted works in order, one per ``take_work``; then nothing new."""

    def __init__(self, works: list[LeafWork]):
        self.works = works
        self.runs: list[int] = []

    def take_work(self, prefix: str, stamp: int, timeout: float, runs: int = 0) -> LeafWork:
        self.runs.append(runs)
        return self.works.pop(0) if self.works else LeafWork(stamp)


def work(stamp: int, complete: int, *tasks: GatewayTask) -> LeafWork:
    versions = {t.version for t in tasks}
    run_models = {run: {v: WEIGHTS for v in versions} for run in {t.run for t in tasks} if run}
    return LeafWork(stamp, list(tasks), {v: WEIGHTS for v in versions}, run_models, complete)


def handed(tasks) -> list[tuple[int, str, int | None]]:
    return sorted((t.run, t.device, t.release) for t in tasks)


def test_a_release_waits_until_every_run_has_made_it_then_goes_out_whole():
    gateway = ScriptedGateway(
        [
            # run 0's release 1 and 2 are here; run 1 has made no release yet: nothing is complete
            work(1, 0, GatewayTask("s#0", 5, 1, 1, 0), GatewayTask("s#1", 6, 2, 2, 0)),
            # run 1's release 1 comes: release 1 of both runs is complete, release 2 is not
            work(2, 1, GatewayTask("s#2", 9, 1, 1, 1)),
            # run 1's release 2, and a synchronous task (no release): everything is complete
            work(3, 2, GatewayTask("s#3", 10, 2, 2, 1), GatewayTask("s#4", 11, 1, None, 1)),
        ]
    )
    channel = GatewayChannel(gateway, object(), "s", 5, run_trainers={1: object()}, lock_step=True)
    assert channel.next_tasks(0.0) == []
    assert handed(channel.next_tasks(0.0)) == [(0, "s#0", 1), (1, "s#2", 1)]
    assert handed(channel.next_tasks(0.0)) == [(0, "s#1", 2), (1, "s#3", 2), (1, "s#4", None)]
    assert channel.next_tasks(0.0) == []
    assert gateway.runs == [2, 2, 2, 2]  # the leaf is asked for the pack's two runs' completeness


def test_without_a_pack_the_channel_hands_tasks_out_as_they_come():
    gateway = ScriptedGateway([work(1, None, GatewayTask("s#0", 5, 1, 1, 0))])
    channel = GatewayChannel(gateway, object(), "s", 5, lock_step=True)  # one run: nothing to wait for
    assert handed(channel.next_tasks(0.0)) == [(0, "s#0", 1)]
    assert gateway.runs == [0]


def test_the_first_release_with_a_device_still_waiting_for_its_model():
    selection = {"s#0": 5, "s#1": 6, "s#2": 7, "t#0": 8}  # t#0 is another leaf's
    versions = {5: 1, 6: 2, 7: 3, 8: 1}
    releases = {5: 1, 6: 2, 7: 3, 8: 1}
    assert first_missing("s", selection, set(), versions, releases, {1: WEIGHTS, 2: WEIGHTS, 3: WEIGHTS}) == float(
        "inf"
    )
    assert first_missing("s", selection, set(), versions, releases, {1: WEIGHTS, 3: WEIGHTS}) == 2
    # a device already handed out waits for nothing; another leaf's device is not this leaf's concern
    assert first_missing("s", selection, {("s#1", 6)}, versions, releases, {1: WEIGHTS, 3: WEIGHTS}) == float("inf")
    assert first_missing("s", selection, set(), versions, releases, {2: WEIGHTS, 3: WEIGHTS}) == 1
