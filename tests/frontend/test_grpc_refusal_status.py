"""Admission's refusal over gRPC is RESOURCE_EXHAUSTED with a retry hint (HTTP answers it 429
with Retry-After), not UNAVAILABLE: a client that retries UNAVAILABLE at once would come back
before the backlog that refused it drained."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from inferline.queueing import PredictedLate
from inferline.server.frontdoors._grpc_status import grpc_fail


class _Context:
    """A stand-in for grpc.aio's servicer context (fake: records what the door sets)."""

    def __init__(self) -> None:
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.aborted: tuple[Any, str] | None = None

    def set_trailing_metadata(self, md: tuple[tuple[str, str], ...]) -> None:
        self.trailing = md

    async def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)


def test_a_predicted_late_refusal_is_resource_exhausted_with_a_retry_hint() -> None:
    ctx = _Context()
    asyncio.run(grpc_fail(ctx, PredictedLate("m", "admission", 0.03, 0.25)))
    assert ctx.aborted is not None and ctx.aborted[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(ctx.trailing) == {"retry-after-ms": "250"}
