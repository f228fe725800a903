"""Protocol-compatible front doors: inferline also speaks KServe v2 and TF Serving's Predict.

Existing Triton or TF Serving clients point at inferline instead of the server and keep
working: every row of a request's batch becomes one query of inferline's queue (an app's
pipeline, or a model of the dispatcher directly), so the EDF queue and the plan decide how
it is batched and where it runs; the answers are stacked back into the protocol's tensors.

* KServe v2 over HTTP (``make_kserve_router``): ``GET /v2``, ``/v2/health/live|ready``,
  ``GET /v2/models/{m}``, ``/v2/models/{m}/ready``, ``POST /v2/models/{m}/infer`` (JSON
  ``data`` or the binary tensor extension tritonclient uses by default);
* TF Serving REST (``make_tfserving_router``): ``GET /v1/models/{m}`` (status),
  ``GET /v1/models/{m}/metadata``, ``POST /v1/models/{m}[/versions/{v}]:predict`` (row
  ``instances`` or columnar ``inputs``);
* gRPC (``FrontDoorGrpc``): KServe's ``inference.GRPCInferenceService`` (tritonclient's
  generated definitions) and TF Serving's ``PredictionService``/``ModelService`` (when the
  ``tensorflow-serving-api`` stubs are installed) on one port.

The HTTP routes are ordinary routers for ``create_app(routers=...)``, so they sit behind the
frontend's bearer-token and body-size guard. The gRPC server checks the same token
(``authorization: Bearer ...`` metadata), caps messages at the body limit and binds
127.0.0.1 unless told otherwise.

A served name's tensors are described by a ``Signature`` (names, dtypes, per-query shapes);
``inferline attach`` passes the ones it discovered so the names match the original server.
Without one, an app's ``InputSpec`` gives the input, and outputs are named ``output`` (or by
the keys of a dict output).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from inferline.core import InferlineError, NotFoundError, ValidationError

from ._app import decode_json, error_body, status_for
from ._service import Service

__all__ = [
    "FrontDoor",
    "FrontDoorGrpc",
    "Signature",
    "TensorInfo",
    "make_kserve_router",
    "make_tfserving_router",
]

log = logging.getLogger(__name__)

KSERVE_DTYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}
_KSERVE_OF = {v: k for k, v in KSERVE_DTYPES.items()}
TF_DTYPES = {
    "DT_FLOAT": "float32",
    "DT_DOUBLE": "float64",
    "DT_INT32": "int32",
    "DT_UINT8": "uint8",
    "DT_INT16": "int16",
    "DT_INT8": "int8",
    "DT_INT64": "int64",
    "DT_BOOL": "bool",
    "DT_UINT16": "uint16",
    "DT_HALF": "float16",
    "DT_UINT32": "uint32",
    "DT_UINT64": "uint64",
    "DT_STRING": "object",
}
_TF_OF = {v: k for k, v in TF_DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """One named tensor: numpy dtype name and per-query shape (-1: any size)."""

    name: str
    dtype: str = "float32"
    shape: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorInfo:
        return cls(
            str(d["name"]),
            str(d.get("dtype", "float32")),
            tuple(int(s) for s in d.get("shape", ())),
        )


@dataclass(frozen=True)
class Signature:
    """The tensors of a served name (queries are rows of the batch dimension)."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Signature:
        return cls(
            tuple(TensorInfo.from_dict(t) for t in d.get("inputs", ())),
            tuple(TensorInfo.from_dict(t) for t in d.get("outputs", ())),
        )


def _dtype_name(a: np.ndarray) -> str:
    return "object" if a.dtype.kind in "OSU" else a.dtype.name


