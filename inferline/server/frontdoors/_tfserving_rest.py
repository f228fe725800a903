"""TF Serving's REST API: model status, metadata and ``:predict`` (row ``instances`` or columnar ``inputs``)."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from inferline.core import InferlineError, ValidationError
from inferline.server._http import decode_json, status_for
from inferline.server._service import Service
from inferline.server.frontdoors._door import TF_OF, FrontDoor, TensorInfo, decode_off_loop

__all__ = ["TFServingRoutes", "make_tfserving_router", "parse_path"]


def _tf_json(a: np.ndarray) -> Any:
    if a.dtype.kind in "OSU":
        return np.vectorize(
            lambda x: {"b64": base64.b64encode(x).decode()} if isinstance(x, bytes) else str(x),
            otypes=[object],
        )(a).tolist()
    return a.tolist()


def _tf_error(e: BaseException) -> Response:
    status = status_for(e) if isinstance(e, InferlineError) else 500
    if status == 422:
        status = 400
    return Response(
        json.dumps({"error": str(e)}), status_code=status, media_type="application/json"
    )


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


class TFServingRoutes:
    """TF Serving REST routes (``/v1/models/...``) over a ``FrontDoor``."""

    def __init__(self, door: FrontDoor) -> None:
        self.door = door

    def router(self) -> APIRouter:
        r = APIRouter(tags=["TF Serving"])
        r.add_api_route("/v1/models/{path:path}", self.get, methods=["GET"])
        r.add_api_route("/v1/models/{path:path}", self.post, methods=["POST"])
        return r

    async def get(self, path: str) -> Response:
        name, what = parse_path(path)
        try:
            sig = self.door.signature(name)
        except InferlineError as e:
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

        def arr(v: Any, k: str) -> np.ndarray:
            dt = dts.get(k, "float32")
            if dt == "object":
                return np.array(_unb64(v), dtype=object)
            try:
                return np.asarray(v, dtype=dt)
            except (TypeError, ValueError) as e:
                raise ValidationError(f"inputs.{k}", f"values of {dt}", str(e)) from None

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
                return {k: arr([row[k] for row in rows], k) for k in rows[0]}, True
            return {names[0]: arr(rows, names[0])}, True
        x = body["inputs"]
        cols = x if isinstance(x, dict) else {names[0]: x}
        for k, v in cols.items():
            if isinstance(v, list) and len(v) > max_rows:
                raise ValidationError(f"inputs.{k}", f"at most {max_rows} rows", f"{len(v)} rows")
        return {k: arr(v, k) for k, v in cols.items()}, False

    async def post(self, path: str, request: Request) -> Response:
        name, what = parse_path(path)
        if what != "predict":
            return Response(
                json.dumps({"error": f"Malformed request: POST /v1/models/{path}"}),
                status_code=404,
                media_type="application/json",
            )
        try:
            self.door.check(name)
            raw = await request.body()
            tensors, row_format = await decode_off_loop(len(raw), self._decode, name, raw)
            outs = self.door.stack(
                name, await self.door.run(name, self.door.queries(name, tensors))
            )
        except InferlineError as e:
            return _tf_error(e)
        if row_format:
            if len(outs) == 1:
                (a,) = outs.values()
                res: Any = {"predictions": _tf_json(a)}
            else:
                n = next(iter(outs.values())).shape[0]
                res = {
                    "predictions": [
                        {
                            k: _tf_json(v[i])
                            if isinstance(v[i], np.ndarray)
                            else _tf_json(np.asarray(v[i]))
                            for k, v in outs.items()
                        }
                        for i in range(n)
                    ]
                }
        else:
            res = {
                "outputs": _tf_json(next(iter(outs.values())))
                if len(outs) == 1
                else {k: _tf_json(v) for k, v in outs.items()}
            }
        return Response(json.dumps(res), media_type="application/json")


def make_tfserving_router(door: FrontDoor | Service) -> APIRouter:
    """TF Serving REST routes (``/v1/models/...``) over ``door``."""
    return TFServingRoutes(door if isinstance(door, FrontDoor) else FrontDoor(door)).router()


def _brief(v: Any) -> Any:
    r = repr(v)
    return v if len(r) <= 60 else r[:57] + "..."


def _unb64(v: Any) -> Any:
    if isinstance(v, dict) and "b64" in v:
        return base64.b64decode(v["b64"])
    if isinstance(v, list):
        return [_unb64(x) for x in v]
    return v
