"""Differential privacy on the server: the aggregate's noise has the stated standard deviation (secure and seeded),
seeded noise is a function of the run's key and the version (a seeded run repeats it, a checkpoint continues it)
while secure noise never repeats, even within one configuration; it takes the largest clip norm of the aggregate's
updates; adaptive clipping moves the norm geometrically and sends it with the next version; an update a device did
not clip is clipped here; the accountant counts the busiest device's versions over the relation's sensitivity, and
nothing un-noised is published; the target epsilon stops a version that would exceed it; and only strategies that
say where the noise goes, and change nothing else of the aggregate above that, offer central DP."""

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


KEY = "a-runs-noise-key"


def settings(**kw) -> dict:
    base = {"dp": "central", "dp_noise_multiplier": 1.3, "dp_clip_norm": 0.7, "dp_noise": "seeded", "dp_noise_key": KEY}
    return PrivacyConfig(**(base | kw)).to_dict()


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


@pytest.mark.parametrize("source", ["seeded", "secure"])
def test_the_aggregates_noise_has_standard_deviation_noise_multiplier_times_clip_norm(source):
    model, ctx = dp_model(dp_noise=source, dp_noise_key=KEY if source == "seeded" else None)
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
    # replace-one: one device moves the sum by up to 2 C, so the accountant's multiplier is sigma / 2, unamplified
    assert inputs["noise_multiplier"] == 1.3 / 2 and inputs["sampling_probability"] == 1.0
    assert inputs["neighbouring"] == "replace-one" and inputs["sensitivity_clip_norms"] == 2.0
    assert inputs["compositions"] == inputs["busiest_device_participations"] == 1 and inputs["delta"] == 1e-5
    assert inputs["noise"] == source and "clipped_fraction" not in inputs and "server_clipped" not in inputs


def test_seeded_noise_repeats_bit_for_bit_and_differs_by_key_and_version_and_secure_noise_never_repeats():
    def run(key: str | None) -> list[np.ndarray]:
        model, ctx = dp_model(dp_noise_key=key) if key else dp_model(dp_noise="secure")
        model.start({"w": np.zeros(1000, np.float32)}, 1, ctx)
        out = []
        for v in range(2):
            one_version(model, ctx, ["a#0", "a#1", "a#2", "a#3"], base=1 + v, size=1000)
            out.append(model.current_weights["w"].copy())
        return out

    first, again, other = run(KEY), run(KEY), run("another-runs-key")
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[0], other[0])
    assert not np.allclose(first[1] - first[0], first[0])  # version 3's noise is not version 2's
    secure, secure_again = run(None), run(None)  # one configuration, twice: fresh entropy each time
    assert not np.array_equal(secure[0], secure_again[0]) and not np.array_equal(secure[0], first[0])


def test_a_checkpoint_mid_aggregate_continues_the_same_noise_counts_and_clip_norms():
    def start():
        model, ctx = dp_model(dp_adaptive_clipping=True, dp_count_noise=1.0)
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
    count_noise = np.random.default_rng(stable_seed("dp", KEY, "count", 2)).normal(0.0, 4.0)
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
    model, ctx = dp_model(b=3)
    model.start({"w": np.zeros(10, np.float32)}, 1, ctx)
    diff = {"w": np.zeros(10, np.float32), DEVICE_EXTRA_PREFIX + UNCLIPPED: np.float32(2)}  # 2 of 3 unclipped
    group = SelectionSum(7, 1, {f"a#{i}": 1 for i in range(3)}, diff, 3)
    for i in range(3):
        model.add_update(DeviceUpdate(f"a#{i}", 7, 1, None, group=group), 0, ctx)
    model.make_version(model.current_version + 1, 1.0, ctx)
    inputs = ctx.get_prop(PRIVACY)
    assert inputs["compositions"] == 1 and inputs["sampling_probability"] == 1.0
    assert model._privacy._last == {} and "clipped_fraction" not in inputs  # the exact count is never published


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


class ExtrasFromTheSum(BufferedMean):
    """Sends every device the un-noised sum of the last aggregate (as a control variate might)."""

    def device_extras(self, model) -> dict:
        return {"last_sum": np.zeros(1, np.float32)}


class ReweighsUpdates(BufferedMean):
    def weight_of(self, update) -> float:
        return 2.0 * update.count


def test_a_subclass_that_changes_the_aggregate_or_its_extras_without_its_own_noise_is_refused():
    assert not offers_central_dp(ExtrasFromTheSum) and not offers_central_dp(ReweighsUpdates)

    class ExtrasAndNoise(ExtrasFromTheSum):
        def add_noise(self, noise, model) -> None:
            super().add_noise(noise, model)

    assert offers_central_dp(ExtrasAndNoise)  # its author says how the noise goes in