class FrontDoor:
    """Runs protocol requests through a ``Service``: names are apps (pipelines) or models of
    its dispatcher; one query per row."""

    def __init__(
        self,
        service: Service,
        signatures: Mapping[str, Signature] | None = None,
        *,
        model_slo_s: float = 1.0,
    ) -> None:
        self.service = service
        self.signatures = dict(signatures or {})
        self.model_slo_s = model_slo_s

    def names(self) -> list[str]:
        d = self.service.dispatcher
        return sorted(set(self.service.apps) | set(d.models if d is not None else ()))

    def ready(self, name: str | None = None) -> bool:
        """The server (``name`` None) or one model/app can answer now: what the KServe and
        TF Serving readiness routes report. A model with no serving replica (its backend
        down, recovering) is not ready, so a readiness probe written for Triton stops
        sending traffic to this instance."""
        h = self.service.health()
        if name is None:
            return bool(h["status"] == "ok")
        if self.service.closing or name not in self.names():
            return False
        app = self.service.apps.get(name)
        models = app.models if app is not None and app.models else (name,)
        reps = h.get("replicas", {})
        return all(reps.get(m, 1) > 0 for m in models)  # not a backend model: in process

    def check(self, name: str) -> None:
        if name not in self.names():
            raise NotFoundError("model", name, self.names())

    def signature(self, name: str) -> Signature:
        self.check(name)
        if name in self.signatures:
            return self.signatures[name]
        app = self.service.apps.get(name)
        if app is not None and app.input_spec is not None:
            shape = tuple(-1 if s is None else int(s) for s in (app.input_spec.shape or ()))
            return Signature(
                (TensorInfo("input", app.input_spec.dtype, shape),),
                (TensorInfo("output", "float32", (-1,)),),
            )
        return Signature(
            (TensorInfo("input", "float32", (-1,)),), (TensorInfo("output", "float32", (-1,)),)
        )

    def check_datatypes(self, name: str, tensors: Mapping[str, np.ndarray]) -> None:
        """KServe requests declare each input's datatype: one that is not the declared
        signature's is refused, as Triton does, rather than converted (FP64 values for an
        FP32 input lost precision silently). TF Serving's JSON has no datatype to check."""
        self.check(name)
        sig = self.signatures.get(name)
        if sig is None:
            return
        for t in sig.inputs:
            a = tensors.get(t.name)
            if a is not None and a.size and _dtype_name(a) != t.dtype:
                raise ValidationError(
                    f"inputs.{t.name}.datatype",
                    _KSERVE_OF.get(t.dtype, t.dtype),
                    _KSERVE_OF.get(_dtype_name(a), _dtype_name(a)),
                )

    def queries(self, name: str, tensors: Mapping[str, np.ndarray]) -> list[Any]:
        """Split named batched tensors into per-row queries."""
        sig = self.signature(name)
        want = [t.name for t in sig.inputs]
        if name not in self.signatures and len(tensors) == 1:
            want = list(tensors)  # no declared signature: take the one input by any name
        if set(tensors) != set(want):
            raise ValidationError("inputs", f"the tensors {want}", sorted(tensors))
        sizes = {int(a.shape[0]) if a.ndim else -1 for a in tensors.values()}
        if len(sizes) != 1 or -1 in sizes:
            raise ValidationError(
                "inputs", "tensors with one batch dimension of the same size", sorted(sizes)
            )
        (n,) = sizes
        if len(want) == 1:
            return [tensors[want[0]][i] for i in range(n)]
        return [{k: tensors[k][i] for k in want} for i in range(n)]

    async def run(self, name: str, queries: Sequence[Any]) -> list[Any]:
        """Outputs of ``queries``, in order; raises the first query's error."""
        self.check(name)
        svc = self.service
        if name in svc.apps:
            app = svc.apps[name]
            xs = [
                svc.check_input(app, q, f"inputs[{i}]") if app.input_spec is not None else q
                for i, q in enumerate(queries)
            ]
            preds = await asyncio.gather(
                *(svc.predict(name, x) for x in xs), return_exceptions=True
            )
            outs = [p if isinstance(p, BaseException) else p.output for p in preds]
        else:
            d = svc.dispatcher
            outs = await d.submit_many(name, list(queries), deadline=d.clock() + self.model_slo_s)
        for o in outs:
            if isinstance(o, BaseException):
                raise o
        return outs

    def stack(
        self, name: str, outs: Sequence[Any], wanted: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        """Per-query outputs as named batched tensors."""
        sig = self.signature(name)
        names = [t.name for t in sig.outputs] or ["output"]
        declared = {t.name: tuple(t.shape) for t in sig.outputs} if name in self.signatures else {}
        first = outs[0] if outs else None
        if isinstance(first, Mapping):
            cols = {str(k): [o[k] for o in outs] for k in first}
        else:
            cols = {names[0] if len(names) == 1 else "output": list(outs)}
        result = {}
        for k, vals in cols.items():
            if wanted and k not in wanted:
                continue
            try:
                result[k] = arr = np.stack([np.asarray(v) for v in vals])
            except ValueError as e:
                raise ValidationError(
                    f"outputs.{k}", "outputs of one shape across the batch", str(e)
                ) from None
            # the declared shape: a model's [1] output reaches pipelines as a scalar (a
            # label), but a client of the model's route expects the model's [n, 1]
            want = declared.get(k)
            if (
                want is not None
                and all(d >= 0 for d in want)
                and arr.shape[1:] != want
                and math.prod(arr.shape[1:]) == math.prod(want)
            ):
                result[k] = arr.reshape((arr.shape[0], *want))
        missing = [w for w in wanted if w not in result]
        if missing:
            raise ValidationError("outputs", f"names among {sorted(cols)}", missing)
        return result


# ---------------------------------------------------------------- KServe v2 over HTTP


def _bytes_elements(raw: bytes, n: int, field: str) -> np.ndarray:
    out, pos = [], 0
    for _ in range(n):
        if pos + 4 > len(raw):
            raise ValidationError(field, f"{n} length-prefixed BYTES elements", "truncated data")
        (k,) = struct.unpack_from("<I", raw, pos)
        out.append(raw[pos + 4 : pos + 4 + k])
        pos += 4 + k
    return np.array(out, dtype=object)


def _bytes_serialize(a: np.ndarray) -> bytes:
    parts = []
    for x in a.reshape(-1).tolist():
        b = x.encode() if isinstance(x, str) else bytes(x)
        parts.append(struct.pack("<I", len(b)) + b)
    return b"".join(parts)


def _tensor_from_kserve(t: Mapping[str, Any], raw: bytes | None, field: str) -> np.ndarray:
    dt = t.get("datatype")
    if dt not in KSERVE_DTYPES:
        raise ValidationError(f"{field}.datatype", f"one of {sorted(KSERVE_DTYPES)}", dt)
    shape = t.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
    ):
        raise ValidationError(f"{field}.shape", "a list of sizes", shape)
    n = math.prod(shape)  # Python ints: a huge shape cannot wrap around as np.prod would
    try:
        if raw is not None:
            if dt == "BYTES":
                return _bytes_elements(raw, n, field).reshape(shape)
            npdt = np.dtype(KSERVE_DTYPES[dt]).newbyteorder("<")
            if len(raw) != n * npdt.itemsize:
                raise ValidationError(f"{field}.data", f"{n * npdt.itemsize} bytes", len(raw))
            return np.frombuffer(raw, npdt).astype(npdt.newbyteorder("=")).reshape(shape)
        if "data" not in t:
            raise ValidationError(f"{field}.data", "the tensor's values", None)
        if dt == "BYTES":
            flat = np.array(np.asarray(t["data"], dtype=object).reshape(-1).tolist(), dtype=object)
            return flat.reshape(shape)
        vals = np.asarray(t["data"])
        _check_json_values(vals, dt, f"{field}.data")
        return vals.astype(KSERVE_DTYPES[dt]).reshape(shape)
    except (TypeError, ValueError, OverflowError) as e:
        if isinstance(e, ValidationError):
            raise
        raise ValidationError(f"{field}.data", f"{n} values of {dt}", str(e)) from None


