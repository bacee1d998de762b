"""Differential privacy on the server: the aggregate's noise has the stated standard deviation (a statistical test
with a fixed seed), is seeded by the run and the version (a seeded run repeats it, a checkpoint continues it),
takes the largest clip norm of the aggregate's updates; adaptive clipping moves the norm geometrically and sends it
with the next version; an update a device did not clip is clipped here; the accountant's counts follow the
sampling assumption; and only strategies that say where the noise goes offer central DP."""

from __future__ import annotations

import math

import numpy as np
import pytest
from nvflare.apis.event_type import EventType

from aggregation.buffered_mean import BufferedMean
from aggregation.fedrevive_strategy import FedReviveStrategy
from aggregation.global_model import GlobalModel
from aggregation.server_privacy import ServerPrivacy
from aggregation.strategy import ServerStrategy, offers_central_dp
from common.packed_weights import unpack
from common.privacy import CLIP_NORM, UNCLIPPED, PrivacyConfig
from common.protocol import DEVICE_EXTRA_PREFIX, PRIVACY, DeviceUpdate, SelectionSum
from common.seeds import stable_seed
from tests.aggregation.test_strategy import StalenessWeightedMean
from tests.fakes.engine import EventEngine

SIZE = 200_000


def settings(**kw) -> dict:
    return PrivacyConfig(**({"dp": "central", "dp_noise_multiplier": 1.3, "dp_clip_norm": 0.7} | kw)).to_dict()


def dp_model(seed: int = 4, b: int = 4, pool: int = 40, lr: float = 0.5, **kw) -> tuple[GlobalModel, object]:
    privacy = {"settings": settings(**kw), "pool_size": pool, "updates_per_version": b}
    model = GlobalModel("aggregation.buffered_mean:BufferedMean", {"global_lr": lr}, seed=seed, privacy=privacy)
    engine = EventEngine({"model": model})
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    return model, ctx


def update(device: str, base: int = 1, value: float = 0.0, unclipped: float = 1.0, size: int = SIZE) -> DeviceUpdate:
    diff = {"w": np.full(size, value, np.float32), DEVICE_EXTRA_PREFIX + UNCLIPPED: np.float32(unclipped)}
    return DeviceUpdate(device, 1, base, diff)


def one_version(model: GlobalModel, ctx, devices: list[str], base: int = 1, size: int = SIZE) -> None:
    for d in devices:
        model.add_update(update(d, base, size=size), 0, ctx)
    model.make_version(model.current_version + 1, 1.0, ctx)


def test_the_aggregates_noise_has_standard_deviation_noise_multiplier_times_clip_norm():
    model, ctx = dp_model()
    model.start({"w": np.zeros(SIZE, np.float32)}, 1, ctx)
    one_version(model, ctx, ["a#0", "a#1", "a#2", "a#3"])
    # zero updates: the version moved by global_lr x noise / B alone, the noise's deviation 1.3 x 0.7
    noise = model.current_weights["w"].astype(np.float64) / (0.5 / 4)
    stddev = 1.3 * 0.7
    n = noise.size
    assert abs(noise.std() / stddev - 1) < 6 / math.sqrt(2 * n)  # six standard errors of a sample deviation
    assert abs(noise.mean()) < 6 * stddev / math.sqrt(n)
    assert abs(np.mean(np.abs(noise) < stddev) - 0.682689) < 0.005  # Gaussian, not merely of that variance
    inputs = ctx.get_prop(PRIVACY)
    assert inputs["noise_multiplier"] == 1.3 and inputs["sampling_probability"] == 4 / 40
    assert inputs["compositions"] == 1 and inputs["clipped_fraction"] == 0.0 and inputs["delta"] == 1e-5


def test_seeded_noise_repeats_bit_for_bit_and_differs_by_seed_and_version():
    def run(seed: int) -> list[np.ndarray]:
        model, ctx = dp_model(seed=seed)
        model.start({"w": np.zeros(1000, np.float32)}, 1, ctx)
        out = []
        for v in range(2):
            one_version(model, ctx, ["a#0", "a#1", "a#2", "a#3"], base=1 + v, size=1000)
            out.append(model.current_weights["w"].copy())
        return out

    first, again, other = run(4), run(4), run(5)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[0], other[0])
    assert not np.allclose(first[1] - first[0], first[0])  # version 3's noise is not version 2's


def test_a_checkpoint_mid_aggregate_continues_the_same_noise_counts_and_clip_norms():
    def start():
        model, ctx = dp_model(dp_adaptive_clipping=True, dp_count_noise=1.0, dp_sampling="participation")
        model.start({"w": np.zeros(1000, np.float32)}, 1, ctx)
        return model, ctx

    whole, ctx = start()
    for d in ("a#0", "a#1"):
        whole.add_update(update(d, size=1000), 0, ctx)
    again, ctx2 = start()
    again.load_state_dict(whole.state_dict(), ctx2)
    for model, c in ((whole, ctx), (again, ctx2)):
        for d in ("a#2", "a#3"):
            model.add_update(update(d, size=1000, unclipped=0.0), 0, c)
        model.make_version(model.current_version + 1, 1.0, c)
        one_version(model, c, ["a#0", "a#4", "a#5", "a#6"], base=2, size=1000)
    assert np.array_equal(again.current_weights["w"], whole.current_weights["w"])
    assert ctx2.get_prop(PRIVACY) == ctx.get_prop(PRIVACY)
    assert ctx.get_prop(PRIVACY)["compositions"] == 2  # a#0 went into both versions


