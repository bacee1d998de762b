"""Epsilon from the mechanism's inputs, and the noise for a target epsilon: Google's ``dp-accounting`` does the
accounting (its RDP and PLD accountants), never this project's own arithmetic.

A run's privacy loss is the composition of ``compositions`` Gaussian mechanisms of noise multiplier ``z`` (noise
standard deviation over the L2 sensitivity), each applied to a Poisson sample of the devices with probability
``q`` (``q = 1``: no sampling), under add-or-remove-one neighbouring: what ``metrics.json`` records as
``noise_multiplier``, ``sampling_probability``, ``compositions`` and ``delta``, so another library can recompute
``epsilon``. Which compositions and which ``q`` a method's run has is ``aggregation.server_privacy``'s business
(``docs/privacy.md``).

Speed: the RDP of ``T`` compositions is ``T`` times the RDP of one, exactly as ``RdpAccountant.compose(event, T)``
multiplies it, so ``Epsilons`` computes one composition's RDP once per run and each version's epsilon with the
library's own ``compute_epsilon`` (microseconds); the PLD accountant composes afresh for every ``T`` (about a
second). ``dp-accounting`` is the optional extra ``.[privacy]`` (also in ``.[test]``); it is imported when used.
"""

from __future__ import annotations

import logging
import math
from functools import lru_cache

from common.choices import ConfigError

INSTALL = "differential privacy needs Google's dp-accounting: pip install 'edgesim-flare[privacy]' (or dp-accounting)"
CALIBRATION_TOLERANCE = 1e-4  # noise multiplier units: a calibrated noise is at most this much above the optimum


def _library():
    """``dp_accounting``, or ``ConfigError`` saying how to install it. Its RDP accountant logs a warning through
    absl for every order it drops at large sampling probabilities: kept off the job's console."""
    try:
        import dp_accounting
    except ImportError as ex:
        raise ConfigError(INSTALL) from ex
    logging.getLogger("absl").setLevel(logging.ERROR)
    return dp_accounting


def check_installed() -> None:
    """``ConfigError`` naming the install command when ``dp-accounting`` is missing (before a run starts)."""
    _library()


def dp_event(noise_multiplier: float, sampling_probability: float, compositions: int):
    """The run's ``DpEvent``: ``compositions`` Gaussian mechanisms, each Poisson-sampled when ``q < 1``."""
    dpa = _library()
    one = dpa.GaussianDpEvent(noise_multiplier)
    if sampling_probability < 1:
        one = dpa.PoissonSampledDpEvent(sampling_probability, one)
    return dpa.SelfComposedDpEvent(one, compositions)


def make_accountant(name: str):
    """A fresh accountant: ``rdp`` (``RdpAccountant``) or ``pld`` (``PLDAccountant``), add-or-remove-one."""
    dpa = _library()
    if name == "rdp":
        return dpa.rdp.RdpAccountant()
    if name == "pld":
        return dpa.pld.PLDAccountant()
    raise ValueError(f"accountant {name!r}: use rdp or pld")


def epsilon(
    accountant: str, noise_multiplier: float, sampling_probability: float, compositions: int, delta: float
) -> float:
    """The epsilon of ``compositions`` sampled Gaussian mechanisms at ``delta`` (0 for none)."""
    if compositions <= 0:
        return 0.0
    event = dp_event(noise_multiplier, sampling_probability, compositions)
    return float(make_accountant(accountant).compose(event).get_epsilon(delta))


