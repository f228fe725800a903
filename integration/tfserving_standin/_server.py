"""STAND-IN TF Serving server: TF Serving's REST routes and gRPC services over ``_models``.

Flags mirror ``tensorflow_model_server``: ``--port`` (gRPC), ``--rest_api_port``,
``--model_config_file`` (text-format ``ModelServerConfig``), or ``--model_name`` with
``--model_base_path``. REST: ``GET /v1/models/{m}[/versions/{v}]`` (status),
``GET .../metadata``, ``POST .../{m}[/versions/{v}]:predict`` (row ``instances`` or columnar
``inputs`` format). gRPC (when ``tensorflow-serving-api`` is installed): ``PredictionService``
(``Predict``, ``GetModelMetadata``) and ``ModelService`` (``GetModelStatus``,
``HandleReloadConfigRequest``). Errors use TF Serving's codes: NOT_FOUND -> 404,
INVALID_ARGUMENT -> 400 and ``{"error": message}``. Version policies and labels as the real
server (``_models``); ``/labels/{l}`` routes and ``model_spec.version_label`` resolve labels.

STAND-IN ONLY (no such route in TF Serving): ``GET /standin/model_config`` answers
``{"model_config": text}``, the ``ModelServerConfig`` the stand-in last loaded (its
``--model_config_file`` text, or the last ``HandleReloadConfigRequest`` in protobuf text
form), so tests can read back exactly what a reload left on the server.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import socket
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from inferline.adapters.tfserving import ServedModel, from_proto, parse_text
from inferline.adapters.tfserving._protos import (
    available,
    from_tensor_proto,
    stubs,
    to_tensor_proto,
)
from inferline.core import ValidationError

from ._models import DT, ModelManager, ServingError

log = logging.getLogger("tfserving-standin")

_HTTP = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "FAILED_PRECONDITION": 400,
    "UNIMPLEMENTED": 501,
}
_ROUTE = re.compile(
    r"^/v1/models/(?P<m>[^/:]+)(?:/versions/(?P<v>\d+)|/labels/(?P<l>[^/:]+))?"
    r"(?P<rest>/metadata|:predict)?$"
)
_STATE_NUM = {"START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}
_CODE_NUM = {
    "OK": 0,
    "INVALID_ARGUMENT": 3,
    "NOT_FOUND": 5,
    "FAILED_PRECONDITION": 9,
    "INTERNAL": 13,
}
STANDIN_CONFIG_ROUTE = "/standin/model_config"  # STAND-IN ONLY: not a TF Serving route


def _status_json(rows: list[tuple[int, str, str, str]]) -> dict[str, Any]:
    return {
        "model_version_status": [
            {"version": str(v), "state": s, "status": {"error_code": c, "error_message": m}}
            for v, s, c, m in rows
        ]
    }


def _sig_json(name: str, version: int, sig: dict[str, Any]) -> dict[str, Any]:
    def info(part: str) -> dict[str, Any]:
        return {
            alias: {
                "dtype": t["dtype"],
                "tensor_shape": {
                    "dim": [{"size": str(s), "name": ""} for s in t["shape"]],
                    "unknown_rank": False,
                },
                "name": f"serving_default_{alias}:0",
            }
            for alias, t in sig[part].items()
        }

    return {
        "model_spec": {"name": name, "signature_name": "", "version": str(version)},
        "metadata": {
            "signature_def": {
                "signature_def": {
                    "serving_default": {
                        "inputs": info("inputs"),
                        "outputs": info("outputs"),
                        "method_name": "tensorflow/serving/predict",
                    }
                }
            }
        },
    }


def make_handler(mgr: ModelManager) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # headers and body go out in separate writes: without NODELAY, Nagle's algorithm
            # and the client's delayed ACK add ~40 ms to every answer (real servers set it too)
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug(fmt, *args)

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> re.Match[str] | None:
            m = _ROUTE.match(self.path.split("?")[0])
            if m is None:
                self._send(404, {"error": f"Malformed request: {self.command} {self.path}"})
            return m

        def _version(self, m: re.Match[str]) -> int | None:
            if m["l"]:
                return mgr.resolve(m["m"], m["l"])
            return int(m["v"]) if m["v"] else None

        def do_GET(self) -> None:
            if self.path.split("?")[0] == STANDIN_CONFIG_ROUTE:
                self._send(200, {"model_config": mgr.config_text, "stand_in_only": True})
                return
            m = self._route()
            if m is None:
                return
            name = m["m"]
            try:
                v = self._version(m)
                if m["rest"] == "/metadata":
                    loaded = mgr.get(name, v)
                    self._send(200, _sig_json(name, loaded.version, loaded.signature))
                elif m["rest"] is None:
                    self._send(200, _status_json(mgr.status(name, v)))
                else:
                    self._send(404, {"error": f"Malformed request: GET {self.path}"})
            except ServingError as e:
                self._send(_HTTP.get(e.code, 500), {"error": e.message})

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n)
            m = self._route()
            if m is None:
                return
            if m["rest"] != ":predict":
                self._send(404, {"error": f"Malformed request: POST {self.path}"})
                return
            try:
                try:
                    body = json.loads(raw)
                except ValueError as e:
                    raise ServingError("INVALID_ARGUMENT", f"JSON Parse error: {e}") from None
                loaded = mgr.get(m["m"], self._version(m))
                sig = loaded.signature
                (alias,) = sig["inputs"]
                dt = DT[sig["inputs"][alias]["dtype"]]
                if "instances" in body:
                    rows = body["instances"]
                    if rows and isinstance(rows[0], dict):
                        rows = [r[alias] for r in rows]
                    x, row_format = rows, True
                elif "inputs" in body:
                    x = body["inputs"]
                    if isinstance(x, dict):
                        x = x.get(alias)
                    row_format = False
                else:
                    raise ServingError("INVALID_ARGUMENT", "Missing 'inputs' or 'instances' key")
                try:
                    arr = np.asarray(x, dtype=dt)
                except (TypeError, ValueError) as e:
                    raise ServingError("INVALID_ARGUMENT", f"{e}") from None
                out = loaded.predict({alias: arr})
                if row_format:
                    preds = [
                        {k: v[i].tolist() for k, v in out.items()} for i in range(arr.shape[0])
                    ]
                    self._send(200, {"predictions": preds})
                else:
                    self._send(200, {"outputs": {k: v.tolist() for k, v in out.items()}})
            except ServingError as e:
                self._send(_HTTP.get(e.code, 500), {"error": e.message})

    return Handler


def _grpc_services(mgr: ModelManager) -> tuple[Any, Any]:
    import grpc

    st = stubs()
    meta_pb2 = sys.modules["tensorflow.core.protobuf.meta_graph_pb2"]

    def abort(ctx: Any, e: ServingError) -> None:
        ctx.abort(getattr(grpc.StatusCode, e.code, grpc.StatusCode.INTERNAL), e.message)

    def version_of(spec: Any) -> int | None:
        which = spec.WhichOneof("version_choice")
        if which == "version_label":
            return mgr.resolve(spec.name, spec.version_label)
        return int(spec.version.value) if which == "version" else None

    class Prediction(st.prediction_service_pb2_grpc.PredictionServiceServicer):  # type: ignore[misc,name-defined]
        def Predict(self, request: Any, context: Any) -> Any:
            try:
                loaded = mgr.get(request.model_spec.name, version_of(request.model_spec))
                inputs = {k: from_tensor_proto(v, k) for k, v in request.inputs.items()}
                out = loaded.predict(inputs)
            except ServingError as e:
                abort(context, e)
            resp = st.predict_pb2.PredictResponse()
            resp.model_spec.name = loaded.name
            resp.model_spec.version.value = loaded.version
            for k, v in out.items():
                if not request.output_filter or k in request.output_filter:
                    resp.outputs[k].CopyFrom(to_tensor_proto(v, st))
            return resp

        def GetModelMetadata(self, request: Any, context: Any) -> Any:
            try:
                loaded = mgr.get(request.model_spec.name, version_of(request.model_spec))
            except ServingError as e:
                abort(context, e)
            sig_map = st.get_model_metadata_pb2.SignatureDefMap()
            sd = sig_map.signature_def["serving_default"]
            sd.method_name = "tensorflow/serving/predict"
            enums = {"DT_FLOAT": 1, "DT_DOUBLE": 2, "DT_INT32": 3, "DT_INT64": 9}
            for part in ("inputs", "outputs"):
                for alias, t in loaded.signature[part].items():
                    ti = getattr(sd, part)[alias]
                    ti.name = f"serving_default_{alias}:0"
                    ti.dtype = enums[t["dtype"]]
                    for s in t["shape"]:
                        ti.tensor_shape.dim.add().size = int(s)
            assert isinstance(ti, meta_pb2.TensorInfo)
            resp = st.get_model_metadata_pb2.GetModelMetadataResponse()
            resp.model_spec.name = loaded.name
            resp.model_spec.version.value = loaded.version
            resp.metadata["signature_def"].Pack(sig_map)
            return resp

    class Models(st.model_service_pb2_grpc.ModelServiceServicer):  # type: ignore[misc,name-defined]
        def GetModelStatus(self, request: Any, context: Any) -> Any:
            try:
                rows = mgr.status(request.model_spec.name, version_of(request.model_spec))
            except ServingError as e:
                abort(context, e)
            resp = st.get_model_status_pb2.GetModelStatusResponse()
            for v, s, c, m in rows:
                mv = resp.model_version_status.add()
                mv.version = v
                mv.state = _STATE_NUM[s]
                mv.status.error_code = _CODE_NUM.get(c, 13)
                mv.status.error_message = m
            return resp

        def HandleReloadConfigRequest(self, request: Any, context: Any) -> Any:
            resp = st.model_management_pb2.ReloadConfigResponse()
            from google.protobuf import text_format

            try:
                models = from_proto(request.config)
                mgr.reload(models, text_format.MessageToString(request.config, as_utf8=True))
            except ValidationError as e:
                resp.status.error_code = _CODE_NUM["INVALID_ARGUMENT"]
                resp.status.error_message = str(e)
            except ServingError as e:
                resp.status.error_code = _CODE_NUM.get(e.code, 13)
                resp.status.error_message = e.message
            return resp

    return Prediction(), Models()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="tfserving-standin", description="STAND-IN for tensorflow_model_server"
    )
    p.add_argument("--port", type=int, default=8500, help="gRPC port (0: none)")
    p.add_argument("--rest_api_port", type=int, default=0)
    p.add_argument("--model_config_file", default="")
    p.add_argument("--model_name", default="")
    p.add_argument("--model_base_path", default="")
    p.add_argument(
        "--allow_version_labels_for_unavailable_models",
        type=lambda t: t.lower() in ("1", "true"),
        default=False,
    )
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"tfserving-standin: ignoring flags {unknown}", file=sys.stderr)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s standin %(message)s")
    mgr = ModelManager(args.allow_version_labels_for_unavailable_models)
    if args.model_config_file:
        with open(args.model_config_file) as f:
            text = f.read()
        mgr.reload(parse_text(text), text)
    elif args.model_name:
        mgr.reload([ServedModel(args.model_name, args.model_base_path)])
    servers: list[Any] = []
    if args.port and available():
        import grpc

        g = grpc.server(futures.ThreadPoolExecutor(8))
        pred, models = _grpc_services(mgr)
        st = stubs()
        st.prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(pred, g)
        st.model_service_pb2_grpc.add_ModelServiceServicer_to_server(models, g)
        g.add_insecure_port(f"127.0.0.1:{args.port}")
        g.start()
        servers.append(g)
        log.info("STAND-IN gRPC on 127.0.0.1:%d", args.port)
    elif args.port:
        log.info("no tensorflow-serving-api: the STAND-IN serves REST only")
    http = None
    if args.rest_api_port:
        http = ThreadingHTTPServer(("127.0.0.1", args.rest_api_port), make_handler(mgr))
        http.daemon_threads = True
        threading.Thread(target=http.serve_forever, daemon=True).start()
        log.info("STAND-IN REST on 127.0.0.1:%d", args.rest_api_port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    if http is not None:
        http.shutdown()
    for g in servers:
        g.stop(0)
    return 0
