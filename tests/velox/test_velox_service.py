"""VeloxService end to end on real models and a real SQLite store (no fakes)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _velox_helpers import DIM, make_model, make_table

from inferline.core.errors import BackendError, NotFoundError, ValidationError
from inferline.velox import (
    FeatureTable,
    SplitModel,
    SQLiteStore,
    StalenessConfig,
    TableModel,
    VeloxConfig,
    VeloxService,
    WrongPartitionError,
    partition_of,
    ridge_solve,
)


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coro_fn())


# ------------------------------------------------------------------ predict / observe


def test_observe_learns_the_ridge_solution_and_predicts_with_it() -> None:
    async def main() -> None:
        table = make_table()
        svc = VeloxService()
        await svc.register(TableModel("m", table), VeloxConfig(ridge_lambda=0.5))
        rng = np.random.default_rng(0)
        w_true = rng.normal(size=DIM)
        xs = [int(i) for i in rng.integers(0, 40, size=60)]
        ys = [float(table.lookup(x) @ w_true + 0.01 * rng.normal()) for x in xs]
        for x, y in zip(xs, ys, strict=True):
            res = await svc.observe("m", "alice", x, y)
            assert res.version == 1
        expected = ridge_solve(np.array([table.lookup(x) for x in xs]), np.array(ys), 0.5)
        p = await svc.predict("m", "alice", 7)
        assert p.score == pytest.approx(float(table.lookup(7) @ expected), abs=1e-9)
        assert not p.new_user
        info = svc.user("m", "alice")
        assert info["observations"] == 60
        np.testing.assert_allclose(info["weights"], expected, atol=1e-9)
        assert info["loss"]["count"] == 60
        await svc.close()

    run(main)


def test_first_observation_reports_prior_prediction_and_new_user() -> None:
    async def main() -> None:
        svc = VeloxService()
        await svc.register(make_model())
        first = await svc.observe("m", "u", 3, 2.0)
        assert first.new_user and first.y_hat == 0.0 and first.loss == pytest.approx(4.0)
        second = await svc.observe("m", "u", 3, 2.0)
        assert not second.new_user and second.y_hat > 0.0 and second.seq == first.seq + 1
        await svc.close()

    run(main)


def test_new_users_start_from_average_weights() -> None:
    async def main() -> None:
        table = make_table()
        svc = VeloxService()
        await svc.register(TableModel("m", table), VeloxConfig(ridge_lambda=1.0))
        rng = np.random.default_rng(1)
        for uid in ("a", "b", "c"):
            w = rng.normal(size=DIM)
            for x in range(20):
                await svc.observe("m", uid, x, float(table.lookup(x) @ w))
        avg = np.mean([svc.user("m", u)["weights"] for u in ("a", "b", "c")], axis=0)
        p = await svc.predict("m", "newcomer", 5)
        assert p.new_user
        assert p.score == pytest.approx(float(table.lookup(5) @ avg), abs=1e-9)
        with pytest.raises(NotFoundError):
            svc.user("m", "newcomer")  # predicting does not create a user
        # The newcomer's first observation starts from that average.
        res = await svc.observe("m", "newcomer", 5, 0.0)
        assert res.y_hat == pytest.approx(float(table.lookup(5) @ avg), abs=1e-9)
        await svc.close()

    run(main)


def test_reject_mode_unknown_user_and_unknown_names() -> None:
    async def main() -> None:
        svc = VeloxService()
        await svc.register(make_model(), VeloxConfig(new_users="reject"))
        with pytest.raises(NotFoundError) as e:
            await svc.predict("m", "ghost", 1)
        assert e.value.kind == "user"
        with pytest.raises(NotFoundError):
            await svc.top_k("m", "ghost", [1, 2], 1)
        await svc.observe("m", "ghost", 1, 1.0)  # observe creates the user
        assert not (await svc.predict("m", "ghost", 1)).new_user
        with pytest.raises(NotFoundError) as e:
            await svc.predict("nope", "ghost", 1)
        assert e.value.kind == "velox model"
        with pytest.raises(NotFoundError) as e:
            await svc.predict("m", "ghost", 999)  # not in the table
        assert e.value.kind == "item"
        await svc.close()

    run(main)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda s: s.observe("m", "", 1, 1.0), "uid"),
        (lambda s: s.observe("m", 5, 1, 1.0), "uid"),
        (lambda s: s.observe("m", "u", 1, float("nan")), "y"),
        (lambda s: s.observe("m", "u", 1, "3"), "y"),
        (lambda s: s.predict("m", "u", object()), "x"),
        (lambda s: s.top_k("m", "u", [], 1), "items"),
        (lambda s: s.top_k("m", "u", [1, 2], 3), "k"),
        (lambda s: s.top_k("m", "u", [1, 2], 1, alpha=-1.0), "alpha"),
        (lambda s: s.rollback("m", "1"), "version"),
    ],
)
def test_bad_input_names_the_field(
    call: Callable[[VeloxService], Awaitable[Any]], field: str
) -> None:
    async def main() -> None:
        svc = VeloxService()
        await svc.register(make_model())
        with pytest.raises(ValidationError) as e:
            await call(svc)
        assert e.value.field == field
        await svc.close()

    run(main)


# ------------------------------------------------------------------ top-K and exploration


def test_top_k_orders_by_score_and_alpha_zero_is_pure_exploitation() -> None:
    async def main() -> None:
        table = make_table()
        svc = VeloxService()
        await svc.register(TableModel("m", table))
        for x in range(10):
            await svc.observe("m", "u", x, float(table.lookup(x)[0]))
        res = await svc.top_k("m", "u", list(range(40)), 5, alpha=0.0)
        w = np.array(svc.user("m", "u")["weights"])
        scores = table.matrix @ w
        assert [r.item for r in res.items] == list(np.argsort(-scores, kind="stable")[:5])
        assert all(r.bonus == 0.0 for r in res.items)
        assert [r.index for r in res.items] == [r.item for r in res.items]
        await svc.close()

    run(main)


def test_linucb_bonus_prefers_unexplored_directions() -> None:
    async def main() -> None:
        # Two items with the same predicted score: one along a direction the user has rated a
        # lot, one along a direction never seen. Exploration must pick the unseen one.
        ids = ["seen", "unseen", "other"]
        feats = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.1]])
        svc = VeloxService()
        await svc.register(TableModel("m", FeatureTable(ids, feats)), VeloxConfig(ridge_lambda=1.0))
        for _ in range(50):
            await svc.observe("m", "u", "seen", 0.0)
        exploit = await svc.top_k("m", "u", ids, 1, alpha=0.0)
        explore = await svc.top_k("m", "u", ids, 1, alpha=1.0)
        assert exploit.items[0].item == "seen"  # tie on score 0 -> first position wins
        assert explore.items[0].item == "unseen"
        assert explore.items[0].bonus == pytest.approx(1.0)  # sqrt(e2^T (I/lam) e2)
        default = await svc.top_k("m", "u", ids, 3)
        assert default.alpha == 1.0  # config default: exploration on
        assert default.items[0].item == "unseen"
        await svc.close()

    run(main)


# ------------------------------------------------------------------ caches


def test_feature_cache_hits_and_prediction_cache_invalidated_by_observe() -> None:
    async def main() -> None:
        calls: list[Any] = []
        rng = np.random.default_rng(2)
        mat = rng.normal(size=(10, 4))

        async def features(x: Any) -> np.ndarray:
            calls.append(x)
            await asyncio.sleep(0)
            return mat[x]

        svc = VeloxService()
        await svc.register(SplitModel("s", 4, features))
        await svc.observe("s", "u", 1, 1.0)
        p1 = await svc.predict("s", "u", 1)
        p2 = await svc.predict("s", "u", 1)
        assert calls == [1]  # one feature evaluation for three requests
        assert not p1.cached and p2.cached and p1.score == p2.score
        await svc.observe("s", "u", 1, 5.0)  # new weights: the cached prediction is unreachable
        p3 = await svc.predict("s", "u", 1)
        assert not p3.cached and p3.score != p1.score
        # Concurrent identical requests coalesce into one feature evaluation.
        await asyncio.gather(*(svc.predict("s", "v", 7) for _ in range(10)))
        assert calls.count(7) == 1
        await svc.top_k("s", "u", list(range(10)), 3)
        assert sorted(calls) == sorted([1, 7, *[x for x in range(10) if x not in (1, 7)]])
        await svc.close()

    run(main)


def test_feature_function_failure_and_bad_output() -> None:
    async def main() -> None:
        async def broken(x: Any) -> np.ndarray:
            if x == "bad-shape":
                return np.zeros(3)
            if x == "nan":
                return np.full(4, np.nan)
            raise BackendError("triton://x", "replica died")

        svc = VeloxService()
        await svc.register(SplitModel("s", 4, broken))
        for x in ("bad-shape", "nan", "boom"):
            with pytest.raises(BackendError):
                await svc.observe("s", "u", x, 1.0)
        assert svc.observations("s") == []  # nothing logged for a failed observe
        await svc.close()

    run(main)


# ------------------------------------------------------------------ retrain, versions, rollback


def _rated(
    table: FeatureTable, n_users: int, per_user: int, seed: int
) -> list[tuple[str, int, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for u in range(n_users):
        w = rng.normal(size=table.dim)
        for x in rng.choice(len(table), size=per_user, replace=False):
            out.append((f"u{u}", int(x), float(table.lookup(int(x)) @ w)))
    return out


def test_retrain_bumps_version_switches_atomically_and_rollback_restores() -> None:
    async def main() -> None:
        svc = VeloxService()
        model = TableModel("m", make_table(dim=DIM), mf_iters=4)
        await svc.register(model, VeloxConfig(checkpoint_every=7))
        for uid, x, y in _rated(make_table(), 8, 15, seed=3):
            await svc.observe("m", uid, x, y)
        before = (await svc.predict("m", "u1", 3)).score
        job = await svc.retrain("m", "nightly")
        assert job.status == "running" and job.from_version == 1
        # Requests keep being served, by version 1, while the retrain runs.
        again = await svc.retrain("m", "duplicate")  # joins the running job
        assert again.job == job.job
        p = await svc.predict("m", "u1", 3)
        assert p.version in (1, 2)
        done = await svc.retrain("m", "ignored", wait=True)
        assert done.job == job.job and done.status == "done" and done.version == 2
        assert svc.current_version("m") == 2
        after = await svc.predict("m", "u1", 3)
        assert after.version == 2 and after.score != before
        versions = svc.versions("m")
        assert [(v.version, v.parent, v.reason) for v in versions] == [
            (1, None, "initial"),
            (2, 1, "nightly"),
        ]
        assert versions[1].base_seq == 120 and versions[1].info["observations"] == 120
        # Observations after the retrain continue on version 2 ...
        res = await svc.observe("m", "u1", 3, 1.0)
        assert res.version == 2
        # ... and a rollback replays them into version 1's users.
        rec = await svc.rollback("m", 1)
        assert rec.version == 1 and svc.current_version("m") == 1
        u1 = svc.user("m", "u1")
        assert u1["version"] == 1 and u1["observations"] == 16
        kinds = [e["kind"] for e in svc.events("m")]
        assert kinds == ["version", "retrained", "rollback"]
        with pytest.raises(NotFoundError):
            await svc.rollback("m", 9)
        await svc.close()

    run(main)


def test_observations_during_retrain_are_not_lost() -> None:
    async def main() -> None:
        svc = VeloxService()
        await svc.register(TableModel("m", make_table(), mf_iters=3))
        data = _rated(make_table(), 5, 12, seed=4)
        for uid, x, y in data[:40]:
            await svc.observe("m", uid, x, y)
        job = await svc.retrain("m")
        for uid, x, y in data[40:]:  # interleaved with the background retrain
            await svc.observe("m", uid, x, y)
            await asyncio.sleep(0)
        await svc.retrain("m", wait=True)
        assert svc.jobs("m")[-1].status == "done" and job.job == 1
        total = sum(svc.user("m", f"u{u}")["observations"] for u in range(5))
        # Users of version 2 count their retrain rows plus every observation after its base.
        assert total == 60
        await svc.close()

    run(main)


def test_staleness_triggers_a_recorded_retrain() -> None:
    async def main() -> None:
        # The world drifts: the same users start rating by a different rule, so the loss rises.
        table = make_table(n_items=30)
        svc = VeloxService()
        cfg = VeloxConfig(
            staleness=StalenessConfig(
                fast_halflife=10, slow_halflife=100, threshold=0.5, min_observations=60
            )
        )
        await svc.register(TableModel("m", table, mf_iters=2), cfg)
        rng = np.random.default_rng(5)
        w_old = rng.normal(size=DIM)
        for i in range(150):
            x = i % 30
            await svc.observe("m", "u", x, float(table.lookup(x) @ w_old + 0.01 * rng.normal()))
        triggered = None
        for i in range(300):
            x = int(rng.integers(30))
            res = await svc.observe("m", f"v{i % 3}", x, float(5 + 3 * rng.normal()))
            if res.stale:
                triggered = res
                break
        assert triggered is not None and triggered.retrain is not None
        assert triggered.retrain.reason.startswith("stale: loss trend")
        await svc.retrain("m", wait=True)
        assert svc.current_version("m") == 2
        stale = [e for e in svc.events("m") if e["kind"] == "stale"]
        assert len(stale) == 1 and stale[0]["detail"]["trend"] > 0.5
        assert svc.versions("m")[-1].reason.startswith("stale")
        await svc.close()

    run(main)


def test_an_abrupt_drift_is_followed_up_until_the_loss_comes_down() -> None:
    """The items' true factors change at once: the first retrain learns from a handful of
    new observations and the loss stays high but flat; follow-up retrains (each with more of
    the new data) bring it down. Before, nothing fired again and the loss stayed put."""
    k, n_items, n_users = 4, 120, 20
    rng = np.random.default_rng(0)
    v_old, v_new = rng.normal(size=(n_items, k)), rng.normal(size=(n_items, k))
    users = rng.normal(size=(n_users, k))
    ids = [f"i{j}" for j in range(n_items)]
    table = FeatureTable(ids, np.hstack([np.ones((n_items, 1)), np.zeros((n_items, 1)), v_old]))

    async def main() -> tuple[list[float], list[str]]:
        svc = VeloxService()
        cfg = VeloxConfig(alpha=0.0, staleness=StalenessConfig(min_observations=400))
        await svc.register(TableModel("m", table, mf_iters=10), cfg)
        losses = []
        for t in range(5000):
            v = v_old if t < 1200 else v_new
            u, j = int(rng.integers(n_users)), int(rng.integers(n_items))
            y = float(users[u] @ v[j] + 0.1 * rng.normal())
            losses.append((await svc.observe("m", f"u{u}", f"i{j}", y)).loss)
            if t % 10 == 0:
                await asyncio.sleep(0.001)  # a server idles between requests: the retrain runs
        await svc.runtime("m").wait_retrain()
        reasons = [v.reason for v in svc.versions("m")]
        await svc.close()
        return losses, reasons

    losses, reasons = run(main)
    assert reasons[1].startswith("stale: loss trend")
    follow = [r for r in reasons if "still above the level before the drift" in r]
    assert 1 <= len(follow) <= 5, reasons
    early, late = np.mean(losses[1600:2400]), np.mean(losses[4200:5000])
    assert late < 0.7 * early, (early, late, reasons)


def test_failed_retrain_is_recorded_and_serving_continues() -> None:
    async def main() -> None:
        def boom(state: Any, obs: Any, w: Any, lam: float) -> Any:
            raise RuntimeError("training cluster unavailable")

        async def features(x: Any) -> np.ndarray:
            return np.ones(3) * x

        svc = VeloxService()
        await svc.register(SplitModel("s", 3, features, retrain_fn=boom))
        await svc.observe("s", "u", 1, 1.0)
        job = await svc.retrain("s", wait=True)
        assert job.status == "failed" and "training cluster unavailable" in (job.error or "")
        assert svc.current_version("s") == 1
        assert svc.events("s")[-1]["kind"] == "retrain_failed"
        assert (await svc.predict("s", "u", 1)).version == 1
        await svc.close()

    run(main)


def test_split_model_default_retrain_refits_users_on_logged_features() -> None:
    async def main() -> None:
        rng = np.random.default_rng(6)
        mat = rng.normal(size=(20, 3))

        async def features(x: Any) -> np.ndarray:
            return mat[x]

        svc = VeloxService()
        await svc.register(SplitModel("s", 3, features, state={"backend_version": "7"}))
        xs = list(range(20))
        ys = [float(mat[x] @ [1.0, -2.0, 0.5]) for x in xs]
        for x, y in zip(xs, ys, strict=True):
            await svc.observe("s", "u", x, y)
        w_online = np.array(svc.user("s", "u")["weights"])
        await svc.retrain("s", wait=True)
        w_retrained = np.array(svc.user("s", "u")["weights"])
        np.testing.assert_allclose(w_retrained, w_online, atol=1e-9)  # same data, same ridge
        assert svc.user("s", "u")["observations"] == 20  # confidence carried over
        await svc.close()

    run(main)


# ------------------------------------------------------------------ persistence and partitions


def test_restart_resumes_exact_state_from_snapshot_plus_log(tmp_path: Path) -> None:
    db = tmp_path / "velox.sqlite"

    async def first() -> dict[str, Any]:
        svc = VeloxService(SQLiteStore(db))
        await svc.register(make_model(), VeloxConfig(checkpoint_every=5))
        for uid, x, y in _rated(make_table(), 4, 13, seed=7):
            await svc.observe("m", uid, x, y)
        await asyncio.sleep(0.05)
        state = {u: svc.user("m", u)["weights"] for u in ("u0", "u1", "u2", "u3")}
        # No close(): whatever the last checkpoint missed must come back from the log.
        return state

    async def second() -> dict[str, Any]:
        svc = VeloxService(SQLiteStore(db))
        await svc.register(make_model(), VeloxConfig(checkpoint_every=5))
        state = {u: svc.user("m", u)["weights"] for u in ("u0", "u1", "u2", "u3")}
        assert svc.user("m", "u0")["observations"] == 13
        await svc.close()
        return state

    before = run(first)
    after = run(second)
    for u in before:
        np.testing.assert_allclose(after[u], before[u], atol=1e-9)


def test_partitioned_frontends_share_one_store(tmp_path: Path) -> None:
    db = tmp_path / "shared.sqlite"

    async def main() -> None:
        store = SQLiteStore(db)
        a, b = VeloxService(store), VeloxService(SQLiteStore(db))
        await a.register(make_model(), VeloxConfig(partitions=2, owned_partitions=(0,)))
        await b.register(make_model(), VeloxConfig(partitions=2, owned_partitions=(1,)))
        uids = [f"user{i}" for i in range(12)]
        owner = {u: a if partition_of(u, 2) == 0 else b for u in uids}
        assert {id(s) for s in owner.values()} == {id(a), id(b)}
        for i, u in enumerate(uids):
            other = b if owner[u] is a else a
            with pytest.raises(WrongPartitionError) as e:
                await other.observe("m", u, i % 40, 1.0)
            assert e.value.partition == partition_of(u, 2)
            await owner[u].observe("m", u, i % 40, float(i))
        assert len(store.observations("m")) == 12
        await a.close()
        await b.close()
        # A single frontend owning everything sees every user after restart.
        c = VeloxService(SQLiteStore(db))
        await c.register(make_model())
        assert all(c.user("m", u)["observations"] == 1 for u in uids)
        await c.close()
        store.close()

    run(main)


def test_other_frontend_adopts_new_version_with_sync(tmp_path: Path) -> None:
    db = tmp_path / "shared.sqlite"

    async def main() -> None:
        a, b = VeloxService(SQLiteStore(db)), VeloxService(SQLiteStore(db))
        await a.register(make_model(), VeloxConfig(partitions=2, owned_partitions=(0,)))
        await b.register(make_model(), VeloxConfig(partitions=2, owned_partitions=(1,)))
        for uid, x, y in _rated(make_table(), 6, 10, seed=8):
            owner = a if partition_of(uid, 2) == 0 else b
            await owner.observe("m", uid, x, y)
        await a.retrain("m", wait=True)
        assert a.current_version("m") == 2 and b.current_version("m") == 1
        assert await b.sync("m")
        assert b.current_version("m") == 2
        assert not await b.sync("m")
        await a.close()
        await b.close()

    run(main)


def test_a_second_server_on_the_same_users_is_refused(tmp_path: Path) -> None:
    """Two servers writing the same users to one store would hide each other's observations
    on resume (each snapshot claims the log up to its own last write): the second is refused,
    naming the store, until the first closes; disjoint partitions may share (test above)."""
    db = tmp_path / "one.sqlite"

    async def main() -> None:
        a = VeloxService(SQLiteStore(db))
        await a.register(make_model())
        b = VeloxService(SQLiteStore(db))
        with pytest.raises(ValidationError, match=r"velox\.store: .* no other running server"):
            await b.register(make_model())
        with pytest.raises(ValidationError, match="all its users"):
            await b.register(make_model(), VeloxConfig(partitions=2, owned_partitions=(1,)))
        c = VeloxService(SQLiteStore(db))
        await c.register(make_model("n"), VeloxConfig(partitions=2, owned_partitions=(1,)))
        with pytest.raises(ValidationError, match="partition 1"):
            await b.register(make_model("n"), VeloxConfig(partitions=2, owned_partitions=(0, 1)))
        await c.close()
        await a.observe("m", "u", 1, 2.0)
        await a.close()
        await b.register(make_model())  # free once the first has closed
        assert b.user("m", "u")["observations"] == 1
        await b.close()

    run(main)
