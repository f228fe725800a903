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

__all__ = [
    "SERVER_LOST",
    "TritonClient",
    "TritonConnectionError",
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


class TritonFailure(Exception):
    """Internal: a classified failure of one client call (the backend maps it to inferline's)."""


class TritonConnectionError(TritonFailure):
    """The server could not be reached or the connection broke."""


class TritonModelMissing(TritonFailure):
    """The server answered that the model is unknown or not ready."""


class TritonServerError(TritonFailure):
    """The server answered with an error (bad request, model raised, ...)."""


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
            return TritonServerError(f"{what}: {code}: {exc.details()}")
    except ImportError:  # pragma: no cover
        pass
    if isinstance(exc, ConnectionError | OSError):
        return TritonConnectionError(f"{what}: {type(exc).__name__}: {exc}")
    return TritonServerError(f"{what}: {type(exc).__name__}: {exc}")


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
    ) -> dict[str, np.ndarray]:
        """Run one request; ``inputs`` maps names to (array, protocol datatype)."""
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
        )
        out: dict[str, np.ndarray] = {}
        for n in outputs:
            arr = result.as_numpy(n)
            if arr is None:
                raise TritonServerError(f"infer {name!r}: output {n!r} missing from the response")
            out[n] = arr
        return out

    async def close(self) -> None:
        client, self._client = self._client, None
        loop, self._loop = self._loop, None
        if client is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is loop and not loop.is_closed():
            try:
                await client.close()
            except Exception:  # closing a broken connection may fail; nothing to recover
                log.debug("closing the Triton client failed", exc_info=True)
