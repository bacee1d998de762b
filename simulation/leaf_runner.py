"""Leaf-side widgets that start a device simulator on each leaf client.

``FastDeviceRunner`` runs our ``FastSimulator``; ``StockDeviceRunner`` runs NVFlare's own ``Simulator``
(kept for comparison, ``--simulator stock``). Both give devices ids derived from the leaf's name instead of a
random UUID, so each device's data partition and speed class are the same in every run.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.job_def import JobMetaKey
from nvflare.edge.constants import SpecialDeviceId
from nvflare.edge.simulation.devices.tp import TPODeviceFactory
from nvflare.edge.simulation.simulated_device import DeviceFactory, SimulatedDevice
from nvflare.edge.simulation.simulator import Simulator
from nvflare.edge.web.models.task_response import TaskResponse
from nvflare.edge.widgets.tpo_runner import TPORunner

from common.delays import DelayConfig, DeviceDelays
from common.jsonio import JsonlWriter, write_json_atomic
from common.leaf_outbox import OUTBOX_PROP, LeafOutbox
from common.process_settings import settle_process
from common.result_files import LEAF_PLAN, leaf_log
from processors.local_work import device_work
from processors.task_processor import TrainingTaskProcessor
from simulation.fast_simulator import FastSimulator
from simulation.leaf_channels import EdgeRequestChannel, GatewayChannel
from simulation.leaf_gateway import FIND_GATEWAY, GATEWAY_PROP, LeafGateway
from simulation.leaf_plan import PlanRequest, count_leaf_processes, hardware_summary, plan_leaf
from simulation.planner import WorkerPlan, probe_hardware
from simulation.process_watch import ChildProcessWatch
from simulation.trainer import GroupTrainer, WeightsTrainer


def device_id_prefix(site_name: str) -> str:
    bad = {SpecialDeviceId.MAX_INDICATOR, SpecialDeviceId.NUM_INDICATOR} & set(site_name)
    if bad:
        raise ValueError(f"leaf name {site_name!r} contains {bad}, which NVFlare uses inside device ids")
    return site_name


class StockDeviceRunner(TPORunner):
    """NVFlare's stock device simulator, with deterministic device ids."""

    def create_simulator(self, fl_ctx: FLContext) -> Simulator | None:
        simulator = super().create_simulator(fl_ctx)
        simulator.device_id_prefix = device_id_prefix(fl_ctx.get_identity_name())
        return simulator


class SimulatedPhone(SimulatedDevice):
    """A device trained by the leaf's ``GroupTrainer``: it carries no copy of the task processor."""

    def do_task(self, task: TaskResponse) -> dict:
        raise RuntimeError(f"device {self.device_id} is trained by the leaf's GroupTrainer, not by itself")


class PhoneFactory(DeviceFactory):
    def make_device(self, device_id: str) -> SimulatedDevice:
        return SimulatedPhone(device_id)


