"""JSON answers sent straight at the ASGI level (no FastAPI), by the guard and the predict
route, and the bodies the FastAPI handlers share with them."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Send

from inferline.core import BodyTooLarge, error_body

__all__ = ["INTERNAL_ERROR", "send_json", "too_large"]

INTERNAL_ERROR = {"detail": "internal error (see the server log)", "error": "InternalError"}


def too_large(limit: int) -> dict[str, Any]:
    return error_body(BodyTooLarge(limit))


async def send_json(
    send: Send, status: int, body: dict[str, Any], extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send(
        {"type": "http.response.start", "status": status, "headers": headers + (extra or [])}
    )
    await send({"type": "http.response.body", "body": data})