_KIND_WORDS = {"b": "booleans", "i": "integers", "u": "integers", "f": "fractional numbers"}


def _check_json_values(vals: np.ndarray, dt: str, field: str) -> None:
    """Values of the declared datatype, as Triton reads them: JSON booleans for BOOL, integers
    in range for INT/UINT, numbers for FP. Before, numpy converted "1.5", true and 2.7 for an
    INT32 input (to 1) without a word."""
    if vals.size == 0:
        return
    kind = vals.dtype.kind
    if dt == "BOOL":
        ok, want = kind == "b", "JSON booleans"
    elif dt.startswith(("INT", "UINT")):
        ok, want = kind in "iu", f"integers that fit {dt}"
    else:
        ok, want = kind in "iuf", "JSON numbers"
    if not ok:
        got = _KIND_WORDS.get(kind, "strings" if kind in "SU" else "mixed or nested values")
        raise ValidationError(field, f"{want} for {dt}", got)
    if kind in "iu" and dt != "BOOL" and not dt.startswith("FP"):
        info = np.iinfo(KSERVE_DTYPES[dt])
        lo, hi = int(vals.min()), int(vals.max())
        if lo < info.min or hi > info.max:
            raise ValidationError(field, f"integers that fit {dt}", f"values from {lo} to {hi}")


