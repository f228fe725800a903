"""The HTTP frontend in-process: routes, errors, auth, body limits, metrics, routers.

Apps run through the real interposed queue (``Dispatcher``) with in-process replicas; the
HTTP layer is exercised with Starlette's test client (no sockets; the integration tests
cover real servers).
"""

from __future__ import annotations

import asyncio
import warnings

import pytest
from fastapi import APIRouter

from inferline.core import (
    BackendError,
    DeadlineExceededError,
    NotFoundError,
    OverloadedError,
    ValidationError,
)
from inferline.queueing import Dispatcher, FixedBatching, InProcessReplica, NoOpModel
from inferline.server import App, DefaultAnswer, InputSpec, Service
from inferline.server._http import create_app, status_for

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


class Doubler:
    def predict_batch(self, inputs):
        return [[2 * v for v in x] for x in inputs]


def _service(**app_kw) -> Service:
    d = Dispatcher()
    d.add_model("double", batching=FixedBatching(4), max_queue=app_kw.pop("max_queue", 100))
    d.set_replicas("double", [InProcessReplica("double", Doubler(), service_s=0.0)])

    async def pipeline(x, ctx):
        return await ctx.predict("double", x.tolist())

    kw = {"input_spec": InputSpec("float32", (None,)), **app_kw}
    app = App.from_pipeline("dbl", pipeline, d, 0.5, **kw)
    return Service([app], dispatcher=d, models=["double"])


@pytest.fixture
def client():
    svc = _service(default_output="nothing")
    with TestClient(create_app(svc, max_body_bytes=2000)) as c:
        yield c


def test_predict_single_and_batch(client):
    r = client.post("/apps/dbl/predict", json={"input": [1, 2.5]})
    assert r.status_code == 200
    body = r.json()
    assert body["output"] == [2.0, 5.0]
    assert body["default"] is False
    assert "default_explanation" not in body
    assert isinstance(body["query_id"], str) and body["query_id"]
    r = client.post("/apps/dbl/predict", json={"input_batch": [[1], [2, 3]], "latency_slo_ms": 50})
    assert r.status_code == 200
    res = r.json()["results"]
    assert [x["output"] for x in res] == [[2.0], [4.0, 6.0]]
    assert len({x["query_id"] for x in res}) == 2


