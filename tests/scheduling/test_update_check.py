"""NaN and inf never reach the server's model: the check alone (``scheduling.update_check``), then the assessor on
exact time with scripted leaves that send non-finite updates straight to the server, past any leaf's own check
(NVFlare-job free, as ``tests/scheduling/test_failure_streak.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from common.finite import NOT_FINITE, nonfinite_entry, nonfinite_reason
from common.protocol import (
    DeviceUpdate,
    SelectionSum,
)
from scheduling.update_check import FiniteUpdates
from tests.scheduling.test_failure_streak import run_answering


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_any_nan_or_inf_entry_is_found_and_finite_or_integer_arrays_pass(bad):
    big = np.zeros(10_000, np.float32)
    big[7_777] = bad
    assert nonfinite_entry({"a": np.ones(3, np.float32), "b": big}) == "b"
    assert nonfinite_entry({"a": np.float32(bad)}) == "a"  # a scalar report (a loss)
    mixed = np.array([np.inf, -np.inf], np.float32)  # their sum is NaN: still found
    assert nonfinite_entry({"m": mixed}) == "m"
    assert nonfinite_entry({"a": np.full(5, 3e30, np.float32), "i": np.arange(4)}) == ""
    assert nonfinite_reason({"b": big}, "refused here") == f"{NOT_FINITE} (entry 'b'): refused here"
    assert nonfinite_reason({"a": np.ones(2, np.float32)}, "refused here") == ""


def test_the_server_counts_a_nan_update_failed_with_its_reason_and_passes_finite_ones_untouched():
    logged: list[str] = []
    check = FiniteUpdates(logged.append)
    good = DeviceUpdate("d1", 1, 0, {"w": np.ones(3, np.float32)}, 1)
    assert check.checked(good) is good
    bad = DeviceUpdate("d2", 2, 0, {"w": np.array([1.0, np.nan, 0.0], np.float32)}, 1)
    refused = check.checked(bad)
    assert (refused.device, refused.selection_id, refused.base_version) == ("d2", 2, 0)
    assert refused.count == 0 and refused.diff is None
    assert refused.error.startswith(NOT_FINITE) and "refused by the server" in refused.error
    assert logged == [f"device d2 is counted failed: {refused.error}"]
    failed = DeviceUpdate("d3", 3, 0, None, 0, error="RuntimeError: boom")  # already failed: as it came
    assert check.checked(failed) is failed


def test_a_leaf_sum_holding_nan_refuses_every_one_of_its_devices_and_a_finite_sum_none():
    check = FiniteUpdates(lambda line: None)
    parts = [DeviceUpdate(d, 5, 1, {"w": np.ones(2, np.float32)}, 1) for d in ("a", "b", "c")]
    parts[1].diff = {"w": np.array([np.inf, 0.0], np.float32)}
    poisoned = SelectionSum.of(parts).device_updates()
    checked = [check.checked(u) for u in poisoned]
    assert [u.count for u in checked] == [0, 0, 0]
    assert all("its leaf's sum refused by the server" in u.error for u in checked)
    parts[1].diff = {"w": np.ones(2, np.float32)}
    fine = SelectionSum.of(parts).device_updates()
    assert [check.checked(u) is u for u in fine] == [True, True, True]


def _nan_run(tmp_path, sums: bool, poisoned: set[str] | None):
    """A scripted FedBuff (or, ``sums``, FedAvg with one sum per leaf and selection) run whose devices all train
    finite diffs but those in ``poisoned`` (None: every device), whose diffs hold NaN, sent as counted updates.
    Returns the assessor's outcome, the trace and the final global weights."""
    b, hole = (8, 8) if sums else (2, 1)

    def trained(device: str, sid: int, version: int, n: int) -> DeviceUpdate:
        bad = poisoned is None or device in poisoned
        return DeviceUpdate(
            device, sid, version, {"w": np.array([np.nan, 1.0, 0.0] if bad else [0.1, 0.2, 0.3], np.float32)}, 1
        )

    assessor, manager = run_answering(tmp_path, b, hole, 6, sums, trained)
    trace = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    return assessor.outcome, trace, manager.current_weights


@pytest.mark.parametrize("sums", [False, True], ids=["fedbuff", "fedavg-sums"])
def test_a_run_whose_every_update_is_nan_stops_naming_it_and_its_model_stays_finite(tmp_path, sums):
    outcome, trace, weights = _nan_run(tmp_path, sums, poisoned=None)
    assert outcome["status"] == "stopped" and outcome["version"] == 1, outcome
    assert NOT_FINITE in outcome["reason"] and "refused by the server" in outcome["reason"], outcome
    assert all(r.get("failed") and NOT_FINITE in r["error"] for r in trace)
    assert np.isfinite(weights["w"]).all()


def test_one_nan_device_is_counted_failed_while_the_others_make_every_version_finite(tmp_path):
    outcome, trace, weights = _nan_run(tmp_path, False, poisoned={"site-2#5"})
    assert outcome["status"] == "completed" and outcome["version"] == 6, outcome
    failed = [r for r in trace if r.get("failed")]
    assert failed and {r["device"] for r in failed} == {"site-2#5"}
    assert all("refused by the server" in r["error"] for r in failed)
    assert np.isfinite(weights["w"]).all() and weights["w"][0] > 0
