"""TF Serving's REST API: model status, metadata and ``:predict`` (row ``instances`` or columnar ``inputs``)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from inferline.core import InferlineError, ValidationError, cast_exact
from inferline.server._http import decode_json, status_for
from inferline.server._service import Service
from inferline.server.frontdoors._door import TF_OF, FrontDoor, TensorInfo, decode_off_loop

__all__ = [
    "SIGNATURE_NAME",
    "PredictFastPath",
    "TFServingRoutes",
    "make_tfserving_router",
    "parse_path",
    "servable",
]

_JSON = "application/json"
_PREFIX = "/v1/models/"

# The one signature and the one version a front door serves (no version labels).
SIGNATURE_NAME = "serving_default"
VERSION = "1"


def _tf_json(a: np.ndarray) -> Any:
    if a.dtype.kind in "OSU":
        return np.vectorize(
            lambda x: {"b64": base64.b64encode(x).decode()} if isinstance(x, bytes) else str(x),
            otypes=[object],
        )(a).tolist()
    return a.tolist()


def _tf_error_parts(e: BaseException) -> tuple[int, bytes]:
    if isinstance(e, TFServingError):
        status = e.status
    else:
        status = status_for(e) if isinstance(e, InferlineError) else 500
    if status == 422:
        status = 400
    return status, json.dumps({"error": str(e)}).encode()


def _tf_error(e: BaseException) -> Response:
    status, body = _tf_error_parts(e)
    return Response(body, status_code=status, media_type=_JSON)


def parse_path(path: str) -> tuple[str, str]:
    """A ``/v1/models/...`` path as (model, what): status, metadata, predict or bad."""
    # {m}, {m}/metadata, {m}:predict, {m}/versions/{v}[...], {m}/labels/{l}[...]
    verb = ""
    if ":" in path:
        path, verb = path.rsplit(":", 1)
    parts = path.split("/")
    name = parts[0]
    rest = parts[1:]
    if len(rest) >= 2 and rest[0] in ("versions", "labels"):
        if rest[0] == "versions" and not rest[1].isdigit():
            return name, "bad"  # TF Serving's versions are numbers
        rest = rest[2:]
    if rest == ["metadata"] and not verb:
        return name, "metadata"
    if rest:
        return name, "bad"
    return name, verb or "status"


class TFServingError(Exception):
    """An answer in TF Serving's own words: ``status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def servable(name: str, path: str) -> None:
    """The version or label a path names, as TF Serving answers for one it does not serve:
    404 "Servable not found" (a front door serves version 1 and no labels)."""
    parts = path.split(":", 1)[0].split("/")
    if len(parts) >= 3 and parts[1] == "versions" and parts[2] != VERSION:
        raise TFServingError(404, f"Servable not found for request: Specific({name}, {parts[2]})")
    if len(parts) >= 3 and parts[1] == "labels":
        raise TFServingError(
            404,
            f"Servable not found for request: Labelled({name}, {parts[2]}): "
            "unrecognized servable version label",
        )


_INT_RANGES = {
    d: (int(np.iinfo(d).min), int(np.iinfo(d).max))
    for d in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
}
_TF_TYPE = {"float32": "float", "float64": "double", "float16": "half", "object": "string"}


def _leaf_ok(dt: str) -> Any:
    """Whether one JSON value is a value of ``dt`` as TF Serving reads it: numbers (not
    booleans, not strings) for floats, whole numbers in range for integers, JSON booleans for
    bool, strings or ``{"b64": ...}`` for strings."""
    if dt.startswith("float"):
        return lambda x: type(x) is int or type(x) is float
    if dt in _INT_RANGES:
        lo, hi = _INT_RANGES[dt]
        return lambda x: type(x) is int and lo <= x <= hi
    if dt == "bool":
        return lambda x: type(x) is bool
    if dt == "object":
        return lambda x: (
            type(x) is str or (type(x) is dict and list(x) == ["b64"] and type(x["b64"]) is str)
        )
    return lambda x: True


def _bad_leaf(v: Any, ok: Any) -> tuple[int, ...] | None:
    """The index path of the first value ``ok`` refuses in nested lists (None: none)."""
    if type(v) is list:
        for i, x in enumerate(v):
            if type(x) is list:
                p = _bad_leaf(x, ok)
                if p is not None:
                    return (i, *p)
            elif not ok(x):
                return (i,)
        return None
    return None if ok(v) else ()


def _json_type(x: Any) -> str:
    if isinstance(x, bool):
        return "Bool"
    if isinstance(x, int | float):
        return "Number"
    return {str: "String", dict: "Object", list: "Array"}.get(type(x), "Null")