def _params(obj: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    """An object's optional ``parameters``: a JSON object (KServe v2) or nothing."""
    p = obj.get("parameters")
    if p is None:
        return {}
    if not isinstance(p, dict):
        raise ValidationError(f"{field}.parameters", "a JSON object", type(p).__name__)
    return p


def header_length(value: str | None, body_len: int) -> int | None:
    """The ``Inference-Header-Content-Length`` header as a byte count within the body."""
    if value is None or value == "":
        return None
    try:
        n = int(value)
    except ValueError:
        n = -1
    if not 0 <= n <= body_len:
        raise ValidationError(
            "Inference-Header-Content-Length", f"a byte count in [0, {body_len}]", value
        )
    return n


def kserve_decode(
    body: bytes, header_len: int | None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A KServe v2 infer request (JSON, or JSON + binary tensors) -> (request, tensors)."""
    head, rest = (body, b"") if header_len is None else (body[:header_len], body[header_len:])
    req = decode_json(head, "a KServe v2 inference request (JSON)")
    if not isinstance(req, dict) or not isinstance(req.get("inputs"), list) or not req["inputs"]:
        raise ValidationError("inputs", "a non-empty list of input tensors", None)
    _params(req, "request")
    outputs = req.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise ValidationError("outputs", "a list of requested outputs", type(outputs).__name__)
        for i, o in enumerate(outputs):
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise ValidationError(f"outputs[{i}]", "an object with a name", o)
            _params(o, f"outputs[{i}]")
    tensors: dict[str, np.ndarray] = {}
    pos = 0
    for i, t in enumerate(req["inputs"]):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise ValidationError(f"inputs[{i}]", "an object with name, shape, datatype", t)
        size = _params(t, f"inputs[{i}]").get("binary_data_size")
        raw = None
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise ValidationError(
                    f"inputs[{i}].parameters.binary_data_size", "a byte count", size
                )
            raw = rest[pos : pos + size]
            if len(raw) != size:
                raise ValidationError(f"inputs[{i}]", f"{size} binary bytes", len(raw))
            pos += size
        tensors[t["name"]] = _tensor_from_kserve(t, raw, f"inputs[{i}]")
    return req, tensors


def kserve_encode(
    name: str, req: Mapping[str, Any], outs: Mapping[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """The response body and, for binary outputs, the JSON header's length."""
    params = req.get("parameters") or {}
    asked = {
        o["name"]: (o.get("parameters") or {})
        for o in req.get("outputs") or []
        if isinstance(o, dict)
    }
    binary_all = bool(params.get("binary_data_output", False))
    out_json, blobs = [], []
    for k, a in outs.items():
        dt = _KSERVE_OF.get(_dtype_name(a))
        if dt is None:
            raise ValidationError(f"outputs.{k}", "a numeric, bool or bytes tensor", str(a.dtype))
        entry: dict[str, Any] = {"name": k, "datatype": dt, "shape": list(a.shape)}
        if asked.get(k, {}).get("binary_data", binary_all):
            blob = (
                _bytes_serialize(a)
                if dt == "BYTES"
                else np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"))).tobytes()
            )
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            flat = a.reshape(-1).tolist()
            entry["data"] = [
                x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in flat
            ]
        out_json.append(entry)
    body: dict[str, Any] = {"model_name": name, "model_version": "1", "outputs": out_json}
    if "id" in req:
        body["id"] = req["id"]
    head = json.dumps(body, separators=(",", ":")).encode()
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)


def _kserve_error(e: BaseException) -> Response:
    status = status_for(e) if isinstance(e, InferlineError) else 500
    if status == 422:
        status = 400  # KServe clients expect 400 for a bad request
    return Response(
        json.dumps({**error_body(e), "error": str(e)}),
        status_code=status,
        media_type="application/json",
    )


def make_kserve_router(door: FrontDoor | Service) -> APIRouter:
    """KServe v2 HTTP routes over ``door`` (a ``FrontDoor``, or a ``Service`` to wrap)."""
    fd = door if isinstance(door, FrontDoor) else FrontDoor(door)
    r = APIRouter(tags=["KServe v2"])

    @r.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        from inferline import __version__

        return {"name": "inferline", "version": __version__, "extensions": ["binary_tensor_data"]}

    @r.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200)

    @r.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if fd.ready() else 503)

    @r.get("/v2/models/{model}")
    @r.get("/v2/models/{model}/versions/{version}")
    async def model_metadata(model: str, version: str = "1") -> Response:
        try:
            sig = fd.signature(model)
        except InferlineError as e:
            return _kserve_error(e)

        def meta(t: TensorInfo) -> dict[str, Any]:
            return {
                "name": t.name,
                "datatype": _KSERVE_OF.get(t.dtype, "FP32"),
                "shape": [-1, *t.shape],
            }

        body = {
            "name": model,
            "versions": ["1"],
            "platform": "inferline",
            "inputs": [meta(t) for t in sig.inputs],
            "outputs": [meta(t) for t in sig.outputs],
        }
        return Response(json.dumps(body), media_type="application/json")

    @r.get("/v2/models/{model}/ready")
    @r.get("/v2/models/{model}/versions/{version}/ready")
    async def model_ready(model: str, version: str = "1") -> Response:
        if model not in fd.names():
            return Response(status_code=400)
        return Response(status_code=200 if fd.ready(model) else 503)

    @r.post("/v2/models/{model}/infer")
    @r.post("/v2/models/{model}/versions/{version}/infer")
    async def infer(model: str, request: Request, version: str = "1") -> Response:
        hl = request.headers.get("inference-header-content-length")
        try:
            raw = await request.body()
            req, tensors = kserve_decode(raw, header_length(hl, len(raw)))
            fd.check_datatypes(model, tensors)
            outs = await fd.run(model, fd.queries(model, tensors))
            wanted = [
                o["name"] for o in req.get("outputs") or [] if isinstance(o, dict) and "name" in o
            ]
            body, header_len = kserve_encode(model, req, fd.stack(model, outs, wanted))
        except InferlineError as e:
            return _kserve_error(e)
        headers = (
            {"Inference-Header-Content-Length": str(header_len)} if header_len is not None else None
        )
        media = "application/octet-stream" if header_len is not None else "application/json"
        return Response(body, media_type=media, headers=headers)

    return r


