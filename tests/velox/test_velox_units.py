"""Pure pieces of Velox: configs, codec, ridge updates, staleness rule, partitioning, MF."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inferline.core.errors import NotFoundError, ValidationError
from inferline.velox import (
    FeatureTable,
    Observation,
    ObserveResult,
    Prediction,
    Ranked,
    RetrainJob,
    StalenessConfig,
    StalenessDetector,
    StalenessVerdict,
    TopK,
    UserRidge,
    VeloxConfig,
    VersionRecord,
    decode_value,
    encode_value,
    partition_of,
    ridge_solve,
    train_mf,
)

# ------------------------------------------------------------------ configs and results


def test_config_round_trip_defaults_and_custom() -> None:
    for cfg in (
        VeloxConfig(),
        VeloxConfig(
            ridge_lambda=0.5,
            alpha=1.5,
            refactor_every=7,
            new_users="reject",
            partitions=4,
            owned_partitions=(3, 1),
            checkpoint_every=3,
            staleness=StalenessConfig(
                fast_halflife=5,
                slow_halflife=50,
                threshold=0.1,
                min_observations=0,
                auto_retrain=False,
            ),
        ),
    ):
        d = cfg.to_dict()
        assert VeloxConfig.from_dict(d) == cfg
        import json

        assert VeloxConfig.from_dict(json.loads(json.dumps(d))) == cfg
    assert VeloxConfig(partitions=4, owned_partitions=(3, 1, 1)).owned_partitions == (1, 3)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ridge_lambda": 0}, "ridge_lambda"),
        ({"alpha": -1}, "alpha"),
        ({"refactor_every": 0}, "refactor_every"),
        ({"new_users": "ignore"}, "new_users"),
        ({"partitions": 2, "owned_partitions": (2,)}, "owned_partitions"),
        ({"partitions": 2, "owned_partitions": ()}, "owned_partitions"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        VeloxConfig(**kwargs)
    assert e.value.field == field


def test_config_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ValidationError) as e:
        VeloxConfig.from_dict({"lambda": 1})
    assert e.value.field == "config"
    with pytest.raises(ValidationError):
        StalenessConfig(fast_halflife=100, slow_halflife=10)


def test_result_dataclasses_round_trip() -> None:
    job = RetrainJob(3, "m", "manual", "done", 1.0, 2.0, 1, 2, None)
    values = [
        Prediction("u", 1.5, 2, True, False),
        TopK("u", 2, 0.5, False, (Ranked(7, 0, 1.0, 0.2), Ranked("a", 1, 0.5, 0.1))),
        ObserveResult("u", 9, 1.0, 0.25, 2, False, True, job),
        job,
        StalenessVerdict(True, 1.0, 0.5, 1.0, 10),
        VersionRecord(2, 1, 3.0, "stale", 40, {"items": 5}),
    ]
    for v in values:
        assert type(v).from_dict(v.to_dict()) == v
    o = Observation("u", {"a": [1, 2]}, 3.0, 1, 5.0, np.arange(3.0), seq=1)
    back = Observation.from_dict(o.to_dict())
    assert back.x == o.x and np.array_equal(back.features, o.features) and back.seq == 1


# ------------------------------------------------------------------ codec


def test_codec_round_trips_arrays_and_json() -> None:
    x = {"img": np.arange(6, dtype=np.float32).reshape(2, 3), "id": 5, "tags": ["a", None, 1.5]}
    back = decode_value(encode_value(x))
    assert back["img"].dtype == np.float32 and np.array_equal(back["img"], x["img"])
    assert back["id"] == 5 and back["tags"] == ["a", None, 1.5]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"dtype": "float64", "shape": [2], "b64": "AAAA"}, "x.data"),
        ({"dtype": "nope", "shape": [1], "b64": ""}, "x.dtype"),
        ({"dtype": "float64", "shape": [-1], "b64": ""}, "x.shape"),
        ({"dtype": "object", "shape": [1], "b64": ""}, "x.dtype"),
        ({"dtype": "float64", "b64": "", "extra": 1}, "x"),
    ],
)
def test_codec_rejects_malformed_tensors(payload: object, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        decode_value(payload)
    assert e.value.field == field


# ------------------------------------------------------------------ ridge


def test_sherman_morrison_matches_closed_form_with_prior() -> None:
    rng = np.random.default_rng(1)
    d, n, lam = 8, 300, 0.7
    prior = rng.normal(size=d)
    feats = rng.normal(size=(n, d))
    y = feats @ rng.normal(size=d) + 0.1 * rng.normal(size=n)
    u = UserRidge(prior, lam)
    for i in range(n):
        y_hat = u.update(feats[i], y[i], refactor_every=10**9)  # never refactor: pure rank-one
        if i == 0:
            assert y_hat == pytest.approx(prior @ feats[0])
    exact = ridge_solve(feats, y, lam, prior)
    np.testing.assert_allclose(u.w, exact, atol=1e-9)
    np.testing.assert_allclose(u.a_inv, np.linalg.inv(u.gram), atol=1e-12)
    np.testing.assert_allclose(u.gram, lam * np.eye(d) + feats.T @ feats, atol=1e-9)
    np.testing.assert_allclose(u.b, lam * prior + feats.T @ y, atol=1e-9)
    assert u.n == n


def test_refactorization_keeps_long_ill_conditioned_stream_exact() -> None:
    # Nearly collinear features and a tiny lambda (condition number ~1e7) over 20,000 updates:
    # weights and inverse stay within 1e-7 (relative) of the exact solution.
    rng = np.random.default_rng(2)
    d, n, lam = 5, 20000, 1e-6
    feats = rng.normal(size=d) + 1e-3 * rng.normal(size=(n, d))
    y = feats @ rng.normal(size=d)
    u = UserRidge(np.zeros(d), lam)
    for i in range(n):
        u.update(feats[i], y[i], refactor_every=100)
    a = lam * np.eye(d) + feats.T @ feats
    exact_inv, exact_w = np.linalg.inv(a), np.linalg.solve(a, feats.T @ y)
    assert np.abs(u.a_inv - exact_inv).max() / np.abs(exact_inv).max() < 1e-7
    assert np.abs(u.w - exact_w).max() / np.abs(exact_w).max() < 1e-7
    assert u.since_refactor == 0  # 20,000 is a multiple of 100: just refactorized
    assert np.array_equal(u.a_inv, u.a_inv.T)  # symmetric rank-one updates stay symmetric


def test_from_weights_and_from_stats_reproduce_state() -> None:
    rng = np.random.default_rng(3)
    w = rng.normal(size=4)
    feats = rng.normal(size=(10, 4))
    u = UserRidge.from_weights(w, feats, 2.0)
    np.testing.assert_allclose(u.w, w, atol=1e-12)
    assert u.n == 10
    v = UserRidge.from_stats(u.gram, u.b, u.n, 2.0)
    np.testing.assert_allclose(v.w, w, atol=1e-12)
    # More data -> less uncertainty in every direction (LinUCB's exploration shrinks).
    fresh = UserRidge(np.zeros(4), 2.0)
    probe = rng.normal(size=(5, 4))
    assert np.all(u.uncertainty(probe) < fresh.uncertainty(probe))


def test_uncertainty_is_linucb_width() -> None:
    u = UserRidge(np.zeros(3), 1.0)
    u.update(np.array([1.0, 0.0, 0.0]), 1.0, 100)
    width = u.uncertainty(np.eye(3))
    np.testing.assert_allclose(width, [math.sqrt(0.5), 1.0, 1.0])


# ------------------------------------------------------------------ staleness


def test_staleness_fires_once_on_rising_loss_not_on_noise() -> None:
    rng = np.random.default_rng(4)
    det = StalenessDetector(StalenessConfig())  # the defaults are what is under test
    # Squared errors of a well-specified model: chi-square noise with a constant mean.
    flat = [det.update(f"u{i % 7}", float(rng.normal() ** 2)) for i in range(20000)]
    assert not any(v.stale for v in flat)
    assert max(v.trend for v in flat[1000:]) < 0.3 * 0.85  # margin below the threshold
    # The loss doubles over 2,000 observations: flagged once, within 1,600 observations.
    rising = [
        det.update("u1", float((1 + min(i, 2000) / 2000) * rng.normal() ** 2)) for i in range(4000)
    ]
    fired = [i for i, v in enumerate(rising) if v.stale]
    assert len(fired) == 1 and 500 < fired[0] < 1600
    assert not det.armed
    det.reset()
    assert det.armed
    assert det.users["u1"].count == 4000 + sum(1 for i in range(20000) if i % 7 == 1)


def test_staleness_after_an_abrupt_drift_follows_up_until_the_loss_is_back() -> None:
    """An abrupt jump fires at once, so the retrain sees few new observations and the new
    version's loss stays high but flat (no trend): the follow-up rule fires again after
    min_observations on each new version, up to follow_up_retrains, and stops once the loss
    is back near the level before the drift."""
    rng = np.random.default_rng(9)
    cfg = StalenessConfig(min_observations=500, follow_up_retrains=2)
    det = StalenessDetector(cfg)

    def feed(n: int, level: float) -> list[int]:
        return [i for i in range(n) if det.update("u", level * float(rng.normal() ** 2)).stale]

    assert feed(3000, 1.0) == []
    fired = feed(200, 20.0)
    assert len(fired) == 1 and fired[0] < 20  # flagged within a few observations
    ref = det.reference
    assert ref is not None and 0.8 < ref < 1.2  # the level before the drift
    reasons = []
    for _ in range(4):  # new versions that do not bring the loss back
        det.reset()
        fired = feed(1500, 10.0)
        reasons.append(len(fired))
    assert reasons == [1, 1, 0, 0]  # two follow-ups, then it gives up
    # A version that brings the loss back near the level before the drift ends the rule:
    det = StalenessDetector(cfg)
    assert feed(3000, 1.0) == [] and len(feed(200, 20.0)) == 1
    det.reset()
    assert feed(1500, 1.1) == [] and det.reference is None


def test_staleness_ignores_non_finite_loss() -> None:
    det = StalenessDetector(StalenessConfig(min_observations=0))
    v = det.update("u", float("nan"))
    assert not v.stale and det.global_loss.count == 0


# ------------------------------------------------------------------ partitions, table, MF


def test_partition_is_stable_and_balanced() -> None:
    parts = [partition_of(f"user-{i}", 4) for i in range(4000)]
    counts = np.bincount(parts, minlength=4)
    assert counts.min() > 900  # within ~10% of 1000 each
    assert partition_of("alice", 4) == partition_of("alice", 4)
    assert partition_of("alice", 1) == 0


def test_feature_table_lookup_unknown_policies() -> None:
    t = FeatureTable(["a", "b"], [[1.0, 0.0], [0.0, 1.0]])
    assert not t.lookup("a").flags.writeable
    with pytest.raises(NotFoundError):
        t.lookup("zzz")
    m = FeatureTable(["a", "b"], [[1.0, 0.0], [0.0, 1.0]], unknown="mean")
    np.testing.assert_allclose(m.lookup("zzz"), [0.5, 0.5])
    # not an id at all: refused under either policy (not scored as the unknown item's mean)
    for table in (t, m):
        for bad in (["unhashable"], True, None, float("nan")):
            with pytest.raises(ValidationError, match="x: expected an item id"):
                table.lookup(bad)
    assert FeatureTable.from_dict(t.to_dict()).ids == ["a", "b"]
    with pytest.raises(ValidationError):
        FeatureTable(["a", "a"], [[1.0], [2.0]])


def test_train_mf_fits_low_rank_ratings() -> None:
    rng = np.random.default_rng(5)
    nu, ni, k = 30, 40, 2
    p, q = rng.normal(size=(nu, k)), rng.normal(size=(ni, k))
    pairs = [(u, i) for u in range(nu) for i in range(ni) if rng.random() < 0.6]
    users = [f"u{u}" for u, _ in pairs]
    items = [i for _, i in pairs]
    y = np.array([3.0 + p[u] @ q[i] for u, i in pairs])
    mf = train_mf(users, items, y, k=k, lam=0.01, iters=15, rng=np.random.default_rng(0))
    ui = {u: j for j, u in enumerate(mf.user_ids)}
    ii = {x: j for j, x in enumerate(mf.item_ids)}
    pred = mf.predict(np.array([ui[u] for u in users]), np.array([ii[i] for i in items]))
    assert np.sqrt(np.mean((pred - y) ** 2)) < 0.15
    # The Velox form reproduces the MF prediction exactly: w_u . f_i.
    velox = np.sum(
        mf.user_weights()[[ui[u] for u in users]] * mf.item_features()[[ii[i] for i in items]],
        axis=1,
    )
    np.testing.assert_allclose(velox, pred, atol=1e-9)
    assert mf.dim == k + 2
