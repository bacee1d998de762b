"""Our epsilon equals what Google's dp-accounting computes directly (events built here, independently of our code
path) and what pfl-research's accountants compute (skipped without pfl), to 1e-3 relative, for RDP and PLD; the
noise computed for a target epsilon meets it and is the smallest that does; adaptive clipping's split of the noise
follows Andrew et al."""

from __future__ import annotations

import importlib.util

import pytest

from common.choices import ConfigError
from common.privacy_accounting import (
    CALIBRATION_TOLERANCE,
    Epsilons,
    epsilon,
    noise_for_epsilon,
    update_noise_multiplier,
    with_epsilon,
)

# dp-accounting (and the SciPy it imports) takes seconds to import: looked for here, imported by the tests that
# use it, so a worker that runs none of them never pays for it
pytestmark = pytest.mark.skipif(importlib.util.find_spec("dp_accounting") is None, reason="needs dp-accounting")

CASES = [  # noise multiplier, sampling probability, compositions, delta
    (1.1, 0.01, 500, 1e-5),
    (0.8, 0.25, 40, 1e-5),
    (2.0, 1.0, 7, 1e-6),
    (0.6, 0.004, 3000, 1e-5),
]


def library_epsilon(accountant: str, z: float, q: float, t: int, delta: float) -> float:
    """The library on its own: the event built from its own classes, a fresh accountant, no code of ours."""
    import dp_accounting

    event = dp_accounting.GaussianDpEvent(z)
    if q < 1:
        event = dp_accounting.PoissonSampledDpEvent(q, event)
    fresh = dp_accounting.rdp.RdpAccountant() if accountant == "rdp" else dp_accounting.pld.PLDAccountant()
    return fresh.compose(event, t).get_epsilon(delta)


# the PLD accountant takes seconds per sampled case: two cases, in the slow (full) suite
PAIRS = [("rdp", *case) for case in CASES] + [pytest.param("pld", *c, marks=pytest.mark.slow) for c in CASES[1:3]]


@pytest.mark.parametrize("accountant, z, q, t, delta", PAIRS)
def test_our_epsilon_equals_dp_accountings_computed_directly(accountant, z, q, t, delta):
    want = library_epsilon(accountant, z, q, t, delta)
    assert epsilon(accountant, z, q, t, delta) == pytest.approx(want, rel=1e-3)  # the planner's
    # the record the evaluator writes (``Epsilons``: for RDP, one composition's RDP times t)
    record = {"accountant": accountant, "noise_multiplier": z, "sampling_probability": q, "compositions": t}
    assert with_epsilon(record | {"delta": delta})["epsilon"] == pytest.approx(want, rel=1e-3)


@pytest.mark.parametrize(
    "accountant, z, q, t, delta",
    [("rdp", *CASES[0]), ("rdp", *CASES[1]), pytest.param("pld", *CASES[0], marks=pytest.mark.slow)],
)
def test_our_epsilon_equals_pfl_researchs_accountants(accountant, z, q, t, delta):
    pfl = pytest.importorskip("pfl.privacy.privacy_accountant")  # pfl==0.6.0: the peers extra
    theirs = pfl.RDPPrivacyAccountant if accountant == "rdp" else pfl.PLDPrivacyAccountant
    found = theirs(num_compositions=t, sampling_probability=q, mechanism="gaussian", noise_parameter=z, delta=delta)
    assert epsilon(accountant, z, q, t, delta) == pytest.approx(found.epsilon, rel=1e-3)


def test_no_composition_spends_nothing():
    assert epsilon("rdp", 1.0, 0.1, 0, 1e-5) == 0.0 and Epsilons("pld", 1.0, 0.1, 1e-5)(0) == 0.0


@pytest.mark.parametrize("accountant", ["rdp", pytest.param("pld", marks=pytest.mark.slow)])
def test_the_noise_for_a_target_epsilon_meets_it_and_is_the_smallest_that_does(accountant):
    q, t, delta, target = 0.05, 200, 1e-5, 4.0
    z = noise_for_epsilon(accountant, q, t, delta, target)
    assert library_epsilon(accountant, z, q, t, delta) <= target
    assert library_epsilon(accountant, z - 3 * CALIBRATION_TOLERANCE, q, t, delta) > target * (1 - 1e-4)


def test_a_run_without_compositions_has_no_noise_to_compute():
    with pytest.raises(ConfigError, match="makes no model version"):
        noise_for_epsilon("rdp", 0.1, 0, 1e-5, 8.0)


def test_adaptive_clipping_leaves_the_updates_the_budget_the_count_does_not_spend():
    # Andrew et al. 2021: z_update = (z^-2 - (2 sigma_b)^-2)^-1/2
    assert update_noise_multiplier(1.0, 5.0) == pytest.approx((1 - 0.01) ** -0.5)
    with pytest.raises(ValueError, match="needs the count's noise above 0.5"):
        update_noise_multiplier(1.0, 0.5)