# ---------------------------------------------------------------- TF Serving REST


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


def make_tfserving_router(door: FrontDoor | Service) -> APIRouter:
    """TF Serving REST routes (``/v1/models/...``) over ``door``."""
    fd = door if isinstance(door, FrontDoor) else FrontDoor(door)
    r = APIRouter(tags=["TF Serving"])

    def parse(path: str) -> tuple[str, str]:
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

    @r.get("/v1/models/{path:path}")
    async def get(path: str) -> Response:
        name, what = parse(path)
        try:
            sig = fd.signature(name)
        except InferlineError as e:
            return _tf_error(e)
        if what == "status":
            # TF Serving's states: a model whose replicas are down is being loaded again
            up = fd.ready(name)
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
                    "dtype": _TF_OF.get(t.dtype, "DT_FLOAT"),
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

    @r.post("/v1/models/{path:path}")
    async def post(path: str, request: Request) -> Response:
        name, what = parse(path)
        if what != "predict":
            return Response(
                json.dumps({"error": f"Malformed request: POST /v1/models/{path}"}),
                status_code=404,
                media_type="application/json",
            )
        try:
            fd.check(name)
            body = decode_json(await request.body())
            if not isinstance(body, dict):
                raise ValidationError("body", "a JSON object", type(body).__name__)
            sig = fd.signature(name)
            names = [t.name for t in sig.inputs]
            dts = {t.name: t.dtype for t in sig.inputs}

            def arr(v: Any, k: str) -> np.ndarray:
                dt = dts.get(k, "float32")
                if dt == "object":
                    return np.array(_unb64(v), dtype=object)
                try:
                    return np.asarray(v, dtype=dt)
                except (TypeError, ValueError) as e:
                    raise ValidationError(f"inputs.{k}", f"values of {dt}", str(e)) from None

            if ("instances" in body) == ("inputs" in body):
                raise ValidationError(
                    "body", "exactly one of 'instances' or 'inputs'", sorted(body)
                )
            if "instances" in body:
                rows = body["instances"]
                if not isinstance(rows, list) or not rows:
                    raise ValidationError("instances", "a non-empty list", rows)
                if isinstance(rows[0], dict):
                    keys = set(rows[0])
                    for i, row in enumerate(rows):
                        if not isinstance(row, dict) or set(row) != keys:
                            raise ValidationError(
                                f"instances[{i}]",
                                f"an object with the keys of instances[0] {sorted(keys)}",
                                row if not isinstance(row, dict) else sorted(row),
                            )
                    tensors = {k: arr([row[k] for row in rows], k) for k in rows[0]}
                else:
                    tensors = {names[0]: arr(rows, names[0])}
                row_format = True
            elif "inputs" in body:
                x = body["inputs"]
                tensors = (
                    {k: arr(v, k) for k, v in x.items()}
                    if isinstance(x, dict)
                    else {names[0]: arr(x, names[0])}
                )
                row_format = False
            outs = fd.stack(name, await fd.run(name, fd.queries(name, tensors)))
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

    return r


