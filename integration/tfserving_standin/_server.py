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

Batching as the real server's (``_batching``, ``_models``): ``--enable_batching``,
``--enable_per_model_batching_parameters`` (a version's ``batching_params.pbtxt``, read when it
loads) and ``--batching_parameters_file``; a full batch queue answers UNAVAILABLE (REST 503).
``--monitoring_config_file`` with ``prometheus_config { enable: true path: P }`` serves
TF Serving's metric names on ``GET P`` of the REST port (``_monitoring``).

STAND-IN ONLY (no such route in TF Serving): ``GET /standin/model_config`` answers
``{"model_config": text}``, the ``ModelServerConfig`` the stand-in last loaded (its
``--model_config_file`` text, or the last ``HandleReloadConfigRequest`` in protobuf text
form), so tests can read back exactly what a reload left on the server;
``GET /standin/batches[?model=m]`` answers ``{"batches": [...]}``, the batch log.
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
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from inferline.adapters.tfserving import ServedModel, from_proto, parse_batching_text, parse_text
from inferline.adapters.tfserving._protos import (
    available,
    from_tensor_proto,
    stubs,
    to_tensor_proto,
)
from inferline.core import ValidationError

from ._batching import BatchingParams
from ._models import DT, BatchingConfig, ModelManager, ServingError
from ._monitoring import Monitoring, parse_monitoring_path

log = logging.getLogger("tfserving-standin")

_HTTP = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "FAILED_PRECONDITION": 400,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
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
    "UNAVAILABLE": 14,
}
STANDIN_CONFIG_ROUTE = "/standin/model_config"  # STAND-IN ONLY: not a TF Serving route
STANDIN_BATCHES_ROUTE = "/standin/batches"  # STAND-IN ONLY: the batch log


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


def make_handler(
    mgr: ModelManager, mon: Monitoring, metrics_path: str | None
) -> type[BaseHTTPRequestHandler]:
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
            text = isinstance(body, str)
            data = body.encode() if text else json.dumps(body).encode()
            self.send_response(status)
            self.send_header(
                "Content-Type", "text/plain; version=0.0.4" if text else "application/json"
            )
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
            path, _, query = self.path.partition("?")
            if path == STANDIN_CONFIG_ROUTE:
                self._send(200, {"model_config": mgr.config_text, "stand_in_only": True})
                return
            if path == STANDIN_BATCHES_ROUTE:
                model = query[len("model=") :] if query.startswith("model=") else None
                self._send(200, {"batches": mon.batch_log(model), "stand_in_only": True})
                return
            if metrics_path is not None and path == metrics_path:
                self._send(200, mon.text())
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
            t0 = time.monotonic()
            status = self._predict(m, raw)
            mon.request(m["m"], status, time.monotonic() - t0, "REST")

        def _predict(self, m: re.Match[str], raw: bytes) -> str:
            """Answer one predict; the outcome's status code name."""
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
                return "OK"
            except ServingError as e:
                self._send(_HTTP.get(e.code, 500), {"error": e.message})
                return e.code

    return Handler


def _grpc_services(mgr: ModelManager, mon: Monitoring) -> tuple[Any, Any]:
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
            t0 = time.monotonic()
            name = request.model_spec.name
            try:
                loaded = mgr.get(name, version_of(request.model_spec))
                inputs = {k: from_tensor_proto(v, k) for k, v in request.inputs.items()}
                out = loaded.predict(inputs)
            except ServingError as e:
                mon.request(name, e.code, time.monotonic() - t0, "GRPC")
                abort(context, e)
            mon.request(name, "OK", time.monotonic() - t0, "GRPC")
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


class _RestServer(ThreadingHTTPServer):
    # socketserver's listen backlog is 5: more connections at once overflow it and their
    # SYNs are retried a second later, which no real server's clients see
    request_queue_size = 1024


def _flag(text: str) -> bool:
    return text.lower() in ("1", "true")


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tfserving-standin", description="STAND-IN for tensorflow_model_server"
    )
    p.add_argument("--port", type=int, default=8500, help="gRPC port (0: none)")
    p.add_argument("--rest_api_port", type=int, default=0)
    p.add_argument("--model_config_file", default="")
    p.add_argument("--model_name", default="")
    p.add_argument("--model_base_path", default="")
    p.add_argument("--monitoring_config_file", default="")
    p.add_argument("--batching_parameters_file", default="")
    for name in (
        "allow_version_labels_for_unavailable_models",
        "enable_batching",
        "enable_per_model_batching_parameters",
    ):  # TF Serving's bool flags: --f, --f=true, --f=false
        p.add_argument(f"--{name}", type=_flag, nargs="?", const=True, default=False)
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"tfserving-standin: ignoring flags {unknown}", file=sys.stderr)
    return args


def _batching(args: argparse.Namespace) -> BatchingConfig:
    """The server's batching flags; the parameters file's settings are every version's
    defaults (read once, at start, as the real server)."""
    defaults = BatchingParams()
    if args.batching_parameters_file:
        with open(args.batching_parameters_file) as f:
            fields = parse_batching_text(f.read(), args.batching_parameters_file)
        defaults = BatchingParams.from_fields(fields)
    return BatchingConfig(
        bool(args.enable_batching or args.batching_parameters_file),
        bool(args.enable_per_model_batching_parameters),
        defaults,
    )


def _metrics_path(args: argparse.Namespace) -> str | None:
    if not args.monitoring_config_file:
        return None
    with open(args.monitoring_config_file) as f:
        return parse_monitoring_path(f.read())


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s standin %(message)s")
    mon = Monitoring()
    mgr = ModelManager(
        args.allow_version_labels_for_unavailable_models,
        batching=_batching(args),
        on_batch=mon.batch,
    )
    if args.model_config_file:
        with open(args.model_config_file) as f:
            text = f.read()
        mgr.reload(parse_text(text), text)
    elif args.model_name:
        mgr.reload([ServedModel(args.model_name, args.model_base_path)])
    servers: list[Any] = []
    if args.port and available():
        import grpc

        # a request waiting in a batch queue holds a handler thread: enough of them that
        # the batcher, not the handler pool, bounds what waits (threads start on demand)
        g = grpc.server(futures.ThreadPoolExecutor(128))
        pred, models = _grpc_services(mgr, mon)
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
        handler = make_handler(mgr, mon, _metrics_path(args))
        http = _RestServer(("127.0.0.1", args.rest_api_port), handler)
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
