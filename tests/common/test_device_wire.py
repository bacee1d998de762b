"""What crosses the routing proxy is JSON, and the leaf turns it back into the arrays it sent."""

from __future__ import annotations

import json

import numpy as np
import pytest

from common.device_wire import diff_problem, from_wire, to_wire


def test_weights_survive_json_with_their_shapes_and_float32_values():
    rng = np.random.default_rng(0)
    weights = {
        "conv.w": rng.normal(size=(32, 16)).astype(np.float32),
        "b": np.float32(3.5) * np.ones(()),
        "v": rng.normal(size=7).astype(np.float32),
    }
    back = from_wire(json.loads(json.dumps(to_wire(weights))))
    assert set(back) == set(weights)
    for k, v in weights.items():
        assert back[k].dtype == np.float32 and back[k].shape == np.shape(v)
        np.testing.assert_array_equal(back[k], v)  # float32 -> Python float -> float32 is exact


def test_a_result_that_is_not_numbers_is_refused_by_name():
    with pytest.raises(ValueError, match="entry 'w'"):
        from_wire({"w": [{"a": 1}]})


def test_a_diff_that_does_not_fit_its_model_is_named_and_a_fitting_one_passes():
    weights = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32), "edgesim_extra/anchor": np.zeros(1)}
    good = {"w": np.ones((2, 3), np.float32), "b": np.ones(3, np.float32), "edgesim_extra/label_counts": np.ones(10)}
    assert diff_problem(good, weights) == ""
    assert "missing ['b']" in diff_problem({"w": good["w"]}, weights)
    assert "unknown ['x']" in diff_problem(good | {"x": np.ones(1, np.float32)}, weights)
    assert "shape (3, 2)" in diff_problem(good | {"w": np.ones((3, 2), np.float32)}, weights)
    assert "'b' is not finite" in diff_problem(good | {"b": np.array([1, np.nan, 0], np.float32)}, weights)
