"""Shared fixtures: small synthetic data, a task processor factory, and helpers to run the real job entry points
(ending and resuming them: ``tests/e2e/job_runs.py``).

Every test under ``tests/e2e`` runs real NVFlare jobs for tens of seconds each: it is marked ``slow`` here, so
``pytest -m "not slow"`` is the fast subset (CI runs everything).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
E2E_DIR = os.path.join(REPO, "tests", "e2e")
EXAMPLES = os.path.join(REPO, "examples")


def pytest_collection_modifyitems(config, items):
    """Every test under ``tests/e2e`` is marked ``slow``; then the files holding a slow test go first, whole and in
    their order, the rest after them. ``-n 2`` hands each worker a file at a time in this order (``pyproject.toml``
    keeps xdist from reordering files by their number of tests, which put the e2e files, few tests of a minute
    each, last): the long files start early and the short ones fill the gaps, so neither worker waits at the end."""
    for item in items:
        if str(item.path).startswith(E2E_DIR):
            item.add_marker(pytest.mark.slow)
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: each file's tests keep their order


# torch's intra-op thread count when this process first imported it (``one_torch_thread``)
_TORCH_DEFAULT_THREADS: list[int] = []


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Each test computes on one torch intra-op thread. The tests' models and batches are tiny: a second thread
    only waits (OpenMP spins), and on a shared 2-core machine the spinning thread takes the core another process
    of the test needs, so the fast subset took 3x the CPU time on two threads. Only this process: the jobs tests
    start keep torch's default. A test of thread counts asks for ``default_torch_threads``."""
    torch = sys.modules.get("torch")  # imported by the test's module, or by an earlier test; else nothing to set
    if torch is not None:
        if not _TORCH_DEFAULT_THREADS:
            _TORCH_DEFAULT_THREADS.append(torch.get_num_threads())
        torch.set_num_threads(1)


@pytest.fixture
def default_torch_threads(one_torch_thread) -> Iterator[int]:
    """torch's default intra-op thread count for this test (what a process of a job starts with), set back to one
    thread after it; the count."""
    import torch

    threads = _TORCH_DEFAULT_THREADS[0] if _TORCH_DEFAULT_THREADS else torch.get_num_threads()
    torch.set_num_threads(threads)
    yield threads
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_weights_cache(monkeypatch):
    """Each test gets an empty per-process cache of converted global weights (``processors.compute_context``): the
    cache is keyed by version number and processor, and tests reuse version numbers with different models in one
    processor. Its cache of devices' sample indices is emptied too: tests replace ``device_indices``."""
    compute_context = sys.modules.get("processors.compute_context")
    if compute_context is not None:
        monkeypatch.setattr(compute_context, "_global_params", {})
    device_samples = sys.modules.get("processors.data.device_samples")
    if device_samples is not None:
        device_samples.cached_device_indices.cache_clear()


@pytest.fixture
def no_pack_starts(monkeypatch):
    """Fail the test if a refused pack (``--seeds``, ``--runs``, ``run(seeds=...)``, ``run(runs=...)``) reaches
    the point where its job would start (``jobs.run.pack.run_pack``)."""
    from jobs.run import pack

    def boom(*_a, **_k):
        raise AssertionError("a refused pack reached run_pack")

    monkeypatch.setattr(pack, "run_pack", boom)


@pytest.fixture
def no_data_cache(monkeypatch):
    """Each test parses its own files (``processors.data.cache``: no per-machine cache of parsed arrays)."""
    monkeypatch.setenv("EDGESIM_NO_DATA_CACHE", "1")


WANDB_SERVICE = "WANDB_SERVICE"  # W&B's variable naming its service's socket (``wandb.env.SERVICE``)