def check_values(v: Any, dt: str, field: Any) -> None:
    """TF Serving's check of a tensor's JSON values: 400 ``JSON Value: "0.5" Type: String is
    not of expected type: float`` (here with the field it was found in). ``field``: the path
    of indexes -> the field's name."""
    path = _bad_leaf(v, _leaf_ok(dt))
    if path is None:
        return
    x = v
    for i in path:
        x = x[i]
    shown = json.dumps(x)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise TFServingError(
        400,
        f"JSON Value: {shown} Type: {_json_type(x)} is not of expected type: "
        f"{_TF_TYPE.get(dt, dt)} ({field(path)})",
    )


def _at(prefix: str) -> Any:
    return lambda path: prefix + "".join(f"[{i}]" for i in path)


_TF_ERROR = {
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["error"],
                "properties": {"error": {"type": "string"}},
            }
        }
    }
}
_TF_OBJECT = {"content": {"application/json": {"schema": {"type": "object"}}}}
_TF_FAILURES = {
    c: {"description": d, **_TF_ERROR}
    for c, d in (
        (400, "Bad request"),
        (404, "Unknown model, version or label; or a malformed path"),
        (409, "Infeasible"),
        (502, "Backend error"),
        (503, "Overloaded or closing"),
        (504, "Deadline exceeded"),
    )
}


