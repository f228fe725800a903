"""Selection apps in the frontend: a deployment app with a ``selection`` block serves an Exp4
ensemble of real digits classifiers on the bundled runtime; feedback by query id or by input
(and per user) reaches the policy state through ``POST /apps/{app}/feedback``."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for benchmarks._digits

from benchmarks._digits import SOURCE as SRC
from benchmarks._digits import digits_data
from inferline.core import ValidationError
from inferline.deploy import Deployment, start_service
from inferline.selection import SQLiteStore
from inferline.server import create_app, make_selection_router
from inferline.server._selection_app import SelectionAppSpec, selection_services


def _deployment(store: str) -> dict:
    return {
        "format": "inferline.deployment/1",
        "name": "digits-vote",
        "backend": "local://?oversubscribe=1",
        "models": [
            {"name": k, "source": SRC, "params": {"kind": k}} for k in ("nb", "tree", "logreg")
        ],
        "apps": {
            "vote": {
                "slo_ms": 3000,
                "default_output": -1,
                "input": {"dtype": "float32", "shape": [64]},
                "selection": {
                    "policy": "exp4",
                    "models": ["nb", "tree", "logreg"],
                    "params": {"eta": 0.5},
                    "confidence_threshold": 0.5,
                    "per_user": True,
                    "store": store,
                },
            }
        },
    }


def test_selection_block_round_trip_and_validation(tmp_path):
    d = _deployment(str(tmp_path / "s.db"))
    dep = Deployment.from_dict(d)
    again = Deployment.from_dict(json.loads(json.dumps(dep.to_dict())))
    assert again == dep and again.apps[0].selection.policy == "exp4"
    assert not dep.apps[0].pipeline
    bad = json.loads(json.dumps(d))
    bad["apps"]["vote"]["selection"]["confidence_threshold"] = 2
    with pytest.raises(ValidationError, match="confidence_threshold"):
        Deployment.from_dict(bad)
    bad["apps"]["vote"]["selection"] = {"policy": "exp4", "models": [], "per_user": True}
    with pytest.raises(ValidationError, match=r"selection\.models"):
        Deployment.from_dict(bad)
    with pytest.raises(ValidationError, match="bogus"):
        SelectionAppSpec.from_dict({"policy": "exp3", "models": ["a"], "bogus": 1})


@pytest.mark.parametrize(
    ("selection", "field"),
    [({"policy": "nope"}, "policy"), ({"params": {"bogus": 1}}, "params")],
)
def test_a_bad_policy_fails_by_field_before_any_replica_starts(tmp_path, selection, field):
    d = _deployment(str(tmp_path / "s.db"))
    d["apps"]["vote"]["selection"].update(selection)
    # a backend scheme nobody offers: reaching the backend would fail with another error
    d["backend"] = "no-such-backend://x"
    with pytest.raises(ValidationError) as err:
        asyncio.run(start_service(Deployment.from_dict(d)))
    assert err.value.field == f"apps.vote.selection.{field}", str(err.value)


def test_ensemble_app_feedback_by_id_input_and_user(tmp_path):
    store = tmp_path / "sel.db"
    dep = Deployment.from_dict(_deployment(str(store)))
    _, _, xte, yte = digits_data()

    async def main():
        svc = await start_service(dep)
        try:
            app = create_app(svc, routers=[make_selection_router], close_service_on_shutdown=False)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                answers = []
                for i in range(30):
                    r = await c.post("/apps/vote/predict", json={"input": xte[i].tolist()})
                    assert r.status_code == 200, r.text
                    out = r.json()["output"]
                    answers.append(out)
                    # a low-confidence default is said at the top of the response too
                    assert r.json()["default"] == out["default"]
                    assert r.json().get("default_explanation") == out.get("default_explanation")
                    fb = await c.post(
                        "/apps/vote/feedback",
                        json={"query_id": out["selection_query_id"], "label": int(yte[i])},
                    )
                    assert fb.status_code == 200, fb.text
                    assert fb.json()["models_observed"] == ["logreg", "nb", "tree"]
                    if i == 0:  # a client's retry counts once; another label is refused
                        again = await c.post(
                            "/apps/vote/feedback",
                            json={"query_id": out["selection_query_id"], "label": int(yte[i])},
                        )
                        assert again.status_code == 200, again.text
                        assert again.json() == {**fb.json(), "duplicate": True}
                        other = await c.post(
                            "/apps/vote/feedback",
                            json={
                                "query_id": out["selection_query_id"],
                                "label": int(yte[i]) + 1,
                            },
                        )
                        assert other.status_code == 422, other.text
                        assert other.json()["field"] == "label", other.text
                # per-user context, feedback by input
                r = await c.post(
                    "/apps/vote/select", json={"input": xte[40].tolist(), "user": "u1"}
                )
                assert r.status_code == 200 and r.json()["output"]["user"] == "u1"
                fb = await c.post(
                    "/apps/vote/feedback",
                    json={"input": xte[40].tolist(), "label": int(yte[40]), "user": "u1"},
                )
                assert fb.status_code == 200 and fb.json()["context"] == "vote/user/u1"
                missing = await c.post("/apps/vote/feedback", json={"query_id": "nope", "label": 1})
                bad = await c.post("/apps/vote/feedback", json={"query_id": "x", "label": [1]})
                nolabel = await c.post("/apps/vote/feedback", json={"query_id": "x"})
                unknown = await c.post("/apps/none/feedback", json={"query_id": "x", "label": 1})
            state = selection_services(svc)["vote"].state()
            return answers, state, missing, bad, nolabel, unknown
        finally:
            await svc.close()

    answers, state, missing, bad, nolabel, unknown = asyncio.run(main())
    assert all(a["models_selected"] == 3 for a in answers)
    assert all(a["models_contributed"] == 3 for a in answers)  # generous SLO: no stragglers
    # outputs are labels, or the default with an explanation when fewer than half agree
    for a in answers:
        if a["default"]:
            assert a["output"] == -1 and "below the threshold" in a["default_explanation"]
    acc = np.mean([a["output"] == int(y) for a, y in zip(answers, yte[:30], strict=True)])
    assert acc > 0.7  # measured ~0.9 on these 30; digits logreg alone is ~0.97
    assert state.steps == 30
    w = dict(zip(state.models, state.weights(), strict=True))
    # logreg errs least on digits (~3% vs ~15%): it holds the (joint) highest weight
    assert w["logreg"] == pytest.approx(max(w.values())) and w["logreg"] > min(w.values())
    assert missing.status_code == 404 and bad.status_code == 422 and nolabel.status_code == 422
    assert unknown.status_code == 404
    # acknowledged feedback is durable: a fresh store on the same file sees it
    fresh = SQLiteStore(store)
    assert fresh.get("vote/global")["steps"] == 30
    assert fresh.get("vote/user/u1")["steps"] == 1
    fresh.close()