@pytest.fixture
def tracker_env(tmp_path, monkeypatch) -> Iterator:
    """Trackers that touch nothing outside ``tmp_path`` and no network: MLflow's and W&B's variables cleared (W&B
    then runs offline, ``jobs.tracking.wandb_run``), W&B's caches, staging and settings under ``tmp_path``.

    W&B's service outlives its runs: started in this process (a sweep's parent run), it stays a child of the test
    process, and its socket stays in ``WANDB_SERVICE``, which every job started later inherits. So the test ends
    with W&B torn down here: a later test in this worker neither finds its process among its own descendants
    (``tests/jobs/test_process_guard.py`` stops those) nor starts a job that dials a service another test stopped."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    for name in ("WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_GROUP", "WANDB_BASE_URL", WANDB_SERVICE):
        monkeypatch.delenv(name, raising=False)
    for name, folder in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config")):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / folder))
    yield tmp_path
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()
    os.environ.pop(WANDB_SERVICE, None)


@pytest.fixture(scope="session")
def empty_mlflow_store(request, tmp_path_factory) -> str:
    """An MLflow SQLite store with its tables made (MLflow's migrations take seconds), copied by ``mlflow_store``.
    Kept in pytest's cache, one per MLflow version, so that a contributor's later runs skip the migrations (a
    fresh clone, as CI's, makes it once)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    folder = cache.mkdir("mlflow-empty-store") if cache is not None else tmp_path_factory.mktemp("mlflow")
    path = folder / f"empty-{mlflow.__version__}.db"
    if not path.exists():
        making = tmp_path_factory.mktemp("mlflow") / "empty.db"
        MlflowClient(tracking_uri=f"sqlite:///{making}").search_experiments()
        _copy_in(making, path)
    return str(path)


def _copy_in(source, target) -> None:
    """``source`` copied to ``target`` whole or not at all (another pytest may read ``target`` meanwhile)."""
    import shutil

    partial = target.with_suffix(f".{os.getpid()}.part")
    shutil.copy(source, partial)
    os.replace(partial, target)


@pytest.fixture
def mlflow_store(empty_mlflow_store, tracker_env) -> str:
    """The URI of a fresh MLflow SQLite store of the test's own, ``tracker_env/store/mlflow.db``."""
    import shutil

    path = tracker_env / "store" / "mlflow.db"
    path.parent.mkdir()
    shutil.copy(empty_mlflow_store, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def small_data():
    from processors.data.sources import make_synthetic

    return make_synthetic(2000, 400, seed=0)


def make_processor(
    synthetic_size: int = 2000, seed: int = 0, subset_size: int = 350, profile: str = "high", **training
):
    """The job's task processor on synthetic data and the CPU; ``training`` overrides ``TrainingConfig`` fields."""
    from processors.data.config import DataConfig
    from processors.task_processor import TrainingTaskProcessor
    from processors.training import TrainingConfig

    data = DataConfig(synthetic_size=synthetic_size, subset_size=subset_size)
    training = TrainingConfig(**({"compute_device": "cpu"} | training))
    return TrainingTaskProcessor(data=data.to_dict(), training=training.to_dict(), seed=seed, profile=profile)


def assert_both_engines_agree(data, training, devices: list[str]) -> list[dict]:
    """Train ``devices`` (``DataConfig``, ``TrainingConfig``) from one model's initial weights as one group (the
    vectorised engine) and each alone (the per-device engine): their diffs agree up to summation order, each device
    trained (the check is not vacuous), and the first two devices' diffs differ (each trains its own data). The
    grouped diffs."""
    import numpy as np

    from processors.models import initial_model
    from processors.task_processor import TrainingTaskProcessor

    proc = TrainingTaskProcessor(data=data.to_dict(), training=training.to_dict(), seed=0, profile="high")
    weights = {k: v.numpy() for k, v in initial_model(training.model, 0).state_dict().items()}
    grouped = proc.train_group(devices, weights, version=1)
    for device_id, diff in zip(devices, grouped, strict=True):
        alone = proc.train(device_id, weights, version=1)
        assert diff.keys() == alone.keys() == weights.keys()
        for k in alone:
            np.testing.assert_allclose(diff[k], alone[k], rtol=0, atol=1e-5, err_msg=k)
        assert max(float(np.abs(d).max()) for d in alone.values()) > 1e-4
    assert any(not np.allclose(grouped[0][k], grouped[1][k]) for k in weights)
    return grouped


# a small real job on exact simulated time (2 leaves x 12 devices, 8 in flight, the paper's delays, tiny data), the
# base of the e2e tests that compare runs (each adds its seed and method)
SMALL_JOB = (
    "--num-leaf-nodes 2 --devices-per-leaf 12 --device-selection-size 8 --delays paper --synthetic-size 1500 "
    "--subset-size 40 --local-iters 2 --local-batch-size 16 --local-lr 1e-3 --eval-backlog wait"
).split()
# a fleet whose devices come and go (and drop out mid-task): one session of half a 6-unit day each
DIURNAL = ["--availability", "diurnal", "--availability-period", "6", "--availability-online", "0.5"]


def job_commands(runs: dict[str, list[str]], tmp_path, *common: str) -> dict[str, list[str]]:
    """Each named run's command (``jobs/pt_job_fedrevive.py`` with ``common`` and its own flags), its results in
    ``tmp_path/NAME/out`` and its workspace in ``tmp_path/NAME/ws``."""
    return {
        name: [PYTHON, "jobs/pt_job_fedrevive.py", *common, *flags]
        + ["--output", str(tmp_path / name / "out"), "--workspace", str(tmp_path / name / "ws")]
        for name, flags in runs.items()
    }


def digest(path) -> str:
    """A file's SHA-256: files compared by it fail at once, naming two short strings (pytest's diff of two
    different models' bytes can outlast the test's timeout)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_same_run(out, again) -> None:
    """Two runs' results folders hold the same run: the same ``events.jsonl``, accuracies and model bytes."""
    for name in ("events.jsonl", "global_model.pt"):
        assert digest(again / name) == digest(out / name), name
    curves = [json.loads((o / "metrics.json").read_text())["versions"] for o in (out, again)]
    assert [(v["version"], v.get("accuracy")) for v in curves[1]] == [
        (v["version"], v.get("accuracy")) for v in curves[0]
    ]


def job_args(tmp_path, *extra: str, output: bool = True) -> list[str]:
    """Flags for a small but real NVFlare run: 2 leaves, 8 devices a round, synthetic data."""
    return (["--output", str(tmp_path / "out")] if output else []) + [
        "--num-leaf-nodes",
        "2",
        "--devices-per-leaf",
        "6",
        "--device-selection-size",
        "8",
        "--synthetic-size",
        "3000",
        "--local-lr",
        "1e-3",
        "--workspace",
        str(tmp_path / "ws"),
        *extra,
    ]


GUARD_DIR = os.path.join(REPO, "tests", "repr_guard")


def run_guarded(tmp_path, script: str, *flags: str) -> tuple[str, str]:
    """Run ``script`` (or ``-c CODE``) with ``tests/repr_guard`` in every process of it: its stdout, and every
    numpy rendering of a large array the guard recorded ("": none; ``tests/e2e/test_no_payload_rendering.py``)."""
    import subprocess

    guard = tmp_path / "rendered.txt"
    env = dict(os.environ, EDGESIM_REPR_GUARD=str(guard))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (GUARD_DIR, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([PYTHON, script, *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, guard.read_text() if guard.exists() else ""


def kill_tree(pid: int) -> list[psutil.Process]:
    """SIGKILL a process and every descendant at once: a crash, not a polite stop."""
    root = psutil.Process(pid)
    tree = [root, *root.children(recursive=True)]
    for p in tree:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(tree, timeout=10)
    return tree


def outputs_when_done(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Each started process's output once it has ended with exit code 0; every one still running when one fails or
    outlasts ``timeout`` is killed with its descendants."""
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p.pid)
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out[-6000:]
    return outs


def wait_for(predicate, proc: subprocess.Popen, timeout: float, what: str, console: str | None = None) -> None:
    """Poll ``predicate`` until it holds; fail if ``proc`` ends first (with its output: its stdout pipe, or the file
    ``console`` its output goes to) or ``timeout`` passes."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            if console:
                with open(console) as f:
                    output = f.read()
            else:
                output = proc.stdout.read()
            pytest.fail(f"the job ended before {what}: {output[-3000:]}")
        if predicate():
            return
        time.sleep(0.3)
    pytest.fail(f"no {what} within {timeout} s")


def checkpoint_version(out) -> int:
    try:
        return json.loads((out / "checkpoint" / "meta.json").read_text())["version"]
    except (OSError, ValueError):
        return 0


def examples_env() -> dict:
    """This process's environment with ``examples/`` on PYTHONPATH, so ``--method module:Class`` finds them."""
    return os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (EXAMPLES, os.environ.get("PYTHONPATH")) if p)}


def nudged_alone(proc, device_id: str, weights: dict, version: int) -> list[dict]:
    """``device_id`` trained alone by ``proc`` (a ``TrainingTaskProcessor``) from ``weights`` moved one float32 ulp
    up, then one down: what float32 rounding alone does to this training (``assert_trained_alike``)."""
    import numpy as np

    from processors import compute_context

    runs = []
    for direction in (np.inf, -np.inf):
        nudged = {
            k: np.nextafter(v, np.asarray(direction, v.dtype)) if np.issubdtype(v.dtype, np.floating) else v
            for k, v in weights.items()
        }
        compute_context._global_params.clear()  # converted weights are cached per version: these are new ones
        runs.append(proc.train(device_id, nudged, version))
    compute_context._global_params.clear()
    return runs


def assert_trained_alike(
    got: dict, want: dict, nudged: Callable[[], list[dict]], rtol: float = 1e-4, atol: float = 1e-5
) -> None:
    """Two float32 trainings of one device that differ in summation order only (the vectorised engine's ``got``,
    the per-device engine's ``want``) agree on every element within ``rtol``/``atol``; or, on a weight draw that
    float32 rounding tips, ``got`` is no further from ``want`` than rounding alone moves it: ``nudged()``, the
    device alone trained from its start weights moved one ulp up and down (``nudged_alone``), parts from ``want``
    on at least as many elements, at least as far.

    Why rounding is the yardstick, not a looser tolerance: float32 training is a discontinuous function of
    rounding. A ReLU input within rounding of 0 passes its sample's gradient in one summation order and not in the
    other, and Adam's step, lr x m / (sqrt(v) + eps), turns every gradient element whose sign that changes into a
    move of about lr either way. On 1 draw of 300 of the profiles test (torch seed 156) one fc2 input was 3.5e-9 at
    step 1 (float32's error there 3e-8, the median input 0.036): 152 elements parted by 2 lr after that step, 4,515
    of 62,050 by up to 3.5 lr after 3 steps, and the device alone nudged one ulp up parted from itself on the same
    4,515. Nudged so, the device alone parted from itself on 8 of the 300 draws (1 to 2,651 elements), the engines
    on that one only. With SGD (lr 0.05) the engines parted on 2 draws of 300, on 11 and 2 elements by at most
    9.6e-5 (0.002 lr), exactly as the nudge did: the ReLU decides, Adam amplifies. A fixed share of elements (the
    1% allowed before) fails draw 156 and could pass a bug on others; rounding's own effect, measured on the draw,
    is nil on most draws, so there every element must agree, and where it is not, a bug still parts far more
    elements (a learning rate 10% higher: 47,358 on draw 156, 51,656 on draw 0). The engines' exact equivalence,
    at 1e-10, is held in float64 (``tests/processors/test_training_vectorized.py``)."""
    import numpy as np

    def parted(a: dict) -> tuple[int, float]:
        """Elements of ``a`` past the tolerance from ``want``, and the largest distance."""
        assert a.keys() == want.keys()
        count = sum(int((np.abs(a[k] - w) > atol + rtol * np.abs(w)).sum()) for k, w in want.items())
        return count, max(float(np.abs(a[k] - w).max(initial=0)) for k, w in want.items())

    count, far = parted(got)
    if not count:
        return
    rounding = [parted(n) for n in nudged()]
    most, furthest = max(c for c, _ in rounding), max(d for _, d in rounding)
    assert count <= most and far <= furthest, (
        f"{count} elements past rtol {rtol} / atol {atol}, up to {far:.3g} apart, where rounding alone (the device "
        f"alone from start weights one ulp off) parts {most}, up to {furthest:.3g}"
    )