class Epsilons:
    """Epsilon after each number of compositions of one mechanism (fixed ``z``, ``q``, ``delta``), fast for RDP
    (see the module docstring). Args: accountant, noise_multiplier, sampling_probability, delta."""

    def __init__(self, accountant: str, noise_multiplier: float, sampling_probability: float, delta: float):
        self.accountant = accountant
        self.noise_multiplier = noise_multiplier
        self.sampling_probability = sampling_probability
        self.delta = delta
        self._one = None  # (orders, RDP of one composition)

    @lru_cache(maxsize=64)  # noqa: B019 - a few instances per process, each caching its own few values
    def __call__(self, compositions: int) -> float:
        if compositions <= 0:
            return 0.0
        if self.accountant != "rdp":
            return epsilon(self.accountant, self.noise_multiplier, self.sampling_probability, compositions, self.delta)
        if self._one is None:
            rdp = make_accountant("rdp").compose(dp_event(self.noise_multiplier, self.sampling_probability, 1))
            self._one = (rdp.orders, rdp.rdp)
        orders, one = self._one
        compute = _library().rdp.rdp_privacy_accountant.compute_epsilon
        return float(compute(orders, compositions * one, self.delta)[0])


_EPSILONS: dict[tuple, Epsilons] = {}


def with_epsilon(inputs: dict) -> dict:
    """A version's privacy record: the accountant's inputs (``aggregation.server_privacy.ServerPrivacy.inputs``)
    with the ``epsilon`` they spend at their ``delta``."""
    key = (inputs["accountant"], inputs["noise_multiplier"], inputs["sampling_probability"], inputs["delta"])
    found = _EPSILONS.get(key)
    if found is None:
        found = _EPSILONS[key] = Epsilons(*key)
    return inputs | {"epsilon": finite(round(found(inputs["compositions"]), 6))}


def noise_for_epsilon(
    accountant: str, sampling_probability: float, compositions: int, delta: float, target_epsilon: float
) -> float:
    """The smallest noise multiplier (to ``CALIBRATION_TOLERANCE``) whose ``compositions`` spend at most
    ``target_epsilon`` at ``delta`` (``dp_accounting.calibrate_dp_mechanism``); ``ConfigError`` when none can."""
    dpa = _library()
    if compositions <= 0:
        raise ConfigError("the planned run makes no model version, so there is no noise to compute: lengthen the run")
    calibration = dpa.mechanism_calibration
    try:
        found = calibration.calibrate_dp_mechanism(
            lambda: make_accountant(accountant),
            lambda z: dp_event(z, sampling_probability, compositions),
            target_epsilon,
            delta,
            calibration.LowerEndpointAndGuess(0.0, 1.0),
            tol=CALIBRATION_TOLERANCE,
        )
    except calibration.NoBracketIntervalFoundError as ex:
        raise ConfigError(
            f"--dp-target-epsilon {target_epsilon}: no noise multiplier meets it over {compositions} compositions "
            "at this delta; raise the target or --dp-delta, or shorten the run"
        ) from ex
    # the bracket's end is within the tolerance of the optimum, on either side: step up until the budget holds
    z = float(found)
    for _ in range(10):
        if epsilon(accountant, z, sampling_probability, compositions, delta) <= target_epsilon:
            return z
        z += CALIBRATION_TOLERANCE
    raise ConfigError(f"--dp-target-epsilon {target_epsilon}: the calibrated noise {z:.4f} does not meet it")


def update_noise_multiplier(noise_multiplier: float, count_noise_stddev: float) -> float:
    """Adaptive clipping's split of one Gaussian query (Andrew et al. 2021, section 3): the updates and the count
    of unclipped updates, centred (each device's bit minus 1/2, sensitivity 1/2), are released together; with
    noise ``count_noise_stddev`` on the count, the updates get noise multiplier ``(z^-2 - (2 sigma_b)^-2)^-1/2``
    so that the pair costs what one Gaussian of multiplier ``z`` costs. ``ValueError`` when ``z >= 2 sigma_b``
    (the count's noise alone would spend the budget)."""
    if not noise_multiplier < 2 * count_noise_stddev:
        raise ValueError(
            f"adaptive clipping: noise multiplier {noise_multiplier:.4g} needs the count's noise above "
            f"{noise_multiplier / 2:.4g} (it is {count_noise_stddev:.4g})"
        )
    return (noise_multiplier**-2 - (2 * count_noise_stddev) ** -2) ** -0.5


def finite(value: float) -> float | None:
    """``value``, or ``None`` for an infinite one (JSON has no infinity)."""
    return value if math.isfinite(value) else None
