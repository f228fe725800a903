"""The local channel between door worker processes and the queue process: length-prefixed
frames of a small JSON header and raw tensor bytes, over a Unix socket. No pickle: a frame is
``[u32 header length][u32 payload length][header JSON][payload]``; numeric tensors travel as
their raw bytes (dtype and shape in the header), object tensors (KServe BYTES) as tagged JSON.

Frames written in one turn of the event loop leave in one write (``FrameChannel.send``
gathers them and flushes on the next loop iteration): under load one system call carries
many requests or answers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["FrameChannel", "pack_tensors", "unpack_tensors"]

_PREFIX = struct.Struct("<II")
# A frame may carry a whole request body (the server's body limit) plus its header.
MAX_FRAME_BYTES = 1 << 31

OnFrame = Callable[[dict[str, Any], memoryview], None]


class FrameChannel(asyncio.Protocol):
    """One end of the channel. ``on_frame(header, payload)`` is called for every frame
    received (in the loop, in order); ``on_close(exc)`` once the connection is gone."""

    def __init__(self, on_frame: OnFrame, on_close: Callable[[Exception | None], None]) -> None:
        self.on_frame = on_frame
        self.on_close = on_close
        self.transport: Any = None  # an asyncio or uvloop transport
        self._buf = bytearray()
        self._out: list[bytes | memoryview] = []
        self._flush_scheduled = False
        self.closed = False

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos = 0
        n = len(buf)
        while n - pos >= 8:
            hlen, plen = _PREFIX.unpack_from(buf, pos)
            end = pos + 8 + hlen + plen
            if end > n:
                break
            start = pos + 8
            header = json.loads(buf[start : start + hlen])
            # a bytearray slice is a copy: tensors read from it are writable, as decoded ones
            payload = memoryview(buf[start + hlen : end])
            pos = end
            self.on_frame(header, payload)
        if pos:
            del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.on_close(exc)

    # ------------------------------------------------------------ sending

    def send(self, header: Mapping[str, Any], payload: list[Any] | tuple[Any, ...] = ()) -> None:
        """Queue one frame; frames queued in the same loop turn leave in one write."""
        if self.closed or self.transport is None:
            raise ConnectionError("the door channel is closed")
        head = json.dumps(header, separators=(",", ":")).encode()
        size = sum(memoryview(p).nbytes for p in payload)
        if len(head) + size > MAX_FRAME_BYTES:
            raise ValueError(f"a frame of {len(head) + size} bytes is over the channel's limit")
        self._out.append(_PREFIX.pack(len(head), size))
        self._out.append(head)
        self._out.extend(payload)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and not self.closed and self.transport is not None:
            self.transport.write(b"".join(out))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


# ---------------------------------------------------------------- tensors <-> frame parts


def _tag(x: Any) -> Any:
    """One element of an object tensor as JSON: bytes tagged (base64), the rest as is."""
    if isinstance(x, bytes | bytearray):
        return {"b": base64.b64encode(bytes(x)).decode("ascii")}
    if isinstance(x, dict):
        return {"j": x}
    return x


def _untag(x: Any) -> Any:
    if isinstance(x, dict):
        return base64.b64decode(x["b"]) if "b" in x else x["j"]
    return x


def pack_tensors(tensors: Mapping[str, np.ndarray]) -> tuple[list[list[Any]], list[Any]]:
    """``(meta, buffers)``: per tensor ``[name, dtype, shape, nbytes]`` (numeric: its raw
    bytes are the next buffer) or ``[name, "O", shape, values]`` (object: tagged JSON values,
    no buffer). Raises ``TypeError`` for an object element JSON cannot carry."""
    meta: list[list[Any]] = []
    bufs: list[Any] = []
    for name, a in tensors.items():
        shape = list(a.shape)
        if a.dtype.kind == "O":
            meta.append([name, "O", shape, [_tag(x) for x in a.reshape(-1).tolist()]])
            continue
        c = np.ascontiguousarray(a)
        meta.append([name, c.dtype.str, shape, c.nbytes])
        bufs.append(c.reshape(-1).view(np.uint8).data if c.size else b"")
    return meta, bufs


def unpack_tensors(meta: list[list[Any]], payload: memoryview) -> dict[str, np.ndarray]:
    """The tensors ``pack_tensors`` described, read from ``payload`` (numeric ones are views
    of it, writable when it is)."""
    out: dict[str, np.ndarray] = {}
    pos = 0
    for name, dt, shape, rest in meta:
        if dt == "O":
            vals = [_untag(x) for x in rest]
            arr = np.empty(len(vals), dtype=object)
            arr[:] = vals
            out[name] = arr.reshape(shape)
            continue
        n = int(rest)
        out[name] = np.frombuffer(payload[pos : pos + n], dtype=np.dtype(dt)).reshape(shape)
        pos += n
    return out