def test_the_aggregates_bound_is_the_largest_clip_norm_among_its_updates():
    privacy = ServerPrivacy(settings(dp_adaptive_clipping=True, dp_count_noise=1.0), 0, 40, 2)
    privacy.start(1)
    privacy.clip_norms[2] = 0.1  # version 2's devices clip to a smaller norm
    zero = {"w": np.zeros(4, np.float32)}
    privacy.take(zero, {UNCLIPPED: np.float32(1)}, 1, 2, frozenset())
    privacy.take(zero, {UNCLIPPED: np.float32(1)}, 1, 1, frozenset())  # a stale update, clipped to 0.7
    assert privacy._open["bound"] == 0.7
    assert privacy.update_multiplier == pytest.approx((1.3**-2 - (2 * 2.0) ** -2) ** -0.5)


def test_adaptive_clipping_moves_the_norm_geometrically_and_sends_it_with_the_next_version():
    model, ctx = dp_model(dp_adaptive_clipping=True, dp_count_noise=1.0, dp_target_quantile=0.25, b=4)
    model.start({"w": np.zeros(10, np.float32)}, 1, ctx)
    assert float(unpack(model.model_packed(1))[DEVICE_EXTRA_PREFIX + CLIP_NORM][0]) == pytest.approx(0.7)
    one_version(model, ctx, ["a#0", "a#1", "a#2", "a#3"], size=10)  # all four within the norm
    count_noise = np.random.default_rng(stable_seed("dp-count-noise", 4, 2)).normal(0.0, 4.0)
    noised = (4 + count_noise) / 4
    expected = 0.7 * math.exp(-0.2 * (noised - 0.25))
    inputs = ctx.get_prop(PRIVACY)
    assert inputs["clip_norm"] == pytest.approx(expected) and inputs["noised_unclipped_fraction"] == pytest.approx(
        noised
    )
    assert float(unpack(model.model_packed(2))[DEVICE_EXTRA_PREFIX + CLIP_NORM][0]) == pytest.approx(expected, rel=1e-6)


def test_an_update_a_device_did_not_clip_is_clipped_on_the_server():
    privacy = ServerPrivacy(settings(), 0, 40, 2)
    privacy.start(1)
    diff = {"w": np.full(4, 5.0, np.float32), "stat": np.ones(2, np.float32)}
    clipped = privacy.take(diff, {}, 1, 1, frozenset({"stat"}))
    assert np.linalg.norm(clipped["w"]) == pytest.approx(0.7, rel=1e-6) and not clipped["stat"].any()
    assert privacy.server_clipped == 1
    within = {"w": np.full(4, 0.1, np.float32), "stat": np.zeros(2, np.float32)}
    assert privacy.take(within, {}, 1, 1, frozenset({"stat"})) is within


def test_a_leaf_sum_counts_each_device_and_its_unclipped_bits():
    model, ctx = dp_model(b=3, dp_sampling="participation")
    model.start({"w": np.zeros(10, np.float32)}, 1, ctx)
    diff = {"w": np.zeros(10, np.float32), DEVICE_EXTRA_PREFIX + UNCLIPPED: np.float32(2)}  # 2 of 3 unclipped
    group = SelectionSum(7, 1, {f"a#{i}": 1 for i in range(3)}, diff, 3)
    for i in range(3):
        model.add_update(DeviceUpdate(f"a#{i}", 7, 1, None, group=group), 0, ctx)
    model.make_version(model.current_version + 1, 1.0, ctx)
    inputs = ctx.get_prop(PRIVACY)
    assert inputs["clipped_fraction"] == pytest.approx(1 / 3) and inputs["compositions"] == 1
    assert inputs["sampling_probability"] == 1.0


def test_local_dp_adds_no_server_noise_and_counts_each_devices_updates():
    privacy = {"settings": settings(dp="local", dp_noise_multiplier=2.0), "pool_size": 40, "updates_per_version": 2}
    model = GlobalModel("aggregation.buffered_mean:BufferedMean", {"global_lr": 1.0}, privacy=privacy)
    engine = EventEngine({"model": model})
    ctx = engine.new_context()
    engine.fire_event(EventType.START_RUN, ctx)
    model.start({"w": np.zeros(3, np.float32)}, 1, ctx)
    for devices in (["a#0", "a#1"], ["a#0", "a#2"], ["a#0", "a#1"]):
        for d in devices:
            model.add_update(DeviceUpdate(d, 1, 1, {"w": np.ones(3, np.float32)}), 0, ctx)
        model.make_version(model.current_version + 1, 1.0, ctx)
    assert np.array_equal(model.current_weights["w"], np.full(3, 3.0, np.float32))  # the mean only, no noise
    inputs = ctx.get_prop(PRIVACY)
    assert inputs["compositions"] == 3 and inputs["noise_multiplier"] == 1.0 and inputs["sampling_probability"] == 1


class OnlyStatus(BufferedMean):
    def status(self, model) -> str:
        return "same aggregation"


class OwnNoise(StalenessWeightedMean):
    def add_noise(self, noise, model) -> None:
        self._sum = {k: self._sum[k] + noise[k] for k in self._sum}


def test_only_a_strategy_that_says_where_the_noise_goes_offers_central_dp():
    from examples.fednova import FedNovaStrategy

    assert offers_central_dp(BufferedMean) and offers_central_dp(OnlyStatus) and offers_central_dp(OwnNoise)
    assert not offers_central_dp(StalenessWeightedMean)  # no add_noise at all
    assert not offers_central_dp(FedReviveStrategy)  # it changes add_update below BufferedMean's add_noise
    assert not offers_central_dp(FedNovaStrategy)
    with pytest.raises(NotImplementedError, match="does not take"):
        ServerStrategy.add_noise(StalenessWeightedMean(), {}, None)
