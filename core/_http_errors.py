"""Request bodies and errors as every HTTP surface of inferline reads and renders them.

Pure (no sockets): the frontend, the selection routes, the admin routes and Velox's router all
decode JSON bodies with :func:`decode_json` and map exceptions to a status and a body with
:func:`status_for` / :func:`error_body`, so a client sees one error shape everywhere:
``{"detail": message, "error": class name, ...context}``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import (
    BackendError,
    CapacityError,
    DeadlineExceededError,
    InfeasibleError,
    NotFoundError,
    OverloadedError,
    StorageError,
    ValidationError,
)

__all__ = [
    "BodyTooLarge",
    "MalformedJSON",
    "decode_json",
    "error_body",
    "json_safe",
    "status_for",
]


class MalformedJSON(ValidationError):  # named as the wire's "error" reads
    """A body that is not JSON at all (HTTP 400; a JSON body of the wrong shape is a 422)."""


class BodyTooLarge(Exception):
    """A request body (chunked, so its size was not known up front) passed the limit (413)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"request body is larger than the limit of {limit} bytes")


# A JSON escape of a UTF-16 surrogate: the only way a lone one gets into decoded text.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def decode_json(raw: bytes | str, expected: str = "JSON") -> Any:
    """``json.loads`` for request bodies: undecodable bytes, bad syntax, integers too long
    to convert and nesting too deep for the parser raise ``MalformedJSON`` naming the body,
    never a 500. A string holding an unpaired UTF-16 surrogate (``"\\ud800"``: valid JSON,
    but no text; it cannot be stored or encoded back) is a ``ValidationError`` naming where."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        what = "nesting too deep" if isinstance(e, RecursionError) else str(e)
        raise MalformedJSON("body", expected, f"malformed JSON: {what}") from None
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if _SURROGATE_ESCAPE.search(data):  # a scan of the bytes spares the walk otherwise
        _check_text(body, "body")
    return body


def _check_text(v: Any, where: str) -> None:
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError(
                where, "text without unpaired UTF-16 surrogates", json_safe(v)
            ) from None
    elif isinstance(v, dict):
        for k, x in v.items():
            _check_text(k, f"{where} (a key)" if where != "body" else "body (a key)")
            _check_text(x, k if where == "body" else f"{where}.{k}")
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _check_text(x, f"{where}[{i}]")


def json_safe(v: Any) -> Any:
    """``v`` with what strict JSON cannot carry made printable: non-finite floats as their
    ``repr``, unpaired surrogates escaped (for echoing client input back in an error)."""
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    if isinstance(v, str):
        return v.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(v, dict):
        return {json_safe(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [json_safe(x) for x in v]
    return v


# First match wins: MalformedJSON before the ValidationError it is.
_STATUS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...] = (
    (MalformedJSON, 400),
    (ValidationError, 422),
    (NotFoundError, 404),
    ((OverloadedError, CapacityError, StorageError), 503),
    (DeadlineExceededError, 504),
    (BackendError, 502),
    (InfeasibleError, 409),
    (BodyTooLarge, 413),
)


def status_for(exc: BaseException) -> int:
    """The HTTP status an inferline error maps to (500 for anything else)."""
    return next((code for kinds, code in _STATUS if isinstance(exc, kinds)), 500)


def error_body(exc: BaseException) -> dict[str, Any]:
    """``{"detail": message, "error": class name, ...context}``: the shape of every error.
    Safe to encode as strict JSON whatever the client sent (the message may quote it)."""
    body: dict[str, Any] = {"detail": str(exc), "error": type(exc).__name__}
    if isinstance(exc, ValidationError):
        body["field"] = exc.field
        body["expected"] = exc.expected
    elif isinstance(exc, NotFoundError):
        body["kind"] = exc.kind
        body["known"] = exc.known if isinstance(exc.known, list | type(None)) else repr(exc.known)
    elif isinstance(exc, OverloadedError):
        body["model"] = exc.model
    elif isinstance(exc, StorageError):
        body["store"] = exc.store
    elif isinstance(exc, BodyTooLarge):
        body["error"] = "PayloadTooLarge"
        body["limit_bytes"] = exc.limit
    return json_safe(body)