class FastDeviceRunner(TPORunner):
    """Starts our ``FastSimulator`` on a leaf. A task processor that is a ``GroupTrainer`` (ours) trains every
    device through one shared instance; any other ``DeviceTaskProcessor`` trains each device through a copy, as
    NVFlare's own runner does.

    At run start the leaf plans its workers, torch threads, engine and group size from its own machine
    (``simulation.leaf_plan``) and logs the plan with its reasons. The plan is applied here, whoever wrote the
    processor: the leaf's torch intra-op threads are set to its share of the cores (a processor that is not ours
    never sets them, and several leaves' default pools then fight over the same cores), at
    most ``num_workers`` devices train at once, and a processor that starts child processes per task (DataLoader
    workers) is reported once (``simulation.process_watch``).

    The plan and one line per device report go to the server through the leaf's outbox (``common.leaf_outbox``,
    which our leaf updater sends up) when ``send_up``; with ``leaf_log_dir`` they are also written on the leaf, as
    ``leaf_<leaf>_plan.json`` and ``leaf_<leaf>.jsonl`` (a recipe whose updater is NVFlare's: ``use_fast_simulator``).

    Args:
        task_processor_id: component id of the task processor.
        plan_request: ``PlanRequest.to_dict()``: what the leaf plans from, besides its own machine.
        job_timeout: seconds to wait for the job to reach the leaf.
        num_devices: devices on this leaf.
        delays: ``DelayConfig.to_dict()``.
        seed: the run seed (delays are a seeded function of it and the device id).
        time_scale: 0: report at once; S > 0: hold each result for its delays x S wall seconds.
        send_up: put the plan and report lines in the leaf's outbox for the server.
        leaf_log_dir: also write them into this folder on the leaf ("": not).
        run_processor_ids: in a pack (``docs/packs.md``), the task processor of each run after the first, in
            order (run 0's is ``task_processor_id``): each run's devices train with their run's settings.
    """

    def __init__(
        self,
        task_processor_id: str,
        plan_request: dict,
        job_timeout: float = 120.0,
        num_devices: int = 100,
        delays: dict | None = None,
        seed: int = 0,
        time_scale: float = 0.0,
        send_up: bool = True,
        leaf_log_dir: str = "",
        run_processor_ids: list[str] | None = None,
    ):
        super().__init__(task_processor_id, job_timeout, num_devices, num_workers=1)
        self.plan_request = plan_request
        self.delays = delays or {}
        self.seed = seed
        self.time_scale = time_scale
        self.send_up = send_up
        self.leaf_log_dir = leaf_log_dir
        self.run_processor_ids = list(run_processor_ids or ())
        self.plan: WorkerPlan | None = None
        self._watch: ChildProcessWatch | None = None
        self._local_log: JsonlWriter | None = None
        self.register_event_handler(EventType.END_RUN, self._close)

    def make_plan(self, fl_ctx: FLContext) -> dict:
        """This leaf's plan from its own machine (in SimEnv the request names how many leaves share it), as
        recorded in ``metrics.json``: the plan, the leaves it counted on its machine, and what it saw of it."""
        request = PlanRequest.from_dict(self.plan_request)
        if request.input_shape is None and isinstance(self.tpo, TrainingTaskProcessor):
            request = replace(request, input_shape=self.tpo.input_shape())
        hardware = probe_hardware()
        neighbours = request.leaves_on_host or count_leaf_processes()
        self.plan = plan_leaf(request, hardware, leaves_on_host=neighbours)
        self.log_info(
            fl_ctx,
            f"leaf plan ({neighbours} leaf process(es) on this machine):\n"
            f"{self.plan.describe()}\n{self.plan.reasoning()}",
        )
        return self.plan.to_dict() | {"leaves_on_host": neighbours, "hardware": hardware_summary(hardware)}

    def create_simulator(self, fl_ctx: FLContext) -> FastSimulator:
        site = fl_ctx.get_identity_name()
        job_name = fl_ctx.get_prop(FLContextKey.JOB_META).get(JobMetaKey.JOB_NAME)
        plan_record = self.make_plan(fl_ctx)
        plan = self.plan
        reporters = []
        if self.send_up:
            outbox = LeafOutbox(site)
            outbox.set_plan(plan_record)
            fl_ctx.set_prop(OUTBOX_PROP, outbox, private=True, sticky=True)  # the leaf's updater sends it up
            reporters.append(outbox.add_report)
        if self.leaf_log_dir:
            os.makedirs(self.leaf_log_dir, exist_ok=True)
            write_json_atomic(os.path.join(self.leaf_log_dir, LEAF_PLAN.format(leaf=site)), plan_record)
            lines = os.path.join(self.leaf_log_dir, leaf_log(site))
            if os.path.exists(lines):  # a new run's lines, not appended to an earlier run's
                os.remove(lines)
            self._local_log = JsonlWriter(lines)
            reporters.append(self._local_log.write)
        channel = self.make_channel(fl_ctx, job_name, device_id_prefix(site))
        if isinstance(self.tpo, TrainingTaskProcessor):
            # every run's processor of a pack (one process, one torch): the leaf's plan, not the job's
            for tpo in (self.tpo, *getattr(channel, "run_trainers", {}).values()):
                tpo.apply_plan(plan.torch_threads, plan.leaves_per_gpu)
        else:  # someone else's processor: the leaf's share of the cores, and a word if it forks per task
            torch.set_num_threads(plan.torch_threads)
            self._watch = ChildProcessWatch(self.logger).start()
        grouped = plan.engine == "vectorized" and not (
            isinstance(channel, EdgeRequestChannel) and channel.trainer is None
        )  # a processor without a group entry point trains each device through its own copy
        settle_process()
        return FastSimulator(
            channel=channel,
            num_workers=plan.num_workers,
            get_job_timeout=self.job_timeout,
            delays=DeviceDelays(DelayConfig.from_dict(self.delays), self.seed, self._work()),
            time_scale=self.time_scale,
            on_report=_fan_out(reporters),
            group_size=plan.group_size if grouped else 1,
        )

    def _work(self):
        """Each device's work per task, when its time scales with it (our processor with --local-epochs)."""
        if isinstance(self.tpo, TrainingTaskProcessor):
            return device_work(self.tpo.data, self.tpo.training, self.seed, self.tpo.device_offsets)
        return None

    def make_channel(self, fl_ctx: FLContext, job_name: str, prefix: str):
        """The leaf's gateway when its executor offers one and the processor trains from weights (ours); NVFlare's
        edge requests otherwise (``simulation.leaf_channels``)."""
        if fl_ctx.get_engine() is not None:
            self.fire_event(FIND_GATEWAY, fl_ctx)
        gateway = fl_ctx.get_prop(GATEWAY_PROP)
        if isinstance(gateway, LeafGateway) and isinstance(self.tpo, WeightsTrainer):
            engine = fl_ctx.get_engine()
            runs = {run: engine.get_component(pid) for run, pid in enumerate(self.run_processor_ids, start=1)}
            # a pack on exact time trains in lock-step, its runs in shared groups (``docs/packs.md``)
            lock_step = bool(runs) and self.time_scale <= 0
            return GatewayChannel(
                gateway, self.tpo, prefix, self.num_devices, run_trainers=runs or None, lock_step=lock_step
            )
        trainer = self.tpo if isinstance(self.tpo, GroupTrainer) else None
        factory = PhoneFactory() if trainer is not None else TPODeviceFactory(self.tpo)
        return EdgeRequestChannel(job_name, factory, prefix, self.num_devices, trainer)

    def _close(self, _event: str, fl_ctx: FLContext) -> None:
        if self._watch is not None:
            self._watch.stop()
            if self._watch.seen:
                self.log_warning(
                    fl_ctx,
                    f"the task processor started at least {len(self._watch.seen)} child "
                    "process(es) during the run (see the warning above)",
                )
        if self._local_log is not None:
            self._local_log.close()


def _fan_out(reporters: list):
    if not reporters:
        return None
    if len(reporters) == 1:
        return reporters[0]

    def report(record: dict) -> None:
        for r in reporters:
            r(record)

    return report