class TFServingRoutes:
    """TF Serving REST routes (``/v1/models/...``) over a ``FrontDoor``."""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door

    def router(self) -> APIRouter:
        r = APIRouter(tags=["TF Serving"])
        r.add_api_route(
            "/v1/models/{path:path}",
            self.get,
            methods=["GET"],
            summary="Model status or metadata: {model}[/versions/1][/metadata]",
            response_class=Response,
            responses={200: {"description": "Status or metadata", **_TF_OBJECT}, **_TF_FAILURES},
        )
        r.add_api_route(
            "/v1/models/{path:path}",
            self.post,
            methods=["POST"],
            summary="Predict: {model}[/versions/1]:predict",
            response_class=Response,
            openapi_extra={
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
            responses={200: {"description": "Predictions", **_TF_OBJECT}, **_TF_FAILURES},
        )
        return r

    async def get(self, path: str) -> Response:
        name, what = parse_path(path)
        try:
            sig = await self.door.describe(name)
            servable(name, path)
        except (InferlineError, TFServingError) as e:
            return _tf_error(e)
        if what == "status":
            # TF Serving's states: a model whose replicas are down is being loaded again
            up = self.door.ready(name)
            body: dict[str, Any] = {
                "model_version_status": [
                    {
                        "version": "1",
                        "state": "AVAILABLE" if up else "LOADING",
                        "status": {
                            "error_code": "OK" if up else "UNAVAILABLE",
                            "error_message": "" if up else "no serving replica",
                        },
                    }
                ]
            }
        elif what == "metadata":

            def info(t: TensorInfo) -> dict[str, Any]:
                dims = [{"size": "-1", "name": ""}] + [
                    {"size": str(s), "name": ""} for s in t.shape
                ]
                return {
                    "dtype": TF_OF.get(t.dtype, "DT_FLOAT"),
                    "tensor_shape": {"dim": dims, "unknown_rank": False},
                    "name": t.name,
                }

            sd = {
                "inputs": {t.name: info(t) for t in sig.inputs},
                "outputs": {t.name: info(t) for t in sig.outputs},
                "method_name": "tensorflow/serving/predict",
            }
            body = {
                "model_spec": {"name": name, "signature_name": "", "version": "1"},
                "metadata": {"signature_def": {"signature_def": {"serving_default": sd}}},
            }
        else:
            return Response(
                json.dumps({"error": f"Malformed request: GET /v1/models/{path}"}),
                status_code=404,
                media_type="application/json",
            )
        return Response(json.dumps(body), media_type="application/json")

    def _decode(self, name: str, raw: bytes) -> tuple[dict[str, np.ndarray], bool]:
        """A ``:predict`` body as named batched tensors, and whether it was in row format."""
        body = decode_json(raw)
        if not isinstance(body, dict):
            raise ValidationError("body", "a JSON object", type(body).__name__)
        sig = self.door.signature(name)
        names = [t.name for t in sig.inputs]
        dts = {t.name: t.dtype for t in sig.inputs}
        max_rows = self.door.max_rows

        sig_name = body.get("signature_name", SIGNATURE_NAME)
        if sig_name not in ("", SIGNATURE_NAME):
            raise TFServingError(
                400, f"Serving signature name: {json.dumps(sig_name)} not found in signature def"
            )

        def arr(v: Any, k: str, field: Any) -> np.ndarray:
            dt = dts.get(k, "float32")
            check_values(v, dt, field)
            if dt == "object":
                return np.array(_unb64(v), dtype=object)
            try:
                a = np.asarray(v)
            except (TypeError, ValueError) as e:
                raise ValidationError(f"inputs.{k}", f"values of {dt}", str(e)) from None
            if a.dtype.kind == "O":
                raise ValidationError(f"inputs.{k}", f"a rectangular list of {dt}", "ragged")
            return cast_exact(a, dt, f"inputs.{k}")  # 1e300 is no float32

        if ("instances" in body) == ("inputs" in body):
            raise ValidationError("body", "exactly one of 'instances' or 'inputs'", sorted(body))
        if "instances" in body:
            rows = body["instances"]
            if not isinstance(rows, list) or not rows:
                raise ValidationError("instances", "a non-empty list", _brief(rows))
            if len(rows) > max_rows:
                raise ValidationError("instances", f"at most {max_rows} rows", f"{len(rows)} rows")
            if isinstance(rows[0], dict):
                keys = set(rows[0])
                for i, row in enumerate(rows):
                    if not isinstance(row, dict) or set(row) != keys:
                        raise ValidationError(
                            f"instances[{i}]",
                            f"an object with the keys of instances[0] {sorted(keys)}",
                            _brief(row) if not isinstance(row, dict) else sorted(row),
                        )
                return {
                    k: arr(
                        [row[k] for row in rows],
                        k,
                        lambda p, k=k: f"instances[{p[0]}].{k}" + _at("")(p[1:]),
                    )
                    for k in rows[0]
                }, True
            return {names[0]: arr(rows, names[0], _at("instances"))}, True
        x = body["inputs"]
        cols = x if isinstance(x, dict) else {names[0]: x}
        for k, v in cols.items():
            if isinstance(v, list) and len(v) > max_rows:
                raise ValidationError(f"inputs.{k}", f"at most {max_rows} rows", f"{len(v)} rows")
        return {
            k: arr(v, k, _at(f"inputs.{k}" if isinstance(x, dict) else "inputs"))
            for k, v in cols.items()
        }, False

    async def post(self, path: str, request: Request) -> Response:
        status, body = await self.answer_post(path, await request.body())
        return Response(body, status_code=status, media_type=_JSON)

    async def answer_post(self, path: str, raw: bytes) -> tuple[int, bytes]:
        """One ``POST /v1/models/{path}``, start to end: ``(status, JSON body)``, what the
        FastAPI route and the raw ASGI fast path (``PredictFastPath``) both send. TF
        Serving's REST API has no per-request deadline: its queries get the SLO."""
        name, what = parse_path(path)
        if what != "predict":
            return 404, json.dumps({"error": f"Malformed request: POST /v1/models/{path}"}).encode()
        try:
            self.door.check(name)
            servable(name, path)
            tensors, row_format = await decode_off_loop(len(raw), self._decode, name, raw)
            queries = self.door.queries(name, tensors)
            outs = self.door.stack(name, await self.door.run(name, queries))
        except (InferlineError, TFServingError) as e:
            return _tf_error_parts(e)
        # every output may be left out (None): rows are still rows
        return 200, json.dumps(_predict_body(outs, len(queries), row_format)).encode()


def _predict_body(outs: dict[str, np.ndarray], n: int, row_format: bool) -> dict[str, Any]:
    if not row_format:
        return {
            "outputs": _tf_json(next(iter(outs.values())))
            if len(outs) == 1
            else {k: _tf_json(v) for k, v in outs.items()}
        }
    if len(outs) == 1:
        (a,) = outs.values()
        return {"predictions": _tf_json(a)}
    return {
        "predictions": [
            {
                k: _tf_json(v[i]) if isinstance(v[i], np.ndarray) else _tf_json(np.asarray(v[i]))
                for k, v in outs.items()
            }
            for i in range(n)
        ]
    }


class PredictFastPath:
    """``POST /v1/models/{path}`` for the raw ASGI layer (``_predict_route.FastRoutes``):
    every POST under ``/v1/models/`` (FastAPI's ``{path:path}`` matches them all), answered
    by ``TFServingRoutes.answer_post``."""

    def __init__(self, routes: TFServingRoutes) -> None:
        self.routes = routes

    def match(self, path: str) -> str | None:
        return path[len(_PREFIX) :] if path.startswith(_PREFIX) else None

    async def answer(
        self, path: str, raw: bytes, headers: list[tuple[bytes, bytes]]
    ) -> tuple[int, bytes, str, dict[str, str] | None]:
        status, body = await self.routes.answer_post(path, raw)
        return status, body, _JSON, None


def make_tfserving_router(door: FrontDoor | Service) -> APIRouter:
    """TF Serving REST routes (``/v1/models/...``) over ``door``."""
    routes = TFServingRoutes(door if isinstance(door, FrontDoor) else FrontDoor(door))
    r = routes.router()
    # create_app puts these in front of FastAPI's routing (the data path)
    r.inferline_fast_paths = [PredictFastPath(routes)]  # type: ignore[attr-defined]
    return r


def _brief(v: Any) -> Any:
    r = repr(v)
    return v if len(r) <= 60 else r[:57] + "..."


def _unb64(v: Any) -> Any:
    if isinstance(v, dict) and "b64" in v:
        return base64.b64decode(v["b64"])
    if isinstance(v, list):
        return [_unb64(x) for x in v]
    return v
