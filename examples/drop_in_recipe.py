"""Your own NVFlare edge recipe and task processor, on this project's device simulator: one line.

The recipe below is built as NVFlare's edge examples build theirs (``EdgeFedBuffRecipe``, ``SimulationConfig``
with the processor in ``example_style_processor.py``); ``use_fast_simulator(recipe)`` is the only line this
project adds. ``--stock`` runs it on NVFlare's own device simulator instead.

    python examples/drop_in_recipe.py --versions 4 --results-dir /tmp/leaf_logs
"""

import argparse
import os
import tempfile

from example_style_processor import ExampleStyleProcessor, TutorialConvNet, write_dataset
from nvflare.edge.tools.edge_fed_buff_recipe import (
    DeviceManagerConfig,
    EdgeFedBuffRecipe,
    ModelManagerConfig,
    SimulationConfig,
)
from nvflare.recipe.sim_env import SimEnv

from jobs.drop_in import use_fast_simulator


def build_recipe(args) -> EdgeFedBuffRecipe:
    processor = ExampleStyleProcessor(
        args.data_file,
        subset_size=args.steps * args.batch_size,
        batch_size=args.batch_size,
        loader_workers=args.loader_workers,
    )
    return EdgeFedBuffRecipe(
        job_name="drop_in_example",
        model=TutorialConvNet(),
        # synchronous rounds: a new version from every selected device's update
        model_manager_config=ModelManagerConfig(
            num_updates_for_model=args.selection, global_lr=1.0, max_model_version=args.versions, update_timeout=60
        ),
        device_manager_config=DeviceManagerConfig(
            device_selection_size=args.selection, min_hole_to_fill=args.selection
        ),
        simulation_config=SimulationConfig(
            processor, job_timeout=args.job_timeout, num_devices=args.devices_per_leaf, num_workers=10
        ),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stock", action="store_true", help="NVFlare's own device simulator (no use_fast_simulator)")
    p.add_argument("--leaves", type=int, default=2)
    p.add_argument("--devices-per-leaf", type=int, default=60)
    p.add_argument("--selection", type=int, default=100, help="devices a round (all of them make a version)")
    p.add_argument("--versions", type=int, default=4, help="max model version (versions 2.. are trained)")
    p.add_argument("--steps", type=int, default=25, help="local steps per device (one epoch of steps x batch)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--loader-workers", type=int, default=0, help="the processor's DataLoader num_workers")
    p.add_argument("--dataset-size", type=int, default=10_000, help="images in the file each task loads")
    p.add_argument("--data-file", help="the dataset file (default: made in the workspace)")
    p.add_argument("--workspace", help="NVFlare's workspace (default: a new temporary folder)")
    p.add_argument("--results-dir", default="", help="each leaf's plan and report lines (fast only)")
    p.add_argument("--update-interval", type=float, default=None, help="seconds between leaf syncs (fast only)")
    p.add_argument("--job-timeout", type=float, default=120.0, help="seconds a leaf waits for the job to reach it")
    args = p.parse_args()
    args.workspace = args.workspace or tempfile.mkdtemp(prefix="drop_in_")
    os.makedirs(args.workspace, exist_ok=True)
    args.data_file = args.data_file or write_dataset(os.path.join(args.workspace, "data.npz"), args.dataset_size)

    recipe = build_recipe(args)
    if not args.stock:
        use_fast_simulator(recipe, results_dir=args.results_dir, update_interval=args.update_interval)
    run = recipe.execute(SimEnv(num_clients=args.leaves, num_threads=args.leaves, workspace_root=args.workspace))
    print(f"status: {run.get_status()}; NVFlare workspace: {args.workspace}")


if __name__ == "__main__":
    main()
