"""Training data, starting weights and the useful-retrain trigger of Velox (issue 36, item 6)."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import numpy as np
import pytest
from _velox_helpers import make_table

from inferline.core import ValidationError
from inferline.server._velox_app import VeloxModelSpec
from inferline.velox import (
    Bootstrap,
    SplitModel,
    StalenessConfig,
    StartingWeights,
    TableModel,
    TrainingData,
    VeloxConfig,
    VeloxService,
    load_training_data,
    load_user_weights,
    retrain_blocker,
)


def test_config_options_round_trip_json_and_name_the_field() -> None:
    d = {
        "name": "m",
        "features": {"table": "t.npz"},
        "training_data": {"sqlite": "r.db", "table": "ratings"},
        "starting_weights": {"users": "u.npz", "fit": True},
    }
    spec = VeloxModelSpec.from_dict(d, "velox.models[0]")
    assert VeloxModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())), "w") == spec
    assert spec.to_dict()["training_data"] == d["training_data"]
    bad = [
        ({"training_data": {"file": "a.csv", "sqlite": "b.db"}}, "velox.models[0].training_data"),
        ({"training_data": {"sqlite": "b.db"}}, "velox.models[0].training_data.table"),
        ({"training_data": {"sqlite": "b.db", "table": "x; drop"}}, ".training_data.table"),
        ({"training_data": {"file": ""}}, "velox.models[0].training_data.file"),
        ({"training_data": {"csv": "a"}}, "velox.models[0].training_data"),
        ({"starting_weights": {}}, "velox.models[0].starting_weights"),
        ({"starting_weights": {"fit": "yes"}}, "velox.models[0].starting_weights.fit"),
        ({"starting_weights": {"fit": True}}, "velox.models[0].starting_weights.fit"),
    ]
    for extra, field in bad:
        base = {"name": "m", "features": {"table": "t.npz"}, **extra}
        with pytest.raises(ValidationError) as e:
            VeloxModelSpec.from_dict(base, "velox.models[0]")
        assert e.value.field.endswith(field), (extra, e.value.field)
    assert TrainingData.from_dict({"file": "a.csv"}).to_dict() == {"file": "a.csv"}
    assert StartingWeights.from_dict({"fit": True}).to_dict() == {"fit": True}


def test_training_data_from_csv_and_sqlite(tmp_path) -> None:
    (tmp_path / "r.csv").write_text('uid,item,rating,ts\nu1,3,4.5,10\nu2,"""a""",1,\nu2,b,2,\n')
    rows = load_training_data(TrainingData(file=str(tmp_path / "r.csv")))
    assert [(o.uid, o.x, o.y, o.ts) for o in rows] == [
        ("u1", 3, 4.5, 10.0),
        ("u2", "a", 1.0, 0.0),
        ("u2", "b", 2.0, 0.0),
    ]
    con = sqlite3.connect(tmp_path / "r.db")
    con.execute("CREATE TABLE ratings (uid TEXT, item INTEGER, rating REAL)")
    con.executemany("INSERT INTO ratings VALUES (?, ?, ?)", [("a", 1, 2.0), ("b", 7, 3.0)])
    con.commit()
    con.close()
    rows = load_training_data(TrainingData(sqlite=str(tmp_path / "r.db"), table="ratings"))
    assert [(o.uid, o.x, o.y) for o in rows] == [("a", 1, 2.0), ("b", 7, 3.0)]
    for spec, field in (
        (TrainingData(sqlite=str(tmp_path / "r.db"), table="nope"), "training_data.table"),
        (TrainingData(sqlite=str(tmp_path / "none.db"), table="t"), "training_data.sqlite"),
        (TrainingData(file=str(tmp_path / "none.csv")), "training_data.file"),
    ):
        with pytest.raises(ValidationError) as e:
            load_training_data(spec)
        assert e.value.field == field
    (tmp_path / "bad.csv").write_text("user,item,rating\nu,1,2\n")
    with pytest.raises(ValidationError, match="uid"):
        load_training_data(TrainingData(file=str(tmp_path / "bad.csv")))
    (tmp_path / "nan.csv").write_text("uid,item,rating\nu,1,x\n")
    with pytest.raises(ValidationError, match="row 1: rating"):
        load_training_data(TrainingData(file=str(tmp_path / "nan.csv")))


def test_user_weights_file(tmp_path) -> None:
    np.savez(tmp_path / "w.npz", ids=np.array(["a", "b"]), matrix=np.eye(2, 3))
    w = load_user_weights(str(tmp_path / "w.npz"), 3)
    assert list(w) == ["a", "b"] and np.array_equal(w["b"], [0, 1, 0])
    with pytest.raises(ValidationError, match=r"shape \(2, 4\)") as e:
        load_user_weights(str(tmp_path / "w.npz"), 4)
    assert e.value.field == "starting_weights.users"


def test_retrain_blocker_fires_only_when_a_retrain_can_change_something() -> None:
    cfg = StalenessConfig(min_observations=100)
    assert retrain_blocker(cfg, can_change=True, new_observations=100) is None
    assert "min_observations" in retrain_blocker(cfg, can_change=True, new_observations=99)
    assert "reproduce" in retrain_blocker(cfg, can_change=False, new_observations=10_000)
    off = StalenessConfig(auto_retrain=False)
    assert "off" in retrain_blocker(off, can_change=True, new_observations=10_000)
    # a split model: only its own retrain function or a new feature-model version can change
    version = ["1"]

    async def f(x):
        return np.asarray(x, dtype=float)

    split = SplitModel("s", 2, f, version=lambda: version[0])
    assert not split.retrain_can_change("1")
    version[0] = "2"
    assert split.retrain_can_change("1")
    assert SplitModel("s", 2, f, retrain_fn=lambda *a: None).retrain_can_change(None)
    assert TableModel("t", make_table()).retrain_can_change(None)


async def _stream(svc: VeloxService, name: str, n: int, rng: np.random.Generator, scale: float):
    for j in range(n):
        x = rng.normal(size=2)
        await svc.observe(name, f"u{j % 5}", x.tolist(), float(scale * x.sum()))


def test_a_split_model_drift_does_not_start_useless_retrains() -> None:
    asyncio.run(_test_a_split_model_drift_does_not_start_useless_retrains())


async def _test_a_split_model_drift_does_not_start_useless_retrains() -> None:
    """A loss that rises (the labels change) marks the model stale; a split model whose feature
    model did not change records the skipped retrain instead of running one."""

    async def f(x):
        return np.asarray(x, dtype=float)

    svc = VeloxService()
    stale = StalenessConfig(min_observations=50, fast_halflife=10, slow_halflife=100)
    await svc.register(SplitModel("s", 2, f), VeloxConfig(staleness=stale))
    rng = np.random.default_rng(0)
    await _stream(svc, "s", 200, rng, 1.0)
    await _stream(svc, "s", 300, rng, -3.0)  # drift: the loss jumps
    kinds = [e["kind"] for e in svc.events("s")]
    assert "stale" in kinds and "retrain_skipped" in kinds, kinds
    assert svc.jobs("s") == [] and svc.current_version("s") == 1
    await svc.close()


def test_retrain_uses_the_training_data_and_starting_weights() -> None:
    asyncio.run(_test_retrain_uses_the_training_data_and_starting_weights())


async def _test_retrain_uses_the_training_data_and_starting_weights() -> None:
    table = make_table(n_items=30, dim=6)
    rng = np.random.default_rng(1)
    from inferline.velox import Observation

    truth = {f"t{j}": rng.normal(size=6) for j in range(6)}
    rows = tuple(
        Observation(u, int(i), float(table.lookup(int(i)) @ w), 0, 0.0, seq=0)
        for u, w in truth.items()
        for i in rng.choice(30, 15, replace=False)
    )
    start = {"t0": np.full(6, 0.5)}
    svc = VeloxService()
    model = TableModel("m", table, mf_iters=3)
    await svc.register(model, VeloxConfig(), bootstrap=Bootstrap(rows, start))
    p = await svc.predict("m", "t0", 4)
    assert p.score == pytest.approx(float(table.lookup(4) @ start["t0"]))
    assert svc.user("m", "t0")["observations"] == 15  # confidence of the training rows
    job = await svc.retrain("m", wait=True)
    assert job.status == "done"
    rec = svc.versions("m")[-1]
    assert rec.info["training_rows"] == len(rows) and rec.info["users"] == 6
    await svc.close()
    with pytest.raises(ValidationError, match="fit"):
        Bootstrap((), {}, fit=True)


def test_fit_builds_version_one_from_the_training_data() -> None:
    asyncio.run(_test_fit_builds_version_one_from_the_training_data())


async def _test_fit_builds_version_one_from_the_training_data() -> None:
    table = make_table(n_items=20, dim=6)
    from inferline.velox import Observation

    rows = tuple(Observation(f"u{j % 4}", j % 20, 3.0 + (j % 3), 0, 0.0, seq=0) for j in range(80))
    svc = VeloxService()
    await svc.register(TableModel("m", table, mf_iters=3), bootstrap=Bootstrap(rows, fit=True))
    assert len(svc.runtime("m").live.users) == 4
    # fitted MF predicts the training ratings' scale, unlike zero weights
    assert 2.0 < (await svc.predict("m", "u1", 1)).score < 6.0
    await svc.close()


def test_fit_a_split_model_on_training_data_through_its_feature_function() -> None:
    asyncio.run(_split_fit())


async def _split_fit() -> None:
    from inferline.velox import Observation

    calls = []

    async def f(x):
        calls.append(x)
        return 2.0 * np.asarray(x, dtype=float)

    rng = np.random.default_rng(4)
    w = np.array([1.0, -0.5])
    xs = [rng.normal(size=2).tolist() for _ in range(20)]
    rows = tuple(Observation("a", x, float(w @ (2.0 * np.array(x))), 0, 0.0, seq=0) for x in xs)
    svc = VeloxService()
    await svc.register(SplitModel("s", 2, f), bootstrap=Bootstrap(rows, fit=True))
    assert len(calls) >= 20  # the training rows were featurized by the feature function
    assert np.allclose(svc.user("s", "a")["weights"], w, atol=0.05)
    await svc.close()


def test_serve_names_the_model_in_a_load_error(tmp_path) -> None:
    from inferline.server._velox_app import _bootstrap

    np.savez(tmp_path / "w.npz", ids=np.array(["a"]), matrix=np.ones((1, 3)))
    spec = VeloxModelSpec.from_dict(
        {
            "name": "songs",
            "features": {"table": "t.npz"},
            "training_data": {"sqlite": str(tmp_path / "missing.db"), "table": "ratings"},
        },
        "velox.models[0]",
    )
    with pytest.raises(ValidationError) as e:
        _bootstrap(spec, 3)
    assert e.value.field == "velox.models.songs.training_data.sqlite"
    spec = VeloxModelSpec.from_dict(
        {
            "name": "songs",
            "features": {"table": "t.npz"},
            "starting_weights": {"users": str(tmp_path / "w.npz")},
        },
        "velox.models[0]",
    )
    assert _bootstrap(spec, 3).user_weights["a"].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValidationError) as e:
        _bootstrap(spec, 4)
    assert e.value.field == "velox.models.songs.starting_weights.users"