def test_a_target_epsilon_stops_the_version_that_would_exceed_it_and_releases_nothing_of_it():
    from common.privacy import BudgetSpent
    from common.privacy_accounting import epsilon

    target = 3.0
    model, ctx = dp_model(b=2, dp_noise_multiplier=6.0, dp_target_epsilon=target)
    model.start({"w": np.zeros(10, np.float32)}, 1, ctx)
    made = 0
    with pytest.raises(BudgetSpent, match="above --dp-target-epsilon 3"):
        for _ in range(20):  # a#0 goes into every version: the busiest device
            before = model.current_weights["w"].copy()
            one_version(model, ctx, ["a#0", f"b#{made}"], base=model.current_version, size=10)
            made += 1
    assert model.current_version == made + 1 and np.array_equal(model.current_weights["w"], before)
    spent = ctx.get_prop(PRIVACY)["compositions"]
    assert spent == made > 1
    # dp-accounting directly: the versions made fit the target, one more would not (replace-one: sigma / 2)
    assert epsilon("rdp", 3.0, 1.0, made, 1e-5) <= target < epsilon("rdp", 3.0, 1.0, made + 1, 1e-5)


def test_the_two_sigma_attack_recovers_no_sum_from_runs_of_one_seed():
    """A sweep over sigma at one seed releases S + s1 g1 and S + s2 g2. Were g1 = g2 (noise from the public seed),
    (s2 o1 - s1 o2) / (s2 - s1) would be S exactly. With each run's own noise (secure, or seeded by the whole
    command's key) that estimate misses S by more than the noise's own scale."""
    from jobs.api import make_config
    from jobs.privacy import noise_key

    size, clip, b, lr = 20_000, 0.5, 4, 1.0
    rng = np.random.default_rng(0)
    updates = [rng.standard_normal(size).astype(np.float32) for _ in range(b)]
    updates = [u * np.float32(clip / np.linalg.norm(u)) for u in updates]  # clipped: norm C each
    true_sum = np.sum(updates, axis=0, dtype=np.float64)

    def released(sigma: float, source: str) -> np.ndarray:
        flags = dict(dp="central", dp_clip_norm=clip, dp_noise_multiplier=sigma, dp_noise=source, seed=3)
        cfg = make_config("fedbuff", **flags)
        key = noise_key(cfg) if source == "seeded" else None
        model, ctx = dp_model(seed=3, b=b, lr=lr, dp_noise_multiplier=sigma, dp_clip_norm=clip, dp_noise=source)
        model._privacy.source.key = key  # the key the driver derives for this command (None: secure)
        model.start({"w": np.zeros(size, np.float32)}, 1, ctx)
        for i, u in enumerate(updates):
            model.add_update(DeviceUpdate(f"a#{i}", 1, 1, {"w": u, DEVICE_EXTRA_PREFIX + UNCLIPPED: 1.0}), 0, ctx)
        model.make_version(2, 1.0, ctx)
        return model.current_weights["w"].astype(np.float64) * b / lr  # S + noise

    s1, s2 = 1.0, 2.0
    for source in ("seeded", "secure"):
        o1, o2 = released(s1, source), released(s2, source)
        estimate = (s2 * o1 - s1 * o2) / (s2 - s1)
        error = np.std(estimate - true_sum)
        assert error >= s1 * clip, (source, error)  # at least the smaller run's noise scale: nothing recovered


def test_noise_drawn_ahead_is_the_noise_drawn_at_once_and_belongs_to_its_version_only():
    """The next version's noise is drawn while its devices train (``draw_ahead``): the versions a seeded run
    makes are those of noise drawn at once, the draw ahead is taken by its own version only, and secure noise
    drawn ahead is used once (two versions never share it)."""
    from common.dp_noise import GaussianNoise

    shapes = [(3, 5), (7,)]
    fresh = GaussianNoise("seeded", KEY).arrays(shapes, 0.9, "server", 2)
    ahead = GaussianNoise("seeded", KEY)
    ahead.draw_ahead(shapes, "server", 2)
    assert all(np.array_equal(a, b) for a, b in zip(ahead.arrays(shapes, 0.9, "server", 2), fresh, strict=True))
    ahead.draw_ahead(shapes, "server", 3)  # not version 4's: version 4 draws its own, and 3's waits for it
    four = ahead.arrays(shapes, 0.9, "server", 4)
    assert np.array_equal(four[0], GaussianNoise("seeded", KEY).arrays(shapes, 0.9, "server", 4)[0])
    three = GaussianNoise("seeded", KEY).arrays(shapes, 0.9, "server", 3)
    assert np.array_equal(ahead.arrays(shapes, 0.9, "server", 3)[1], three[1])

    secure = GaussianNoise("secure")
    secure.draw_ahead([(50_000,)], "server", 2)
    first = secure.arrays([(50_000,)], 2.0, "server", 2)[0]
    second = secure.arrays([(50_000,)], 2.0, "server", 2)[0]  # the same labels again: a fresh draw
    assert not np.array_equal(first, second)
    assert abs(first.std() / 2.0 - 1) < 0.03 and abs(second.std() / 2.0 - 1) < 0.03

    # a seeded run with its noise drawn ahead makes the versions of one that draws each version's noise at once
    def versions(draw_ahead: bool) -> list[np.ndarray]:
        model, ctx = dp_model()
        if not draw_ahead:
            model._privacy.source.draw_ahead = lambda *a: None
        model.start({"w": np.zeros(1000, np.float32)}, 1, ctx)
        out = []
        for v in range(3):
            one_version(model, ctx, ["a#0", "a#1", "a#2", "a#3"], base=1 + v, size=1000)
            out.append(model.current_weights["w"].copy())
        return out

    assert all(np.array_equal(a, b) for a, b in zip(versions(True), versions(False), strict=True))
