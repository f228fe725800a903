"""Read deadlines for HTTP requests: uvicorn has none.

uvicorn times out idle keep-alive connections, but not a connection that never sends a
request, nor one that sends its headers or its body a byte at a time (slow-loris): each
holds a socket and a parser for as long as the client likes. This protocol gives a request
``timeout_s`` for its headers (from the connection's start or the request's first byte) and
as long again for its body, as nginx's ``client_header_timeout``/``client_body_timeout`` do,
then answers 408 and closes. The time an app takes to answer is not limited.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def timed_http_protocol(timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with a ``timeout_s`` deadline on reading each request."""
    if not timeout_s > 0:
        raise ValueError(f"read timeout must be > 0 s, got {timeout_s!r}")

    class _TimedHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[misc]
        _read_deadline: asyncio.TimerHandle | None = None

        def _arm(self, what: str) -> None:
            self._disarm()
            self._read_deadline = self.loop.call_later(timeout_s, self._read_timed_out, what)

        def _disarm(self) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
                self._read_deadline = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm("headers")  # a connection that never sends a request

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._read_deadline is None:  # a keep-alive connection's next request
                self._arm("headers")

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm("body")

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def _read_timed_out(self, what: str) -> None:
            self._read_deadline = None
            if self.transport.is_closing():
                return
            cycle: Any = self.cycle
            if cycle is None or cycle.response_complete or not cycle.response_started:
                body = json.dumps(
                    {
                        "detail": f"the request's {what} did not arrive within {timeout_s:g} s",
                        "error": "RequestTimeout",
                    }
                ).encode()
                self.transport.write(
                    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
                )
            # The app, if it waits for the body, sees a disconnect and ends the request.
            self.transport.close()

    return _TimedHttpToolsProtocol
