"""One TF Serving server, over REST (``requests``) or gRPC (``tensorflow-serving-api`` stubs).

``TFServingClient`` speaks the server's real protocols and normalises the answers:

* model status (``GET /v1/models/{m}`` / ``ModelService/GetModelStatus``): a list of
  ``{"version", "state", "error_code", "error_message"}``, state one of TF Serving's
  ``START``, ``LOADING``, ``AVAILABLE``, ``UNLOADING``, ``END``;
* model metadata (``GET /v1/models/{m}/metadata`` / ``PredictionService/GetModelMetadata``):
  ``{"signatures": {name: {"inputs": {alias: {"dtype", "shape"}}, "outputs": {...}}}}``;
* predict with a preformed batch (REST columnar ``{"inputs": {...}}`` / ``Predict``): named
  arrays in, named arrays out, the batch on the first axis;
* model management (``ModelService/HandleReloadConfigRequest``, gRPC only: TF Serving has no
  REST route for it), which replaces the server's whole model set.

Failures raise ``TFServingFailure`` subclasses carrying the canonical status code name
(``NOT_FOUND``, ``INVALID_ARGUMENT``, ``UNAVAILABLE``...); the backend turns them into
inferline's errors.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from inferline.core import ValidationError

from ._config import ServedModel, to_proto
from ._protos import from_tensor_proto, np_dtype, stubs, to_tensor_proto

__all__ = [
    "SERVER_LOST",
    "STATES",
    "TFServingClient",
    "TFServingConnectionError",
    "TFServingFailure",
    "TFServingInvalidArgument",
    "TFServingNotFound",
]

log = logging.getLogger(__name__)

# ModelVersionStatus.State numbers -> names (tensorflow_serving/apis/get_model_status.proto).
STATES = {0: "UNKNOWN", 10: "START", 20: "LOADING", 30: "AVAILABLE", 40: "UNLOADING", 50: "END"}
# tensorflow.error.Code numbers -> canonical names.
CODES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}
_HTTP_CODE = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
}


class TFServingFailure(Exception):
    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


class TFServingConnectionError(TFServingFailure):
    """The server could not be reached (down, restarting, wrong address)."""


class TFServingNotFound(TFServingFailure):
    """The server does not serve that model (or version)."""


class TFServingInvalidArgument(TFServingFailure):
    """The server rejected the request's inputs."""


# the failures after which the server, or the model on it, is presumed gone (recovery's work)
SERVER_LOST = (TFServingConnectionError, TFServingNotFound)


def _failure(code: str, message: str) -> TFServingFailure:
    cls = {
        "NOT_FOUND": TFServingNotFound,
        "INVALID_ARGUMENT": TFServingInvalidArgument,
        "UNAVAILABLE": TFServingConnectionError,
    }.get(code, TFServingFailure)
    return cls(code, message)


def _shape(tensor_shape: Mapping[str, Any] | None) -> list[int] | None:
    if not tensor_shape or tensor_shape.get("unknown_rank"):
        return None
    return [int(d.get("size", -1)) for d in tensor_shape.get("dim", [])]


