"""What every gRPC front door does first and last: the bearer-token check, the bound on calls
in flight, and inferline's errors as gRPC status codes."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from inferline.core import InferlineError, NotFoundError, ValidationError, status_for
from inferline.queueing import PredictedLate

__all__ = ["Admission", "TokenCheck", "grpc_fail", "unimplemented", "with_unimplemented"]


class TokenCheck:
    """The optional bearer token of the gRPC doors (``authorization: Bearer ...`` metadata).
    With a token every RPC needs it, health and unimplemented ones included, as every HTTP
    route does."""

    def __init__(self, token: str | None) -> None:
        self.token = token

    def authorized(self, context: Any) -> bool:
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

    async def require(self, context: Any) -> None:
        import grpc

        if not self.authorized(context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


class Admission:
    """The bound on a door's inference calls in flight (every protocol on its port together).

    A call past ``limit`` is answered RESOURCE_EXHAUSTED at once, before its inputs are
    decoded, and ``refused(name)`` counts it (``name``: the model or app it asked for). The
    event loop is the only caller, so a plain counter is exact."""

    def __init__(self, limit: int | None, refused: Callable[[str], None]) -> None:
        self.limit = limit
        self.in_flight = 0
        self._refused = refused

    async def enter(self, context: Any, name: str) -> None:
        """Take a slot for this call, or abort it RESOURCE_EXHAUSTED (nothing taken)."""
        if self.limit is not None and self.in_flight >= self.limit:
            import grpc

            self._refused(name)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"overloaded: {self.in_flight} calls in flight on this door (max_inflight "
                f"{self.limit}); retry later",
            )
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1


async def grpc_fail(context: Any, e: BaseException) -> None:
    """Abort the RPC with the status code of ``e`` (the HTTP status it would get, mapped)."""
    import grpc

    code = grpc.StatusCode.INTERNAL
    if isinstance(e, PredictedLate):
        # admission's refusal: HTTP's 429 with Retry-After; gRPC's is RESOURCE_EXHAUSTED, and
        # the retry hint goes in metadata (gRPC has no Retry-After header)
        context.set_trailing_metadata((("retry-after-ms", str(round(e.retry_after_s * 1e3))),))
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        return
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


def unimplemented(auth: TokenCheck, rpc: str) -> Any:
    """An RPC inferline does not serve: UNIMPLEMENTED after the token check, instead of the
    generated base class's NotImplementedError, which logged a traceback per call."""

    async def method(self: Any, request: Any, context: Any) -> Any:
        import grpc

        await auth.require(context)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"inferline does not serve {rpc}")

    return method


def with_unimplemented(handlers: type, base: type, auth: TokenCheck, name: str) -> type:
    """A servicer class: ``handlers``' RPCs over the generated ``base``, every other RPC of
    ``base`` answered by :func:`unimplemented`."""
    cls = type(name, (handlers, base), {})
    for rpc in dir(base):
        if rpc[0].isupper() and not hasattr(handlers, rpc):
            setattr(cls, rpc, unimplemented(auth, rpc))
    return cls
