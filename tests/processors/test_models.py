"""Models: the run's seed fixes the initial global weights (the server builds them from the class path)."""

import pytest
import torch

from processors.models import MODEL_CLASSES


@pytest.mark.parametrize("name", sorted(MODEL_CLASSES))
def test_initial_weights_depend_on_the_seed_only(name):
    cls = MODEL_CLASSES[name]
    torch.manual_seed(123)  # global RNG state must not matter
    a = cls(init_seed=7).state_dict()
    torch.rand(10)
    b = cls(init_seed=7).state_dict()
    c = cls(init_seed=8).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].dtype.is_floating_point)