def _signatures_from_json(sigs: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, sd in sigs.items():
        if name.startswith("__"):  # __saved_model_init_op and friends
            continue
        out[name] = {
            part: {
                alias: {
                    "dtype": info.get("dtype", "DT_INVALID"),
                    "shape": _shape(info.get("tensor_shape")),
                }
                for alias, info in (sd.get(part) or {}).items()
            }
            for part in ("inputs", "outputs")
        }
        out[name]["method_name"] = sd.get("method_name", "")
    return out


def _signatures_from_proto(sig_map: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    d = MessageToDict(sig_map, preserving_proto_field_name=True)
    return _signatures_from_json(d.get("signature_def", {}))


class TFServingClient:
    """A client of one server. ``rest``/``grpc``: ``host:port`` of each API (either may be
    None); ``protocol`` picks the one used for predict, status and metadata."""

    def __init__(
        self,
        rest: str | None,
        grpc: str | None,
        protocol: str = "rest",
        *,
        timeout_s: float = 60.0,
        headers: Mapping[str, str] | None = None,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        if protocol not in ("rest", "grpc"):
            raise ValidationError("protocol", "'rest' or 'grpc'", protocol)
        if protocol == "rest" and not rest:
            raise ValidationError("rest address", "host:port of the REST API", rest)
        if protocol == "grpc" and not grpc:
            raise ValidationError("grpc address", "host:port of the gRPC API", grpc)
        self.rest = rest
        self.grpc = grpc
        self.protocol = protocol
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.max_message_bytes = max_message_bytes
        self._session: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._channel: Any = None
        self._channel_loop: Any = None
        self._stubs: dict[tuple[str, int], Any] = {}

    def __repr__(self) -> str:
        return (
            f"TFServingClient(rest={self.rest!r}, grpc={self.grpc!r}, protocol={self.protocol!r})"
        )

    # -- transports -------------------------------------------------------------------------

    def _open_session(self) -> None:
        import requests

        if self._session is None:
            self._session = requests.Session()
            self._session.headers.update(self.headers)
            self._pool = ThreadPoolExecutor(16, thread_name_prefix="tfserving-rest")

    async def _rest(
        self, method: str, path: str, body: Any = None, timeout_s: float | None = None
    ) -> Any:
        import requests

        self._open_session()
        url = f"http://{self.rest}{path}"
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        t = self.timeout_s if timeout_s is None else timeout_s

        def call() -> tuple[int, bytes]:
            r = self._session.request(
                method,
                url,
                data=data,
                timeout=t,
                headers={"Content-Type": "application/json"} if data is not None else None,
            )
            return r.status_code, r.content

        try:
            status, content = await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except requests.RequestException as e:
            raise TFServingConnectionError(
                "UNAVAILABLE", f"{url}: {type(e).__name__}: {e}"
            ) from None
        try:
            payload = json.loads(content) if content else {}
        except ValueError:
            payload = {"error": content[:200].decode("utf-8", "replace")}
        if status != 200:
            msg = payload.get("error", "") if isinstance(payload, dict) else str(payload)
            code = _HTTP_CODE.get(status, "UNAVAILABLE" if status in (502, 504) else "INTERNAL")
            raise _failure(code, f"HTTP {status} from {url}: {msg}")
        return payload

    def _grpc_channel(self) -> Any:
        import grpc.aio

        loop = asyncio.get_running_loop()
        if self._channel is None or self._channel_loop is not loop:
            self._channel = grpc.aio.insecure_channel(
                self.grpc,
                options=[
                    ("grpc.max_receive_message_length", self.max_message_bytes),
                    ("grpc.max_send_message_length", self.max_message_bytes),
                    ("grpc.enable_retries", 0),
                ],
            )
            self._channel_loop = loop
            self._stubs.clear()
        return self._channel

    async def _grpc(
        self, service: str, method: str, request: Any, timeout_s: float | None = None
    ) -> Any:
        import grpc

        if not self.grpc:
            raise ValidationError("grpc address", "host:port of the server's gRPC API", None)
        st = stubs()
        mod = (
            st.prediction_service_pb2_grpc if service == "prediction" else st.model_service_pb2_grpc
        )
        channel = self._grpc_channel()
        stub = self._stubs.get((service, id(channel)))
        if stub is None:  # one stub per channel: building one makes all its method objects
            cls = mod.PredictionServiceStub if service == "prediction" else mod.ModelServiceStub
            stub = self._stubs[(service, id(channel))] = cls(channel)
        md = tuple((k.lower(), v) for k, v in self.headers.items()) or None
        try:
            return await getattr(stub, method)(
                request, timeout=self.timeout_s if timeout_s is None else timeout_s, metadata=md
            )
        except grpc.aio.AioRpcError as e:
            raise _failure(e.code().name, f"{self.grpc} {method}: {e.details()}") from None

    # -- API ----------------------------------------------------------------------------------

    async def status(
        self, model: str, version: int | None = None, timeout_s: float | None = None
    ) -> list[dict[str, Any]]:
        if self.protocol == "rest":
            path = f"/v1/models/{model}" + (f"/versions/{version}" if version is not None else "")
            body = await self._rest("GET", path, timeout_s=timeout_s)
            return [
                {
                    "version": int(s.get("version", 0)),
                    "state": str(s.get("state", "UNKNOWN")),
                    "error_code": str((s.get("status") or {}).get("error_code", "OK")),
                    "error_message": str((s.get("status") or {}).get("error_message", "")),
                }
                for s in body.get("model_version_status", [])
            ]
        st = stubs()
        req = st.get_model_status_pb2.GetModelStatusRequest()
        req.model_spec.name = model
        if version is not None:
            req.model_spec.version.value = int(version)
        resp = await self._grpc("model", "GetModelStatus", req, timeout_s)
        return [
            {
                "version": int(s.version),
                "state": STATES.get(int(s.state), "UNKNOWN"),
                "error_code": CODES.get(int(s.status.error_code), str(s.status.error_code)),
                "error_message": s.status.error_message,
            }
            for s in resp.model_version_status
        ]

    async def metadata(self, model: str) -> dict[str, Any]:
        if self.protocol == "rest":
            body = await self._rest("GET", f"/v1/models/{model}/metadata")
            sigs = ((body.get("metadata") or {}).get("signature_def") or {}).get(
                "signature_def", {}
            )
            spec = body.get("model_spec") or {}
            return {
                "version": int(spec.get("version") or 0),
                "signatures": _signatures_from_json(sigs),
            }
        st = stubs()
        req = st.get_model_metadata_pb2.GetModelMetadataRequest()
        req.model_spec.name = model
        req.metadata_field.append("signature_def")
        resp = await self._grpc("prediction", "GetModelMetadata", req)
        sig_map = st.get_model_metadata_pb2.SignatureDefMap()
        if "signature_def" in resp.metadata:
            resp.metadata["signature_def"].Unpack(sig_map)
        return {
            "version": int(resp.model_spec.version.value),
            "signatures": _signatures_from_proto(sig_map),
        }

    async def predict(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        signature: str = "serving_default",
        version: int | None = None,
        label: str | None = None,
        output_dtypes: Mapping[str, str] | None = None,
        output_filter: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> dict[str, np.ndarray]:
        """Named batched arrays in, named batched arrays out (``version`` or a version
        ``label`` picks the servable; neither: the latest). ``timeout_s`` bounds the call
        (the gRPC deadline; default the client's)."""
        if version is not None and label is not None:
            raise ValidationError("model_spec", "a version or a version_label, not both", label)
        if self.protocol == "rest":
            body: dict[str, Any] = {
                "signature_name": signature,
                "inputs": {k: _json_tensor(k, v) for k, v in inputs.items()},
            }
            path = (
                f"/v1/models/{model}"
                + (f"/versions/{version}" if version is not None else "")
                + (f"/labels/{label}" if label is not None else "")
                + ":predict"
            )
            resp = await self._rest("POST", path, body, timeout_s)
            if "outputs" not in resp:
                raise TFServingFailure("INTERNAL", f"no 'outputs' in the answer of {model!r}")
            outs = resp["outputs"]
            dts = dict(output_dtypes or {})
            if not isinstance(outs, dict):
                # One output tensor: TF Serving answers with the bare value.
                names = list(output_filter) or list(dts)
                outs = {names[0] if len(names) == 1 else "output_0": outs}
            return {
                k: _from_json_tensor(v, dts.get(k))
                for k, v in outs.items()
                if not output_filter or k in output_filter
            }
        st = stubs()
        req = st.predict_pb2.PredictRequest()
        req.model_spec.name = model
        req.model_spec.signature_name = signature
        if version is not None:
            req.model_spec.version.value = int(version)
        if label is not None:
            req.model_spec.version_label = label
        for k, v in inputs.items():
            to_tensor_proto(v, st, into=req.inputs[k])  # in place: no tensor copied in
        req.output_filter.extend(output_filter)
        resp = await self._grpc("prediction", "Predict", req, timeout_s)
        return {k: from_tensor_proto(tp, f"outputs.{k}") for k, tp in resp.outputs.items()}

    async def reload(self, models: Sequence[ServedModel], timeout_s: float | None = None) -> None:
        """``HandleReloadConfigRequest``: the server's model set becomes exactly ``models``."""
        st = stubs()
        req = st.model_management_pb2.ReloadConfigRequest()
        req.config.CopyFrom(to_proto(models, st))
        resp = await self._grpc("model", "HandleReloadConfigRequest", req, timeout_s)
        code = CODES.get(int(resp.status.error_code), str(resp.status.error_code))
        if code != "OK":
            raise _failure(code, f"reload on {self.grpc}: {resp.status.error_message}")

    async def get_text(self, path: str, timeout_s: float | None = None) -> str:
        """``GET path`` on the REST port as text (the Prometheus page); failures as
        ``TFServingFailure`` (NOT_FOUND where the server does not serve the path)."""
        import requests

        if not self.rest:
            raise ValidationError("rest address", "host:port of the server's REST API", None)
        self._open_session()
        url = f"http://{self.rest}{path}"
        t = self.timeout_s if timeout_s is None else timeout_s

        def call() -> tuple[int, str]:
            r = self._session.get(url, timeout=t)
            return r.status_code, r.text

        try:
            status, text = await asyncio.get_running_loop().run_in_executor(self._pool, call)
        except requests.RequestException as e:
            raise TFServingConnectionError(
                "UNAVAILABLE", f"{url}: {type(e).__name__}: {e}"
            ) from None
        if status != 200:
            raise _failure(_HTTP_CODE.get(status, "INTERNAL"), f"HTTP {status} from {url}")
        return text

    async def ready(self, timeout_s: float = 2.0) -> bool:
        """True when the server answers at all (a NOT_FOUND for a probe name counts)."""
        try:
            await self.status("__inferline_probe__", timeout_s=timeout_s)
        except TFServingNotFound:
            return True
        except TFServingFailure:
            return False
        return True

    async def close(self) -> None:
        if self._channel is not None:
            try:
                await self._channel.close()
            except Exception:  # a channel of a loop that is gone
                pass
            self._channel = None
        if self._session is not None:
            self._session.close()
            self._session = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _json_tensor(name: str, a: np.ndarray) -> Any:
    if a.dtype.kind in "OSU":
        # TF Serving's REST API: binary strings as {"b64": ...}; text as plain strings.
        def enc(x: Any) -> Any:
            if isinstance(x, bytes | bytearray):
                return {"b64": base64.b64encode(bytes(x)).decode()}
            return str(x)

        return np.vectorize(enc, otypes=[object])(a).tolist() if a.size else a.tolist()
    return a.tolist()


def _from_json_tensor(v: Any, tf_dtype: str | None) -> np.ndarray:
    if tf_dtype == "DT_STRING":

        def dec(x: Any) -> Any:
            if isinstance(x, dict) and "b64" in x:
                return base64.b64decode(x["b64"])
            if isinstance(x, list):
                return [dec(y) for y in x]
            return x

        return np.array(dec(v), dtype=object)
    dt = np_dtype(tf_dtype) if tf_dtype and tf_dtype != "DT_INVALID" else None
    try:
        return np.asarray(v, dtype=dt)
    except (TypeError, ValueError) as e:
        raise TFServingFailure("INTERNAL", f"malformed output tensor: {e}") from None
