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


class NoSeedNet(torch.nn.Module):  # a user's class: no init_seed keyword
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)


class IgnoresSeedNet(torch.nn.Module):  # takes init_seed, draws from torch's global generator anyway
    def __init__(self, init_seed=None):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)


def test_a_users_model_that_takes_init_seed_but_ignores_it_still_starts_from_the_seeds_weights():
    from processors.models import SeededModel, initial_model, initial_model_config

    name = f"{__name__}:IgnoresSeedNet"
    config = initial_model_config(name, seed=5)
    first = initial_model(name, 5)
    torch.rand(100)  # whatever ran before in the process
    again = SeededModel(**config["args"])  # as NVFlare's persistor builds it
    assert type(again) is IgnoresSeedNet and torch.equal(first.fc.weight, again.fc.weight)
    assert not torch.equal(first.fc.weight, initial_model(name, 6).fc.weight)


def test_a_users_model_without_init_seed_starts_from_the_same_weights_in_every_run():
    from processors.models import SeededModel, initial_model, initial_model_config

    name = f"{__name__}:NoSeedNet"
    config = initial_model_config(name, seed=5)
    assert config["path"] == "processors.models.SeededModel" and config["args"] == {"model": name, "init_seed": 5}
    first = initial_model(name, 5)
    torch.rand(100)  # whatever ran before in the process
    built_like_nvflare = SeededModel(**config["args"])
    assert type(built_like_nvflare) is NoSeedNet  # the user's own class and state-dict keys
    assert torch.equal(first.fc.weight, built_like_nvflare.fc.weight)
    assert not torch.equal(first.fc.weight, initial_model(name, 6).fc.weight)
    assert initial_model_config("cifar10_convnet", 5)["args"] == {"init_seed": 5}
