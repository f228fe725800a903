"""One asynchronous Triton client over HTTP or gRPC, with protocol differences smoothed out.

``tritonclient``'s asyncio clients (``tritonclient.http.aio``, ``tritonclient.grpc.aio``) are
bound to the event loop they are created on; ``TritonClient`` creates them lazily inside the
running loop and again if the loop changes. Answers come back as plain JSON-like dicts with
integers as ints (gRPC's protobuf JSON renders 64-bit integers as strings). Failures are
classified for the backend: ``TritonConnectionError`` (server unreachable, connection lost,
timeout), ``TritonModelMissing`` (the server does not have the model loaded, e.g. after a
restart) and ``TritonServerError`` (the server answered with an error).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inferline.core import ValidationError

from ._tensors import from_raw_contents, raw_contents

__all__ = [
    "SERVER_LOST",
    "GrpcInfer",
    "TritonClient",
    "TritonConnectionError",
    "TritonDeadline",
    "TritonFailure",
    "TritonModelMissing",
    "TritonServerError",
]

log = logging.getLogger(__name__)

_INT_KEYS = frozenset(
    {
        "count",
        "ns",
        "inference_count",
        "execution_count",
        "last_inference",
        "batch_size",
        "max_batch_size",
        "max_queue_delay_microseconds",
        "default_queue_policy",
    }
)
_INT_LIST_KEYS = frozenset({"dims", "gpus", "preferred_batch_size", "shape"})


async def close_on_its_loop(conn: Any, loop: Any, what: str) -> None:
    """Close ``conn`` (a grpc.aio channel or a tritonclient aio client) only on the event loop
    it was made on: closing it from another loop (or after that loop closed) raises or hangs."""
    if conn is None:
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not None and running is loop and not loop.is_closed():
        try:
            await conn.close()
        except Exception:  # closing a broken connection may fail; nothing to recover
            log.debug("closing %s failed", what, exc_info=True)


class TritonFailure(Exception):
    """Internal: a classified failure of one client call (the backend maps it to inferline's)."""


class TritonConnectionError(TritonFailure):
    """The server could not be reached or the connection broke."""


class TritonModelMissing(TritonFailure):
    """The server answered that the model is unknown or not ready."""


class TritonServerError(TritonFailure):
    """The server answered with an error (bad request, model raised, ...)."""


class TritonDeadline(TritonFailure):
    """An inference request ran out of the deadline it carried (Triton dropped it from its
    queue, or the call was cancelled at the deadline): late, the server is not lost."""


# the failures after which the server, or the model on it, is presumed gone (recovery's work)
SERVER_LOST = (TritonConnectionError, TritonModelMissing)


def _ints(obj: Any) -> Any:
    """Protobuf JSON gives 64-bit integers as strings; make the known numeric fields ints."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if k in _INT_KEYS and isinstance(v, str) and v.lstrip("-").isdigit():
                out[k] = int(v)
            elif k in _INT_LIST_KEYS and isinstance(v, list):
                out[k] = [
                    int(x) if isinstance(x, str) and x.lstrip("-").isdigit() else x for x in v
                ]
            else:
                out[k] = _ints(v)
        return out
    if isinstance(obj, list):
        return [_ints(x) for x in obj]
    return obj


_MISSING_MARKERS = ("unknown model", "is not ready", "no available versions", "is not found")


def classify(exc: BaseException, what: str) -> TritonFailure:
    """Map a tritonclient / aiohttp / grpc exception to one of the three failure kinds."""
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, TritonFailure):
        return exc
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return TritonConnectionError(f"{what}: timed out")
    if isinstance(exc, InferenceServerException):
        status = str(exc.status() or "")
        msg = str(exc.message() or exc)
        if any(s in status for s in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED")):
            return TritonConnectionError(f"{what}: {status}: {msg}")
        low = msg.lower()
        if any(m in low for m in _MISSING_MARKERS):
            return TritonModelMissing(f"{what}: {msg}")
        if "connection" in low and ("refused" in low or "reset" in low or "closed" in low):
            return TritonConnectionError(f"{what}: {msg}")
        return TritonServerError(f"{what}: {msg}")
    try:
        import aiohttp

        if isinstance(exc, aiohttp.ClientError):
            return TritonConnectionError(f"{what}: {type(exc).__name__}: {exc}")
    except ImportError:  # pragma: no cover - http extra absent
        pass
    try:
        import grpc

        if isinstance(exc, grpc.aio.AioRpcError):
            code = exc.code()
            if code in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED,
            ):
                return TritonConnectionError(f"{what}: {code}: {exc.details()}")
            if any(m in str(exc.details()).lower() for m in _MISSING_MARKERS):
                # the stub's own calls (GrpcInfer) see Triton's "unknown model" raw
                return TritonModelMissing(f"{what}: {code}: {exc.details()}")
            return TritonServerError(f"{what}: {code}: {exc.details()}")
    except ImportError:  # pragma: no cover
        pass
    if isinstance(exc, ConnectionError | OSError):
        return TritonConnectionError(f"{what}: {type(exc).__name__}: {exc}")
    return TritonServerError(f"{what}: {type(exc).__name__}: {exc}")


def _timed_out(e: TritonFailure) -> bool:
    """``e`` says the request ran out of its time: the call's deadline, or Triton's queue
    dropping it at the request's ``timeout`` ("Request timeout expired")."""
    text = str(e).lower()
    return any(m in text for m in ("timed out", "deadline_exceeded", "timeout expired"))


_GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.max_receive_message_length", 2**31 - 1),
    # reconnect within a second or two of a restarted server coming back (gRPC's default
    # backoff grows to two minutes)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.enable_retries", 0),
]
_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


