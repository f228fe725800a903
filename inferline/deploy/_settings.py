"""``ServeSettings``: how a built service is served and which control loops it runs, one
frozen, JSON-round-tripping object that ``inferline serve`` and ``inferline attach`` make
from their options and the composition root (``_build``, ``_serve``) reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from inferline.core import TunerConfig, ValidationError
from inferline.deploy._drift_policy import DriftConfig
from inferline.deploy._tuning_queue import check_variant_queue
from inferline.server import DEFAULT_MAX_BODY_BYTES, DEFAULT_READ_TIMEOUT_S
from inferline.server.frontdoors import DEFAULT_MAX_INFLIGHT, DEFAULT_MAX_ROWS, check_max_rows

__all__ = ["ServeSettings"]


def _int(where: str, v: Any, low: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValidationError(where, f"an integer >= {low}", v)


@dataclass(frozen=True)
class ServeSettings:
    """Where and how to serve. ``grpc_port``: the gRPC front doors' port (0: any free port;
    None: none); ``grpc_max_inflight``: inference calls in flight on the gRPC doors, past
    which a call is answered RESOURCE_EXHAUSTED at once (counted); ``allowed_hosts``: the ``Host`` names answered (None: the bound address and
    localhost); ``tuner``: the live tuner's configuration (None: no tuner; it runs only for a
    plan with tuner inputs); ``drift``: the drift loop's (None: off); ``door_workers``: HTTP door worker processes
    in front of the one queue process (0: the single process; docs/triton-overhead.md);
    ``variant_queue``: the tuner's variant stages share one queue (``shared``) or keep one
    per variant (``per_variant``; docs/variants.md)."""

    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_request_rows: int = DEFAULT_MAX_ROWS
    allowed_hosts: tuple[str, ...] | None = None
    grpc_port: int | None = None
    grpc_max_inflight: int = DEFAULT_MAX_INFLIGHT
    ready_file: str | None = None
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    tuner: TunerConfig | None = TunerConfig()  # noqa: RUF009 (frozen)
    variant_switching: bool = True
    drift: DriftConfig | None = None
    door_workers: int = 0
    variant_queue: str = "shared"

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValidationError("host", "an address to bind (127.0.0.1)", self.host)
        _int("port", self.port, 0)
        _int("max_body_bytes", self.max_body_bytes, 1)
        check_max_rows(self.max_request_rows)
        if self.grpc_port is not None:
            _int("grpc_port", self.grpc_port, 0)
        _int("grpc_max_inflight", self.grpc_max_inflight, 1)
        _int("door_workers", self.door_workers, 0)
        check_variant_queue(self.variant_queue)
        rt = self.read_timeout_s
        if isinstance(rt, bool) or not isinstance(rt, int | float) or not rt > 0:
            raise ValidationError("read_timeout_s", "a number of seconds > 0", rt)
        if self.allowed_hosts is not None:
            object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["allowed_hosts"] = None if self.allowed_hosts is None else list(self.allowed_hosts)
        d["tuner"] = None if self.tuner is None else self.tuner.to_dict()
        d["drift"] = None if self.drift is None else self.drift.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Any) -> ServeSettings:
        if not isinstance(d, Mapping):
            raise ValidationError("settings", "an object of serve settings", type(d).__name__)
        known = {f.name for f in fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise ValidationError("settings", f"only keys {sorted(known)}", extra)
        kw = dict(d)
        if kw.get("tuner") is not None:
            kw["tuner"] = TunerConfig.from_dict(kw["tuner"], "settings.tuner")
        if kw.get("drift") is not None:
            kw["drift"] = DriftConfig.from_dict(kw["drift"])
        return cls(**kw)