def _unb64(v: Any) -> Any:
    if isinstance(v, dict) and "b64" in v:
        return base64.b64decode(v["b64"])
    if isinstance(v, list):
        return [_unb64(x) for x in v]
    return v


# ---------------------------------------------------------------- gRPC


class FrontDoorGrpc:
    """KServe v2 gRPC (tritonclient's definitions) and TF Serving gRPC on one port.

    ``await start()`` in the serving loop; ``await stop()`` (also registered with
    ``service.on_close``). Services whose generated modules are not installed are skipped;
    ``services`` lists the ones that run.
    """

    def __init__(
        self,
        door: FrontDoor,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        max_message_bytes: int = 1 << 20,
    ) -> None:
        self.door = door
        self.host = host
        self.port = port
        self.token = token
        self.max_message_bytes = max_message_bytes
        self.services: list[str] = []
        self._server: Any = None

    def _authorized(self, context: Any) -> bool:
        if not self.token:
            return True
        for k, v in context.invocation_metadata() or ():
            if (
                k == "authorization"
                and v[:7].lower() == "bearer "
                and hmac.compare_digest(v[7:].strip(), self.token)
            ):
                return True
        return False

    async def start(self) -> int:
        import grpc

        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", 64 << 20),
            ]
        )
        try:
            from tritonclient.grpc import service_pb2, service_pb2_grpc

            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
                _kserve_servicer(self, service_pb2, service_pb2_grpc), server
            )
            self.services.append("inference.GRPCInferenceService")
        except ImportError as e:
            log.info("no KServe gRPC front door (tritonclient[grpc] missing: %s)", e)
        from inferline.adapters.tfserving._protos import available, stubs

        if available():
            st = stubs()
            pred, models = _tfserving_servicers(self, st)
            st.prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(pred, server)
            st.model_service_pb2_grpc.add_ModelServiceServicer_to_server(models, server)
            self.services += [
                "tensorflow.serving.PredictionService",
                "tensorflow.serving.ModelService",
            ]
        else:
            log.info("no TF Serving gRPC front door (tensorflow-serving-api missing)")
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.port = server.add_insecure_port(f"{shown}:{self.port}")
        await server.start()
        self._server = server
        self.door.service.on_close(self.stop)
        log.info("gRPC front doors %s on %s:%d", self.services, self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(0.5)


async def _grpc_fail(context: Any, e: BaseException) -> None:
    import grpc

    code = grpc.StatusCode.INTERNAL
    if isinstance(e, NotFoundError):
        code = grpc.StatusCode.NOT_FOUND
    elif isinstance(e, ValidationError):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif isinstance(e, InferlineError):
        s = status_for(e)
        code = (
            grpc.StatusCode.UNAVAILABLE
            if s == 503
            else grpc.StatusCode.DEADLINE_EXCEEDED
            if s == 504
            else grpc.StatusCode.INTERNAL
        )
    await context.abort(code, str(e))


async def _grpc_auth(g: FrontDoorGrpc, context: Any) -> None:
    import grpc

    if not g._authorized(context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


def _kserve_servicer(g: FrontDoorGrpc, pb: Any, pbg: Any) -> Any:
    fd = g.door

    def tmeta(t: TensorInfo) -> Any:
        return pb.ModelMetadataResponse.TensorMetadata(
            name=t.name, datatype=_KSERVE_OF.get(t.dtype, "FP32"), shape=[-1, *t.shape]
        )

    class KServe(pbg.GRPCInferenceServiceServicer):  # type: ignore[misc,name-defined]
        # With a token every RPC needs it, health included (as every HTTP route does).
        async def ServerLive(self, request: Any, context: Any) -> Any:
            await _grpc_auth(g, context)
            return pb.ServerLiveResponse(live=True)

        async def ServerReady(self, request: Any, context: Any) -> Any:
            await _grpc_auth(g, context)
            return pb.ServerReadyResponse(ready=fd.ready())

        async def ModelReady(self, request: Any, context: Any) -> Any:
            await _grpc_auth(g, context)
            return pb.ModelReadyResponse(ready=fd.ready(request.name))

        async def ServerMetadata(self, request: Any, context: Any) -> Any:
            await _grpc_auth(g, context)
            from inferline import __version__

            return pb.ServerMetadataResponse(
                name="inferline", version=__version__, extensions=["binary_tensor_data"]
            )

        async def ModelMetadata(self, request: Any, context: Any) -> Any:
            await _grpc_auth(g, context)
            try:
                sig = fd.signature(request.name)
            except InferlineError as e:
                await _grpc_fail(context, e)
            return pb.ModelMetadataResponse(
                name=request.name,
                versions=["1"],
                platform="inferline",
                inputs=[tmeta(t) for t in sig.inputs],
                outputs=[tmeta(t) for t in sig.outputs],
            )

        async def ModelInfer(self, request: Any, context: Any) -> Any:
            await _grpc_auth(g, context)
            try:
                tensors = {}
                raws = list(request.raw_input_contents)
                if raws and len(raws) != len(request.inputs):
                    raise ValidationError(
                        "raw_input_contents",
                        f"one entry per input ({len(request.inputs)})",
                        f"{len(raws)} entries",
                    )
                for i, t in enumerate(request.inputs):
                    d = {"name": t.name, "datatype": t.datatype, "shape": [int(s) for s in t.shape]}
                    if raws:
                        tensors[t.name] = _tensor_from_kserve(d, raws[i], f"inputs[{i}]")
                    else:
                        vals = _grpc_contents(t, f"inputs[{i}]")
                        tensors[t.name] = _tensor_from_kserve(
                            {**d, "data": vals}, None, f"inputs[{i}]"
                        )
                fd.check_datatypes(request.model_name, tensors)
                wanted = [o.name for o in request.outputs]
                outs = fd.stack(
                    request.model_name,
                    await fd.run(request.model_name, fd.queries(request.model_name, tensors)),
                    wanted,
                )
                resp = pb.ModelInferResponse(
                    model_name=request.model_name, model_version="1", id=request.id
                )
                for k, a in outs.items():
                    dt = _KSERVE_OF.get(_dtype_name(a))
                    if dt is None:
                        raise ValidationError(
                            f"outputs.{k}", "a numeric, bool or bytes tensor", str(a.dtype)
                        )
                    resp.outputs.add(name=k, datatype=dt, shape=list(a.shape))
                    resp.raw_output_contents.append(
                        _bytes_serialize(a)
                        if dt == "BYTES"
                        else np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"))).tobytes()
                    )
                return resp
            except InferlineError as e:
                await _grpc_fail(context, e)

    # The RPCs inferline does not serve (model control, statistics, shared memory, ...):
    # UNIMPLEMENTED after the token check, instead of the base class's NotImplementedError,
    # which logged a traceback per call.
    for rpc in dir(pbg.GRPCInferenceServiceServicer):
        if rpc[0].isupper() and rpc not in KServe.__dict__:
            setattr(KServe, rpc, _unimplemented(g, rpc))
    return KServe()


# KServe's typed contents field per datatype (FP16 has none: raw_input_contents only)
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _grpc_contents(t: Any, field: str) -> list[Any]:
    """The values of a typed-contents input, from the field its datatype names (values in
    another field were converted before: ints for an FP32 input, floats for INT32)."""
    want = _CONTENTS.get(t.datatype)
    if want is None:
        raise ValidationError(f"{field}.contents", f"raw_input_contents for {t.datatype}", None)
    others = [f for f in sorted(set(_CONTENTS.values())) if f != want and getattr(t.contents, f)]
    if others:
        raise ValidationError(f"{field}.contents", f"{want} for {t.datatype}", others)
    return list(getattr(t.contents, want))


def _unimplemented(g: FrontDoorGrpc, rpc: str) -> Any:
    async def method(self: Any, request: Any, context: Any) -> Any:
        import grpc

        await _grpc_auth(g, context)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"inferline does not serve {rpc}")

    return method


def _tfserving_servicers(g: FrontDoorGrpc, st: Any) -> tuple[Any, Any]:
    from inferline.adapters.tfserving._protos import from_tensor_proto, to_tensor_proto

    fd = g.door
    enums = {
        "DT_FLOAT": 1,
        "DT_DOUBLE": 2,
        "DT_INT32": 3,
        "DT_UINT8": 4,
        "DT_INT16": 5,
        "DT_INT8": 6,
        "DT_STRING": 7,
        "DT_INT64": 9,
        "DT_BOOL": 10,
    }

    class Prediction(st.prediction_service_pb2_grpc.PredictionServiceServicer):  # type: ignore[misc,name-defined]
        async def Predict(self, request: Any, context: Any) -> Any:
            await _grpc_auth(g, context)
            name = request.model_spec.name
            try:
                tensors = {
                    k: from_tensor_proto(v, f"inputs.{k}") for k, v in request.inputs.items()
                }
                outs = fd.stack(
                    name, await fd.run(name, fd.queries(name, tensors)), list(request.output_filter)
                )
            except InferlineError as e:
                await _grpc_fail(context, e)
            resp = st.predict_pb2.PredictResponse()
            resp.model_spec.name = name
            resp.model_spec.version.value = 1
            for k, a in outs.items():
                resp.outputs[k].CopyFrom(to_tensor_proto(a, st))
            return resp

        async def GetModelMetadata(self, request: Any, context: Any) -> Any:
            await _grpc_auth(g, context)
            name = request.model_spec.name
            try:
                sig = fd.signature(name)
            except InferlineError as e:
                await _grpc_fail(context, e)
            sig_map = st.get_model_metadata_pb2.SignatureDefMap()
            sd = sig_map.signature_def["serving_default"]
            sd.method_name = "tensorflow/serving/predict"
            for part, tensors in (("inputs", sig.inputs), ("outputs", sig.outputs)):
                for t in tensors:
                    ti = getattr(sd, part)[t.name]
                    ti.name = t.name
                    ti.dtype = enums.get(_TF_OF.get(t.dtype, "DT_FLOAT"), 1)
                    for s in (-1, *t.shape):
                        ti.tensor_shape.dim.add().size = int(s)
            resp = st.get_model_metadata_pb2.GetModelMetadataResponse()
            resp.model_spec.name = name
            resp.model_spec.version.value = 1
            resp.metadata["signature_def"].Pack(sig_map)
            return resp

    class Models(st.model_service_pb2_grpc.ModelServiceServicer):  # type: ignore[misc,name-defined]
        async def GetModelStatus(self, request: Any, context: Any) -> Any:
            await _grpc_auth(g, context)
            try:
                fd.check(request.model_spec.name)
            except InferlineError as e:
                await _grpc_fail(context, e)
            resp = st.get_model_status_pb2.GetModelStatusResponse()
            mv = resp.model_version_status.add()
            mv.version = 1
            mv.state = 30 if fd.ready(request.model_spec.name) else 20  # AVAILABLE / LOADING
            return resp

    return Prediction(), Models()