class GrpcInfer:
    """Inference over Triton's gRPC service without a client wrapper: one ``grpc.aio``
    channel per event loop, reused by every call, and requests written as protobuf bytes.

    The part of a request that is the same for every call of a model (name, version, the
    outputs asked for) is serialized once (``_head``); each call serializes only its tensors
    (and the ``timeout`` parameter) and sends the two concatenated (protobuf merges
    concatenated messages: repeated fields append, the rest is set once)."""

    def __init__(self, address: str, headers: Mapping[str, str]) -> None:
        self.address = address
        self._metadata = tuple((k.lower(), v) for k, v in headers.items()) or None
        self._channel: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._call: Any = None
        self._heads: dict[tuple[str, str, tuple[str, ...]], bytes] = {}
        self._pb: Any = None

    def _bind(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._call is None or self._loop is not loop:
            import grpc.aio
            from tritonclient.grpc import service_pb2

            self._pb = service_pb2
            self._channel = grpc.aio.insecure_channel(self.address, options=_GRPC_OPTIONS)
            self._call = self._channel.unary_unary(
                _MODEL_INFER,
                request_serializer=None,  # the request is already bytes
                response_deserializer=service_pb2.ModelInferResponse.FromString,
            )
            self._loop = loop
        return self._call

    def _head(self, name: str, version: str, outputs: Sequence[str]) -> bytes:
        key = (name, version, tuple(outputs))
        head = self._heads.get(key)
        if head is None:
            req = self._pb.ModelInferRequest(model_name=name, model_version=version)
            for n in outputs:
                req.outputs.add().name = n
            head = self._heads[key] = req.SerializeToString()
        return head

    def request(
        self,
        name: str,
        inputs: Mapping[str, tuple[np.ndarray, str]],
        outputs: Sequence[str],
        version: str = "",
        timeout_us: int | None = None,
    ) -> bytes:
        """One ``ModelInferRequest`` as the bytes sent."""
        req = self._pb.ModelInferRequest()
        for n, (arr, dt) in inputs.items():
            t = req.inputs.add()
            t.name = n
            t.datatype = dt
            t.shape.extend(arr.shape)
            req.raw_input_contents.append(raw_contents(arr, dt))
        if timeout_us is not None:
            req.parameters["timeout"].int64_param = timeout_us
        return self._head(name, version, outputs) + req.SerializeToString()

    async def infer(
        self,
        name: str,
        inputs: Mapping[str, tuple[np.ndarray, str]],
        outputs: Sequence[str],
        version: str,
        timeout_s: float,
        timeout_us: int | None,
    ) -> dict[str, np.ndarray]:
        what = f"infer {name!r}"
        call = self._bind()
        body = self.request(name, inputs, outputs, version, timeout_us)
        try:
            if timeout_us is None:
                resp = await call(body, timeout=timeout_s, metadata=self._metadata)
            else:  # a deadline: also the loop's timer (grpc's first deadline can lag ~0.2 s)
                async with asyncio.timeout(timeout_s):
                    resp = await call(body, timeout=timeout_s, metadata=self._metadata)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # classified below; nothing escapes unnamed
            raise classify(e, what) from e
        where = {o.name: i for i, o in enumerate(resp.outputs)}
        out: dict[str, np.ndarray] = {}
        for n in outputs:
            i = where.get(n)
            if i is None or i >= len(resp.raw_output_contents):
                raise TritonServerError(f"{what}: output {n!r} missing from the response")
            o = resp.outputs[i]
            try:
                out[n] = from_raw_contents(
                    resp.raw_output_contents[i], o.datatype, tuple(o.shape), f"output {n!r}"
                )
            except ValidationError as e:
                raise TritonServerError(f"{what}: {e}") from None
        return out

    async def close(self) -> None:
        channel, self._channel, self._call = self._channel, None, None
        loop, self._loop = self._loop, None
        await close_on_its_loop(channel, loop, "the Triton gRPC channel")


class _NoGrpc(GrpcInfer):
    """The HTTP client's placeholder: no channel is ever opened."""

    def __init__(self) -> None:
        super().__init__("", {})

    async def infer(self, *args: Any, **kw: Any) -> dict[str, np.ndarray]:
        raise AssertionError("gRPC inference on an HTTP client")


_NO_GRPC = _NoGrpc()


class TritonClient:
    """Protocol-neutral calls to one Triton server (``protocol`` is ``"http"`` or ``"grpc"``)."""

    def __init__(
        self,
        address: str,
        protocol: str = "http",
        *,
        timeout_s: float = 60.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
        self.address = address
        self.protocol = protocol
        self.timeout_s = float(timeout_s)
        self.headers = dict(headers or {})
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._mods: tuple[Any, Any] | None = None
        self._grpc = GrpcInfer(address, self.headers) if protocol == "grpc" else _NO_GRPC

    # -- plumbing -----------------------------------------------------------------------

    def _modules(self) -> tuple[Any, Any]:
        """(asyncio client module, module with InferInput/InferRequestedOutput)."""
        if self._mods is None:
            if self.protocol == "http":
                import tritonclient.http.aio as aio
            else:
                import tritonclient.grpc.aio as aio
            self._mods = (aio, aio)
        return self._mods

    def _get(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            aio, _ = self._modules()
            if self.protocol == "http":
                self._client = aio.InferenceServerClient(
                    self.address, conn_timeout=self.timeout_s, conn_limit=1000
                )
            else:
                self._client = aio.InferenceServerClient(
                    self.address,
                    channel_args=[
                        ("grpc.max_send_message_length", aio.MAX_GRPC_MESSAGE_SIZE),
                        ("grpc.max_receive_message_length", aio.MAX_GRPC_MESSAGE_SIZE),
                        # reconnect within a second or two of a restarted server coming back
                        # (gRPC's default backoff grows to two minutes)
                        ("grpc.initial_reconnect_backoff_ms", 100),
                        ("grpc.min_reconnect_backoff_ms", 100),
                        ("grpc.max_reconnect_backoff_ms", 2000),
                    ],
                )
            self._loop = loop
        return self._client

    async def _call(
        self, what: str, method: str, *args: Any, timeout_s: float | None = None, **kw: Any
    ) -> Any:
        client = self._get()
        if self.headers:
            kw["headers"] = self.headers
        try:
            return await asyncio.wait_for(
                getattr(client, method)(*args, **kw), timeout_s or self.timeout_s
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # classified below; nothing escapes unnamed
            raise classify(e, what) from e

    def _json(self, kw: dict[str, Any]) -> dict[str, Any]:
        if self.protocol == "grpc":
            kw["as_json"] = True
        return kw

    # -- server and repository ------------------------------------------------------------

    async def ready(self, timeout_s: float | None = None) -> bool:
        try:
            return bool(await self._call("server ready", "is_server_ready", timeout_s=timeout_s))
        except TritonFailure:
            return False

    async def server_metadata(self) -> dict[str, Any]:
        return _ints(await self._call("server metadata", "get_server_metadata", **self._json({})))

    async def repository_index(self) -> list[dict[str, Any]]:
        r = await self._call("repository index", "get_model_repository_index", **self._json({}))
        if isinstance(r, dict):  # gRPC JSON: {"models": [...]}
            r = r.get("models", [])
        return [_ints(m) for m in r]

    async def model_ready(self, name: str, timeout_s: float | None = None) -> bool:
        try:
            return bool(
                await self._call(
                    f"model {name!r} ready", "is_model_ready", name, timeout_s=timeout_s
                )
            )
        except (TritonModelMissing, TritonServerError):
            return False

    async def model_config(self, name: str) -> dict[str, Any]:
        r = await self._call(f"config of {name!r}", "get_model_config", name, **self._json({}))
        if self.protocol == "grpc":
            r = r.get("config", {})
        return _ints(r)

    async def model_metadata(self, name: str) -> dict[str, Any]:
        return _ints(
            await self._call(f"metadata of {name!r}", "get_model_metadata", name, **self._json({}))
        )

    async def load(self, name: str, config: Mapping[str, Any] | None = None) -> None:
        kw: dict[str, Any] = {}
        if config is not None:
            kw["config"] = json.dumps(config)
        await self._call(f"load {name!r}", "load_model", name, **kw)

    async def unload(self, name: str) -> None:
        await self._call(f"unload {name!r}", "unload_model", name)

    async def statistics(self, name: str) -> dict[str, Any]:
        r = await self._call(
            f"statistics of {name!r}", "get_inference_statistics", name, **self._json({})
        )
        stats = _ints(r).get("model_stats", [])
        if not stats:
            raise TritonModelMissing(f"statistics of {name!r}: no statistics")
        # Several versions: sum is not meaningful here; the adapter serves one version.
        return stats[0]

    # -- inference ------------------------------------------------------------------------

    async def infer(
        self,
        name: str,
        inputs: Mapping[str, tuple[np.ndarray, str]],
        outputs: Sequence[str],
        version: str = "",
        *,
        timeout_s: float | None = None,
        carry_timeout: bool = False,
    ) -> dict[str, np.ndarray]:
        """Run one request; ``inputs`` maps names to (array, protocol datatype).

        ``timeout_s`` bounds the call (default: the client's ``timeout_s``). With
        ``carry_timeout`` it is the request's deadline: Triton gets it as the ``timeout``
        parameter (microseconds; its queue drops the request past it where the model's queue
        policy allows the override) and a call that runs out of it is ``TritonDeadline``,
        not a lost server. Over gRPC the request goes straight to the generated stub
        (``_grpc_infer``), over HTTP through tritonclient's client."""
        t = self.timeout_s if timeout_s is None else timeout_s
        timeout_us = max(1, int(t * 1e6)) if carry_timeout else None
        try:
            if self.protocol == "grpc":
                return await self._grpc.infer(name, inputs, outputs, version, t, timeout_us)
            return await self._http_infer(name, inputs, outputs, version, t, timeout_us)
        except TritonFailure as e:
            if carry_timeout and _timed_out(e):
                raise TritonDeadline(str(e)) from None
            raise

    async def _http_infer(
        self,
        name: str,
        inputs: Mapping[str, tuple[np.ndarray, str]],
        outputs: Sequence[str],
        version: str,
        timeout_s: float,
        timeout_us: int | None,
    ) -> dict[str, np.ndarray]:
        _, mod = self._modules()
        req_inputs = []
        for n, (arr, dt) in inputs.items():
            i = mod.InferInput(n, list(arr.shape), dt)
            i.set_data_from_numpy(arr)
            req_inputs.append(i)
        req_outputs = [mod.InferRequestedOutput(n) for n in outputs]
        result = await self._call(
            f"infer {name!r}",
            "infer",
            name,
            req_inputs,
            model_version=version,
            outputs=req_outputs,
            timeout=timeout_us,
            timeout_s=timeout_s,
        )
        out: dict[str, np.ndarray] = {}
        for n in outputs:
            arr = result.as_numpy(n)
            if arr is None:
                raise TritonServerError(f"infer {name!r}: output {n!r} missing from the response")
            out[n] = arr
        return out

    async def close(self) -> None:
        await self._grpc.close()
        client, self._client = self._client, None
        loop, self._loop = self._loop, None
        await close_on_its_loop(client, loop, "the Triton client")
