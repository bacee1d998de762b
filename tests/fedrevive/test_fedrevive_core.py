"""FedRevive core: staleness weights, blending, KD, proportion probing and the distiller's phases (CPU, small)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedrevive import FedReviveConfig, FedReviveDistiller, beta, blend_update, kd_step
from fedrevive.augment import crop_and_flip
from fedrevive.feature_stats import FeatureStats, record_reference
from fedrevive.synthesis import Synthesizer, SyntheticPool, per_sample_kl
from fedrevive.teachers import ProportionEstimator, TeacherBuffer
from processors.data.sources import make_synthetic, normalize
from processors.models.cifar10_convnet import Cifar10ConvNet
from processors.models.resnet18 import CifarResNet18, TrackedResNet18

DOMINANT = 3
CPU = torch.device("cpu")


def weights_of(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.named_parameters()}


def small_cfg(**overrides) -> FedReviveConfig:
    base = dict(
        s_max=2.0,
        teacher_buffer_size=2,
        kd_iters=2,
        synth_per_teacher=4,
        synth_batch_size=4,
        synth_every_versions=1,
        gen_noise_dim=16,
        gen_width=8,
        pool_size=64,
        probe_samples=32,
        distill_from_version=2,
        kd_train_from_version=4,
        class_proportions="estimate",  # these tests give no label histograms
    )
    base.update(overrides)
    return FedReviveConfig(**base)


@pytest.fixture(scope="module")
def skewed_model() -> Cifar10ConvNet:
    """A Cifar10ConvNet trained briefly on synthetic data that is ~90% one class."""
    torch.manual_seed(0)
    data = make_synthetic(3000, 100, seed=0)
    keep = (data.y_train == DOMINANT).nonzero().flatten()
    for c in range(10):
        if c != DOMINANT:
            keep = torch.cat([keep, (data.y_train == c).nonzero().flatten()[:4]])
    x, y = normalize(data.x_train[keep]), data.y_train[keep]
    model = Cifar10ConvNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        perm = torch.randperm(len(y))
        for start in range(0, len(y), 64):
            idx = perm[start : start + 64]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


def test_beta_is_zero_half_one_at_tau_0_smax_and_twice_smax():
    assert beta(0, 75) == 0.0
    assert math.isclose(beta(75, 75), 0.5, abs_tol=1e-12)
    assert beta(150, 75) == 1.0
    assert 0.0 < beta(30, 75) < 0.5 < beta(100, 75) < 1.0


def test_beta_is_clipped_to_one_beyond_twice_smax():
    for tau in (151, 200, 300, 10_000):
        assert beta(tau, 75) == 1.0


def test_blend_with_beta_zero_returns_delta():
    rng = np.random.default_rng(0)
    delta = {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=4).astype(np.float32)}
    delta_kd = {k: v + 1.0 for k, v in delta.items()}
    for out in (blend_update(delta, delta_kd, 0.0), blend_update(delta, None, 0.7)):
        assert out.keys() == delta.keys()
        for k in delta:
            np.testing.assert_array_equal(out[k], delta[k])
            assert out[k] is not delta[k]
    half = blend_update(delta, {"w": delta_kd["w"]}, 0.5)
    np.testing.assert_allclose(half["w"], delta["w"] + 0.5, rtol=1e-6)
    np.testing.assert_array_equal(half["b"], delta["b"])  # absent from delta_kd: kept as the client sent it


def test_kd_step_lowers_student_teacher_kl(skewed_model):
    buffer = TeacherBuffer(2, Cifar10ConvNet, CPU)
    noise = torch.randn(16, 3, 32, 32)
    buffer.add("a", weights_of(skewed_model), noise)
    torch.manual_seed(1)
    student = Cifar10ConvNet()
    images = torch.randn(32, 3, 32, 32)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-3)
    (teacher,) = list(buffer)
    before = kd_step(student, [(teacher, images)], optimizer, 1.0)
    with torch.no_grad():
        after = per_sample_kl(skewed_model(images), student(images), 1.0).mean().item()
    assert after < before


def test_proportion_estimator_recovers_skewed_clients_dominant_class(skewed_model):
    estimator = ProportionEstimator(10, temperature=0.8)
    noise = torch.randn(256, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    estimator.observe("skewed", skewed_model, noise)
    props = estimator.proportions("skewed")
    assert props.shape == (10,) and math.isclose(props.sum(), 1.0, rel_tol=1e-9)
    assert int(np.argmax(props)) == DOMINANT
    # Only the first two uploads count; later ones leave the estimate alone.
    estimator.observe("skewed", Cifar10ConvNet(), noise)
    estimator.observe("skewed", Cifar10ConvNet(), noise)
    assert estimator._counts["skewed"] == 2


def test_process_update_before_distill_from_version_returns_delta_unchanged():
    torch.manual_seed(0)
    distiller = FedReviveDistiller(small_cfg(), Cifar10ConvNet, CPU, seed=0)
    global_weights = weights_of(Cifar10ConvNet())
    distiller.observe_client_model("c0", weights_of(Cifar10ConvNet()))
    delta = {k: np.full_like(v, 0.01) for k, v in global_weights.items()}
    out, info = distiller.process_update(global_weights, delta, "c0", base_version=0, current_version=1)
    assert info["phase"] == "warm-up" and info["beta"] == 0.0 and info["kd_seconds"] == 0.0
    for k in delta:
        np.testing.assert_array_equal(out[k], delta[k])


@pytest.mark.parametrize("blend", ["zero", "pass"])
def test_generator_warm_up_phase_fills_pool_and_blends_a_zero_distilled_update(blend):
    """Between the two warm-ups no student is trained; as both references do ("zero"), a stale update becomes
    (1 - beta) * delta (its statistics stay the client's); "pass" keeps it whole."""
    torch.manual_seed(0)
    distiller = FedReviveDistiller(small_cfg(warmup_blend=blend), Cifar10ConvNet, CPU, seed=0)
    global_weights = weights_of(Cifar10ConvNet())
    distiller.observe_client_model("c0", weights_of(Cifar10ConvNet()))
    delta = {k: np.full_like(v, 0.01) for k, v in global_weights.items()}
    delta["track1.running_var"] = np.full(6, 0.5, np.float32)  # a statistic: the client's, never blended
    gen_before = [p.detach().clone() for p in distiller.synthesizer.generator.parameters()]
    out, info = distiller.process_update(global_weights, delta, "c0", base_version=0, current_version=3)
    b = 1 - 0.5 * (1 + math.cos(math.pi * 3 / 4))  # beta(tau 3), s_max 2
    assert info["phase"] == "generator-warm-up" and info["beta"] == pytest.approx(b if blend == "zero" else 0.0)
    assert len(distiller.synthesizer.pool) == 4  # synth_batch_size
    moved = any(
        not torch.equal(a, b) for a, b in zip(gen_before, distiller.synthesizer.generator.parameters(), strict=True)
    )
    assert moved  # the meta-Adam's Reptile step moved the persistent generator
    np.testing.assert_array_equal(out["track1.running_var"], delta["track1.running_var"])
    for k in global_weights:
        np.testing.assert_allclose(out[k], delta[k] * ((1 - b) if blend == "zero" else 1.0), rtol=1e-6)
    fresh, info = distiller.process_update(global_weights, delta, "c0", base_version=3, current_version=3)
    assert info["beta"] == 0.0 and all(np.array_equal(fresh[k], delta[k]) for k in delta)  # tau 0: unchanged


def test_true_class_proportions_are_the_reported_label_histogram_and_required():
    distiller = FedReviveDistiller(small_cfg(class_proportions="true"), Cifar10ConvNet, CPU, seed=0)
    counts = np.zeros(10, np.float32)
    counts[[2, 7]] = [30, 10]
    distiller.observe_client_model("c0", weights_of(Cifar10ConvNet()), counts)
    distiller.observe_client_model("c0", weights_of(Cifar10ConvNet()), np.ones(10, np.float32))  # the first stays
    np.testing.assert_allclose(distiller.estimator.proportions("c0"), counts / 40)
    with pytest.raises(ValueError, match="--fr-class-proportions estimate"):
        distiller.observe_client_model("c1", weights_of(Cifar10ConvNet()))


def test_process_update_after_kd_train_from_version_blends_distilled_update(skewed_model):
    torch.manual_seed(0)
    distiller = FedReviveDistiller(small_cfg(), Cifar10ConvNet, CPU, seed=0)
    distiller.observe_client_model("skewed", weights_of(skewed_model))
    distiller.observe_client_model("other", weights_of(Cifar10ConvNet()))
    global_weights = weights_of(Cifar10ConvNet())
    delta = {k: np.full_like(v, 0.01) for k, v in global_weights.items()}
    out, info = distiller.process_update(global_weights, delta, "skewed", base_version=3, current_version=5)
    assert info["phase"] == "distill"
    assert info["tau"] == 2 and math.isclose(info["beta"], 0.5, abs_tol=1e-9)
    assert info["kd_seconds"] > 0.0
    assert out.keys() == delta.keys()
    assert any(not np.allclose(out[k], delta[k]) for k in delta)
    assert all(out[k].dtype == np.float32 and out[k].shape == delta[k].shape for k in delta)


def test_fresh_update_after_kd_train_from_version_skips_kd():
    distiller = FedReviveDistiller(small_cfg(), Cifar10ConvNet, CPU, seed=0)
    distiller.observe_client_model("c0", weights_of(Cifar10ConvNet()))
    global_weights = weights_of(Cifar10ConvNet())
    delta = {k: np.full_like(v, 0.01) for k, v in global_weights.items()}
    out, info = distiller.process_update(global_weights, delta, "c0", base_version=5, current_version=5)
    assert info["phase"] == "fresh" and info["beta"] == 0.0
    for k in delta:
        np.testing.assert_array_equal(out[k], delta[k])


def _plain_convnet() -> torch.nn.Module:
    """A user's network without BatchNorm or trackers: no data statistics of its own."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.ReLU(),
        torch.nn.Conv2d(4, 4, 3),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 28 * 28, 10),
    )


@pytest.mark.parametrize(
    "build, mode, layers",
    [(Cifar10ConvNet, "statistics", 2), (CifarResNet18, "statistics", 20), (_plain_convnet, "conv", 2)],
)
def test_feature_stats_hooks_leave_forward_unchanged_and_are_removed(build, mode, layers):
    torch.manual_seed(0)
    x = torch.randn(8, 3, 32, 32)
    model = build().eval()
    plain = model(x)
    reference = record_reference(model, x) if mode == "conv" else None
    with FeatureStats(model, reference) as fs:
        hooked = model(x)
        loss = fs.loss()
    torch.testing.assert_close(hooked, plain)
    assert fs.mode == mode and len(fs.stats) == layers
    if fs.mode == "conv":
        assert loss.item() == pytest.approx(0.0, abs=1e-5)  # same batch as the reference
    else:
        assert loss.item() > 0.0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_synthetic_pool_evicts_oldest_first():
    pool = SyntheticPool(capacity=5)
    pool.add(torch.zeros(3, 1), torch.tensor([0, 1, 2]))
    pool.add(torch.ones(4, 1), torch.tensor([3, 4, 5, 6]))
    assert len(pool) == 5
    assert sorted(pool._labels.tolist()) == [2, 3, 4, 5, 6]


@pytest.mark.parametrize("added", [3, 7])  # filling up, and wrapped around
def test_a_restored_synthetic_pool_keeps_only_what_it_holds_and_samples_the_same(added):
    pool = SyntheticPool(capacity=5)
    pool.add(torch.arange(added, dtype=torch.float32).unsqueeze(1), torch.arange(added))
    state = pool.state_dict()
    assert state["images"].untyped_storage().nbytes() == min(added, 5) * 4  # torch.save writes whole storages
    restored = SyntheticPool(capacity=5)
    restored.load_state_dict(state)
    for p in (pool, restored):
        p.add(torch.full((1, 1), 9.0), torch.tensor([9]))
    draws = [p.sample_for(torch.full((10,), 0.1), 8, torch.Generator().manual_seed(1)) for p in (pool, restored)]
    assert torch.equal(draws[0][0], draws[1][0]) and torch.equal(draws[0][1], draws[1][1])


def test_both_resnet18s_take_cifar_images():
    for model in (CifarResNet18(), TrackedResNet18()):
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_synthesis_runs_for_stale_updates_at_multiples_of_synth_every_versions_only():
    distiller = FedReviveDistiller(
        small_cfg(synth_every_versions=10, kd_train_from_version=20), Cifar10ConvNet, CPU, seed=0
    )
    distiller.observe_client_model("c0", weights_of(Cifar10ConvNet()))
    global_weights = weights_of(Cifar10ConvNet())
    delta = {k: np.full_like(v, 0.01) for k, v in global_weights.items()}
    ran = {}
    for base, version in [(2, 9), (10, 10), (7, 10), (9, 11), (15, 20)]:
        before = len(distiller.synthesizer.pool)
        _, info = distiller.process_update(global_weights, delta, "c0", base_version=base, current_version=version)
        ran[(base, version)] = len(distiller.synthesizer.pool) > before
        assert ran[(base, version)] == info.get("synthesized", False)
    # not a multiple of 10; fresh (tau 0); stale at 10; not a multiple; stale at 20
    assert ran == {(2, 9): False, (10, 10): False, (7, 10): True, (9, 11): False, (15, 20): True}


def test_the_adversary_joins_synthesis_from_kd_train_from_version(monkeypatch):
    distiller = FedReviveDistiller(small_cfg(), Cifar10ConvNet, CPU, seed=0)
    distiller.observe_client_model("c0", weights_of(Cifar10ConvNet()))
    global_weights = weights_of(Cifar10ConvNet())
    delta = {k: np.full_like(v, 0.01) for k, v in global_weights.items()}
    students = []
    synthesize = distiller.synthesizer.synthesize
    monkeypatch.setattr(
        distiller.synthesizer,
        "synthesize",
        lambda t, w, p, student, batch=None: students.append(student) or synthesize(t, w, p, student, batch),
    )
    for version in (3, 4):  # generator warm-up, then KD (kd_train_from_version = 4)
        distiller.process_update(global_weights, delta, "c0", base_version=version - 1, current_version=version)
    assert students[0] is None and students[1] is not None


class ShiftedLogits(torch.nn.Module):
    """A student whose logits are a function of a teacher's: the adversarial term's test double."""

    def __init__(self, teacher: torch.nn.Module, how: str):
        super().__init__()
        self.teacher, self.how = teacher, how

    def forward(self, x):
        logits = self.teacher(x)
        return {"same": logits, "softer": 0.3 * logits, "disagree": logits.roll(1, dims=1)}[self.how]


def test_the_adversarial_term_counts_only_samples_where_student_and_teacher_agree(skewed_model):
    buffer = TeacherBuffer(2, Cifar10ConvNet, CPU)
    buffer.add("a", weights_of(skewed_model), torch.randn(16, 3, 32, 32))
    teachers = list(buffer)
    class_weights = buffer.class_weights(ProportionEstimator(10, 0.8))
    synthesizer = Synthesizer(small_cfg(adv_weight=1.0), CPU, seed=0)
    images, labels = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    logits = skewed_model(images)
    assert (logits.argmax(1) != logits.roll(1, dims=1).argmax(1)).all()

    def loss(student):
        with torch.no_grad():
            return synthesizer.generator_loss(images, labels, teachers, class_weights, student).item()

    plain = loss(None)
    assert loss(ShiftedLogits(teachers[0].model, "same")) == pytest.approx(plain)  # agree, KL 0
    assert loss(ShiftedLogits(teachers[0].model, "disagree")) == pytest.approx(plain)  # KL > 0 but masked out
    assert loss(ShiftedLogits(teachers[0].model, "softer")) < plain - 1e-4  # agree, KL > 0: maximised


def test_kd_draws_each_teachers_pool_images_from_its_class_proportions():
    pool = SyntheticPool(capacity=100)
    pool.add(torch.arange(60, dtype=torch.float32).unsqueeze(1), torch.tensor([0] * 30 + [1] * 30))
    rng = torch.Generator().manual_seed(0)
    only_one = torch.zeros(10)
    only_one[1] = 1.0
    images, labels = pool.sample_for(only_one, 40, rng)
    assert (labels == 1).all() and (images.view(-1) >= 30).all()
    absent = torch.zeros(10)
    absent[7] = 1.0  # nothing of class 7 in the pool: any pool image
    _, labels = pool.sample_for(absent, 40, rng)
    assert set(labels.tolist()) <= {0, 1} and len(labels) == 40


def test_crop_and_flip_is_seeded_differentiable_and_keeps_the_image():
    x = torch.randn(6, 3, 8, 8, requires_grad=True)
    a = crop_and_flip(x, torch.Generator().manual_seed(5))
    b = crop_and_flip(x, torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and a.shape == x.shape
    a.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    unpadded = crop_and_flip(x.detach(), torch.Generator().manual_seed(1), padding=0)
    for i in range(6):
        assert torch.equal(unpadded[i], x[i]) or torch.equal(unpadded[i], x[i].flip(-1))


def test_a_restored_synthesizer_synthesizes_the_same_next_round(skewed_model):
    buffer = TeacherBuffer(2, Cifar10ConvNet, CPU)
    buffer.add("a", weights_of(skewed_model), torch.randn(16, 3, 32, 32))
    estimator = ProportionEstimator(10, 0.8)
    teachers, weights, props = list(buffer), buffer.class_weights(estimator), buffer.proportions(estimator)
    first = Synthesizer(small_cfg(), CPU, seed=3)
    first.synthesize(teachers, weights, props, None)  # the meta-Adam now has state
    second = Synthesizer(small_cfg(), CPU, seed=99)
    second.load_state_dict(first.state_dict())
    a, b = (s.synthesize(teachers, weights, props, None) for s in (first, second))
    assert torch.equal(a.images, b.images) and a.loss == b.loss