def test_tensor_json_form_accepted(client):
    r = client.post("/apps/dbl/predict", json={"input": {"dtype": "float32", "data": [1, 2]}})
    assert r.status_code == 200 and r.json()["output"] == [2.0, 4.0]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 422, "body"),
        (b"", 422, "body"),
        (b'{"input": "text"}', 422, "input"),
        (b'{"input": [[1, 2], [3, 4]]}', 422, "input"),
        (b'{"input": [1, "x"]}', 422, "input"),
        (b'{"input": [1, NaN]}', 422, "input"),
        (b'{"input": [1], "input_batch": [[1]]}', 422, "body"),
        (b'{"inputs": [1]}', 422, "body"),
        (b'{"input_batch": []}', 422, "input_batch"),
        (b'{"input_batch": [[1], "x"]}', 422, "input_batch[1]"),
        (b'{"input": [1], "latency_slo_ms": -5}', 422, "latency_slo_ms"),
        (b'{"input": [1], "latency_slo_ms": true}', 422, "latency_slo_ms"),
        (b'{"input": {"dtype": "object", "data": [1]}}', 422, "input.dtype"),
    ],
)
def test_bad_requests_are_4xx_naming_the_field(client, body, status, field):
    r = client.post("/apps/dbl/predict", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    j = r.json()
    assert j["detail"]
    if field is not None:
        assert j["field"] == field
        assert j["error"] == "ValidationError"
    # and the server still answers
    assert client.post("/apps/dbl/predict", json={"input": [1]}).status_code == 200


def test_unknown_app_is_404_listing_known(client):
    r = client.post("/apps/nope/predict", json={"input": [1]})
    assert r.status_code == 404
    assert r.json()["known"] == ["dbl"]
    assert "nope" in r.json()["detail"]


def test_body_limit_413_with_and_without_length(client):
    big = b'{"input": [' + b"1," * 1500 + b"1]}"
    r = client.post("/apps/dbl/predict", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["limit_bytes"] == 2000

    def chunks():
        for i in range(0, len(big), 100):
            yield big[i : i + 100]

    r = client.post(
        "/apps/dbl/predict", content=chunks(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413
    assert client.get("/healthz").status_code == 200


def test_token_required_on_every_endpoint():
    svc = _service()
    with TestClient(create_app(svc, token="s3cret")) as c:
        for method, path in [
            ("post", "/apps/dbl/predict"),
            ("get", "/healthz"),
            ("get", "/metrics"),
            ("get", "/openapi.json"),
            ("get", "/apps"),
        ]:
            assert getattr(c, method)(path).status_code == 401
            wrong = {"Authorization": "Bearer nope"}
            assert getattr(c, method)(path, headers=wrong).status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert c.post("/apps/dbl/predict", json={"input": [1]}, headers=ok).status_code == 200
        assert c.get("/openapi.json", headers=ok).status_code == 200


def test_health_metrics_openapi(client):
    client.post("/apps/dbl/predict", json={"input": [1]})
    client.post("/apps/dbl/predict", json={"input": "bad"})
    h = client.get("/healthz").json()
    assert h["status"] == "ok" and h["apps"] == ["dbl"]
    m = client.get("/metrics").text
    assert 'inferline_requests_total{app="dbl",outcome="ok"}' in m
    assert 'inferline_requests_total{app="dbl",outcome="invalid"} 1.0' in m
    assert 'inferline_queue_length{model="double"} 0.0' in m
    assert "inferline_request_latency_seconds_bucket" in m
    spec = client.get("/openapi.json").json()
    assert "/apps/{app_name}/predict" in spec["paths"]
    req = spec["paths"]["/apps/{app_name}/predict"]["post"]["requestBody"]
    assert "input_batch" in req["content"]["application/json"]["schema"]["properties"]
    assert client.get("/apps").json()["apps"]["dbl"]["slo_ms"] == 500.0


def test_metrics_watch_records_batches():
    svc = _service()
    svc.metrics.watch(svc.dispatcher)
    with TestClient(create_app(svc)) as c:
        c.post("/apps/dbl/predict", json={"input_batch": [[1], [2], [3]]})
        m = c.get("/metrics").text
    # the three queries went in batches (max 4): the histograms count those batches and
    # their sizes add up to 3 (a series merely present passed with no batch recorded)
    from prometheus_client.parser import text_string_to_metric_families

    samples = {
        (s.name, s.labels.get("model")): s.value
        for fam in text_string_to_metric_families(m)
        for s in fam.samples
    }
    batches = samples[("inferline_batch_size_count", "double")]
    assert 1 <= batches <= 3
    assert samples[("inferline_batch_size_sum", "double")] == 3
    assert samples[("inferline_batch_latency_seconds_count", "double")] == batches


async def _slow(x, slo):
    await asyncio.sleep(0.3)
    return "late"


def test_default_output_when_slo_passes_and_respond_by_slo():
    svc = Service([App("slow", _slow, 0.02, default_output=-1, respond_by_slo=True)])
    with TestClient(create_app(svc)) as c:
        r = c.post("/apps/slow/predict", json={"input": 1})
        assert r.status_code == 200
        j = r.json()
        assert j["default"] is True and j["output"] == -1
        assert "20 ms" in j["default_explanation"]


def test_no_answer_in_time_without_a_default_is_a_504_counted_as_an_error():
    """The bound is max_wait_s; the message names the app, the wait and the query's SLO (it
    said "model 'slow'" and a negative overshoot when the request's SLO was the shorter)."""
    svc = Service([App("slow", _slow, 1.0, max_wait_s=0.05)])
    with TestClient(create_app(svc)) as c:
        r = c.post("/apps/slow/predict", json={"input": 1, "latency_slo_ms": 20})
        assert r.status_code == 504, r.text
        assert r.json()["detail"] == "app 'slow': no prediction within 50 ms (SLO 20 ms)"
        m = c.get("/metrics").text
        assert 'inferline_requests_total{app="slow",outcome="error"} 1.0' in m
        assert 'outcome="default"' not in m


def test_a_pipelines_own_default_is_said_and_counted():
    """A pipeline answering DefaultAnswer (a selection app below its confidence threshold):
    default at the top of the response, and counted in /metrics under its reason."""

    async def unsure(x, slo):
        return DefaultAnswer({"inner": x}, "confidence 0.33 below the threshold 0.50", "selection")

    svc = Service([App("unsure", unsure, 1.0)])
    with TestClient(create_app(svc)) as c:
        j = c.post("/apps/unsure/predict", json={"input": 1}).json()
        assert j["default"] is True and j["output"] == {"inner": 1}
        assert j["default_explanation"] == "confidence 0.33 below the threshold 0.50"
        m = c.get("/metrics").text
        assert 'inferline_requests_total{app="unsure",outcome="default"} 1.0' in m
        assert 'reason="selection"' in m


def _raiser(exc):
    async def handler(x, slo):
        raise exc

    return handler


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (OverloadedError("m", 10), 503),
        (BackendError("local://", "connection lost"), 502),
        (DeadlineExceededError("m", 0.1), 504),
        (ValidationError("x", "a thing", 1), 422),
        (NotFoundError("model", "zz"), 404),
    ],
)
def test_errors_map_to_statuses_without_default(exc, status):
    svc = Service([App("a", _raiser(exc), 1.0)])
    with TestClient(create_app(svc)) as c:
        r = c.post("/apps/a/predict", json={"input": 1})
    assert r.status_code == status == status_for(exc)
    assert r.json()["error"] == type(exc).__name__
    if status == 503:
        assert r.headers["retry-after"] == "1"


def test_backend_error_gives_default_when_app_has_one_but_overload_stays_503():
    svc = Service(
        [
            App("b", _raiser(BackendError("local://", "replica died")), 1.0, default_output=0),
            App("o", _raiser(OverloadedError("m", 5)), 1.0, default_output=0),
        ]
    )
    with TestClient(create_app(svc)) as c:
        r = c.post("/apps/b/predict", json={"input": 1})
        assert r.status_code == 200 and r.json()["default"] is True
        assert "replica died" in r.json()["default_explanation"]
        assert c.post("/apps/o/predict", json={"input": 1}).status_code == 503
        m = c.get("/metrics").text
    assert 'inferline_default_outputs_total{app="b",reason="error"} 1.0' in m


def test_real_queue_overload_is_503():
    d = Dispatcher()
    d.add_model("m", batching=FixedBatching(1), max_queue=2)
    d.set_replicas("m", [InProcessReplica("m", NoOpModel(), service_s=0.2)])

    async def pipeline(x, ctx):
        return await ctx.predict("m", x)

    svc = Service([App.from_pipeline("q", pipeline, d, 1.0)], dispatcher=d, models=["m"])
    with TestClient(create_app(svc)) as c:
        r = c.post("/apps/q/predict", json={"input_batch": list(range(6))})
    assert r.status_code == 200
    statuses = [x.get("status", 200) for x in r.json()["results"]]
    assert statuses.count(503) >= 3
    assert statuses.count(200) >= 1
    errs = [x for x in r.json()["results"] if x.get("status") == 503]
    assert errs[0]["error"] == "OverloadedError" and errs[0]["model"] == "m"


def test_mounted_router_shares_service_and_error_rendering():
    def make_router(service: Service) -> APIRouter:
        r = APIRouter(prefix="/extra")

        @r.get("/apps")
        async def apps():
            return {"n": len(service.apps)}

        @r.get("/boom")
        async def boom():
            raise NotFoundError("user", 7, [1, 2])

        @r.get("/typed/{k}")
        async def typed(k: int):
            return {"k": k}

        return r

    svc = _service()
    with TestClient(create_app(svc, token="t", routers=[make_router])) as c:
        h = {"Authorization": "Bearer t"}
        assert c.get("/extra/apps").status_code == 401
        assert c.get("/extra/apps", headers=h).json() == {"n": 1}
        r = c.get("/extra/boom", headers=h)
        assert r.status_code == 404 and r.json()["known"] == [1, 2]
        r = c.get("/extra/typed/notanint", headers=h)
        assert r.status_code == 422 and r.json()["field"] == "path.k"


def test_input_spec_roundtrip_and_describe():
    s = InputSpec("int64", (2, None))
    assert InputSpec.from_dict(s.to_dict()) == s
    assert s.describe() == "an array of int64 with shape (2, *)"
    with pytest.raises(ValidationError, match="non-integer"):
        s.check([[1.5], [2]], "input")
    with pytest.raises(ValidationError):
        InputSpec.from_dict({"dtype": "nope"})
    # JSON booleans are not numbers, for floats as for integers
    f = InputSpec("float32", (None,))
    with pytest.raises(ValidationError, match="true/false"):
        f.check([0.5, True], "input")
    with pytest.raises(ValidationError, match="strings"):
        f.check([0.5, "1.5"], "input")
    assert f.check([0.5, "1.5"], "input", non_numbers=False).tolist() == [0.5, 1.5]  # skipped
    with pytest.raises(ValidationError, match="non-integer"):
        InputSpec("int64").check([1, False], "input")
    assert f.check([0.5, 1], "input").tolist() == [0.5, 1.0]


def test_outputs_arrays_numpy_scalars_and_unencodable():
    import numpy as np

    async def arrays(x, slo):
        return {"a": np.arange(3, dtype=np.int32), "s": np.float32(1.5), "b": b"\x00\x01"}

    async def nan(x, slo):
        return float("nan")

    async def aset(x, slo):
        return {1, 2}

    svc = Service([App("arr", arrays, 1.0), App("nan", nan, 1.0), App("set", aset, 1.0)])
    with TestClient(create_app(svc)) as c:
        out = c.post("/apps/arr/predict", json={"input": 1}).json()["output"]
        assert out["a"]["dtype"] == "int32" and out["a"]["shape"] == [3]
        assert out["s"] == 1.5 and out["b"] == {"bytes_b64": "AAE="}
        for name in ("nan", "set"):
            r = c.post(f"/apps/{name}/predict", json={"input": 1})
            assert r.status_code == 500 and r.json()["error"] == "OutputError"
        # a tagged array input is decoded even without an input spec
        r = c.post("/apps/arr/predict", json={"input": {"dtype": "float32", "data": [1, 2]}})
        assert r.status_code == 200


def test_inputs_decoded_only_when_tagged():
    async def kind(x, slo):
        return type(x).__name__ if not isinstance(x, list) else [type(v).__name__ for v in x]

    svc = Service([App("k", kind, 1.0)])
    with TestClient(create_app(svc)) as c:
        post = c.post
        assert post("/apps/k/predict", json={"input": [1, 2]}).json()["output"] == ["int", "int"]
        tagged = {"input": {"dtype": "int8", "shape": [2], "b64": "AQI="}}
        assert post("/apps/k/predict", json=tagged).json()["output"] == "ndarray"
        nested = {"input": [{"bytes_b64": "AAE="}, 3]}
        assert post("/apps/k/predict", json=nested).json()["output"] == ["bytes", "int"]


def test_health_does_not_count_a_replica_that_stopped_answering_heartbeats():
    """A replica the backend marks unresponsive (hung, not yet replaced) is not serving."""

    class _Handle:  # a fake: only the attribute Service.health reads
        def __init__(self, unresponsive: bool) -> None:
            self.unresponsive = unresponsive

    class _Backend:  # a fake backend: two replicas of m, one of them hung
        def replicas(self, model):
            return [_Handle(False), _Handle(True)] if model == "m" else [_Handle(True)]

    svc = Service([App("dbl", _slow, 1.0)], backend=_Backend(), models=["m", "n"])
    h = svc.health()
    assert h["replicas"] == {"m": 1, "n": 0} and h["unresponsive"] == {"m": 1, "n": 1}
    assert h["status"] == "degraded"
