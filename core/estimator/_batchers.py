"""The servers' own batchers as estimator policies (docs: /work/shared/BACKENDS.md "The servers'
own batchers"): Triton's dynamic batcher and TF Serving's batch scheduler, set per model in
``EstimatorOptions.server_batchers``.

A model with a server batcher is batched by that server's rules instead of the estimator's
(EDF, greedy or ``batch_wait_s``); its queue is first in, first out by the time a request
entered it (ties: the earlier query first). The rules as simulated:

* :class:`TritonBatcher` (all instances, i.e. the model's replicas, pull from one queue; a
  batch is formed only when an instance is idle). When an instance is idle, requests whose
  queue time has reached ``default_timeout_microseconds`` (0: none) are rejected first
  (Triton checks expiry lazily, when it walks the queue: a request is never served late).
  Then with ``n`` queued and ``cap = min(n, max_batch_size)``: the largest preferred size
  ``<= cap`` is sent if there is one and the oldest queued request has waited less than
  ``max_queue_delay_microseconds``; otherwise ``cap`` is sent if that delay is 0 or has
  passed; otherwise the batcher waits until the oldest has waited the delay.
* :class:`TFServingBatcher`. Requests join the open batch; one that does not fit (the open
  batch holds ``max_batch_size``) closes it and opens a new one, unless the scheduler already
  holds ``max_enqueued_batches`` batches (closed and open): then it is refused at once. A
  closed batch is schedulable at once, the open one when full or when its first request has
  waited ``batch_timeout_micros``; a schedulable batch starts when one of
  ``num_batch_threads`` is free and a replica is idle. A batch is padded to the smallest of
  ``allowed_batch_sizes`` it fits and costs that size's latency.

Both apply the batcher's ``max_batch_size`` instead of the model configuration's (and a
controller's: it may change such a model's replicas, not its batching). The microsecond
settings are taken as ``us / 1e6`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .._validate import as_int, as_list, as_mapping, as_str, no_extra_keys, req
from ..errors import ValidationError

__all__ = ["ServerBatcher", "TFServingBatcher", "TritonBatcher", "batcher_from_dict"]


def _sizes(value: Any, where: str) -> tuple[int, ...]:
    return tuple(as_int(v, f"{where}[{k}]", minimum=1) for k, v in enumerate(as_list(value, where)))


@dataclass(frozen=True)
class TritonBatcher:
    """Triton's ``dynamic_batching`` of one model (``default_queue_policy`` with
    ``timeout_action: REJECT``). ``preferred_batch_size`` empty: ``max_batch_size``."""

    max_batch_size: int
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0
    default_timeout_microseconds: int = 0  # 0: no timeout

    kind: ClassVar[str] = "triton"

    def check(self, where: str = "") -> TritonBatcher:
        """Itself, or a ValidationError naming the field (``where``: the field's prefix)."""
        mb = as_int(self.max_batch_size, f"{where}max_batch_size", minimum=1)
        pref = _sizes(self.preferred_batch_size, f"{where}preferred_batch_size")
        for k, p in enumerate(pref):
            if p > mb:
                raise ValidationError(
                    f"{where}preferred_batch_size[{k}]", f"at most max_batch_size {mb}", p
                )
        as_int(self.max_queue_delay_microseconds, f"{where}max_queue_delay_microseconds", minimum=0)
        as_int(self.default_timeout_microseconds, f"{where}default_timeout_microseconds", minimum=0)
        return self

    def __post_init__(self) -> None:
        if isinstance(self.preferred_batch_size, list):  # from JSON: a tuple keeps it hashable
            object.__setattr__(self, "preferred_batch_size", tuple(self.preferred_batch_size))
        self.check()

    @property
    def preferred(self) -> tuple[int, ...]:
        """The preferred sizes, increasing (unset: ``max_batch_size``)."""
        return tuple(sorted(set(self.preferred_batch_size))) or (self.max_batch_size,)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "max_batch_size": self.max_batch_size,
            "preferred_batch_size": list(self.preferred_batch_size),
            "max_queue_delay_microseconds": self.max_queue_delay_microseconds,
            "default_timeout_microseconds": self.default_timeout_microseconds,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "") -> TritonBatcher:
        m = as_mapping(d, where.rstrip(".") or "batcher")
        no_extra_keys(m, {*cls.__dataclass_fields__, "kind"}, where.rstrip("."))
        try:
            return cls(
                max_batch_size=req(m, "max_batch_size", where.rstrip(".")),
                preferred_batch_size=_sizes(
                    m.get("preferred_batch_size", []), f"{where}preferred_batch_size"
                ),
                max_queue_delay_microseconds=m.get("max_queue_delay_microseconds", 0),
                default_timeout_microseconds=m.get("default_timeout_microseconds", 0),
            )
        except ValidationError as e:  # name the field with its place in the document
            raise _placed(e, where) from None


@dataclass(frozen=True)
class TFServingBatcher:
    """TF Serving's batching parameters of one model (``--batching_parameters_file`` or a
    version's ``batching_params.pbtxt``). ``allowed_batch_sizes`` empty: no padding."""

    max_batch_size: int
    batch_timeout_micros: int = 0
    num_batch_threads: int = 1
    max_enqueued_batches: int = 10
    allowed_batch_sizes: tuple[int, ...] = ()

    kind: ClassVar[str] = "tfserving"

    def check(self, where: str = "") -> TFServingBatcher:
        """Itself, or a ValidationError naming the field (``where``: the field's prefix)."""
        mb = as_int(self.max_batch_size, f"{where}max_batch_size", minimum=1)
        as_int(self.batch_timeout_micros, f"{where}batch_timeout_micros", minimum=0)
        as_int(self.num_batch_threads, f"{where}num_batch_threads", minimum=1)
        as_int(self.max_enqueued_batches, f"{where}max_enqueued_batches", minimum=1)
        allowed = _sizes(self.allowed_batch_sizes, f"{where}allowed_batch_sizes")
        for k in range(1, len(allowed)):
            if allowed[k] <= allowed[k - 1]:  # TF Serving refuses to load otherwise
                raise ValidationError(
                    f"{where}allowed_batch_sizes[{k}]", f"more than {allowed[k - 1]}", allowed[k]
                )
        if allowed and allowed[-1] != mb:
            raise ValidationError(
                f"{where}allowed_batch_sizes[{len(allowed) - 1}]",
                f"the last allowed size equal to max_batch_size {mb}",
                allowed[-1],
            )
        return self

    def __post_init__(self) -> None:
        if isinstance(self.allowed_batch_sizes, list):
            object.__setattr__(self, "allowed_batch_sizes", tuple(self.allowed_batch_sizes))
        self.check()

    def padded(self, b: int) -> int:
        """The size a batch of ``b`` is padded to (and costs)."""
        return next((a for a in self.allowed_batch_sizes if a >= b), b)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "max_batch_size": self.max_batch_size,
            "batch_timeout_micros": self.batch_timeout_micros,
            "num_batch_threads": self.num_batch_threads,
            "max_enqueued_batches": self.max_enqueued_batches,
            "allowed_batch_sizes": list(self.allowed_batch_sizes),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "") -> TFServingBatcher:
        m = as_mapping(d, where.rstrip(".") or "batcher")
        no_extra_keys(m, {*cls.__dataclass_fields__, "kind"}, where.rstrip("."))
        try:
            return cls(
                max_batch_size=req(m, "max_batch_size", where.rstrip(".")),
                batch_timeout_micros=m.get("batch_timeout_micros", 0),
                num_batch_threads=m.get("num_batch_threads", 1),
                max_enqueued_batches=m.get("max_enqueued_batches", 10),
                allowed_batch_sizes=_sizes(
                    m.get("allowed_batch_sizes", []), f"{where}allowed_batch_sizes"
                ),
            )
        except ValidationError as e:
            raise _placed(e, where) from None


ServerBatcher = TritonBatcher | TFServingBatcher
_KINDS: dict[str, type[TritonBatcher] | type[TFServingBatcher]] = {
    "triton": TritonBatcher,
    "tfserving": TFServingBatcher,
}


def batcher_from_dict(d: Any, where: str = "batcher") -> ServerBatcher:
    """A batcher from its ``to_dict()`` (its ``kind`` says which)."""
    m = as_mapping(d, where)
    kind = as_str(req(m, "kind", where), f"{where}.kind")
    if kind not in _KINDS:
        raise ValidationError(f"{where}.kind", f"one of {sorted(_KINDS)!r}", kind)
    return _KINDS[kind].from_dict(m, f"{where}.")


def _placed(e: ValidationError, where: str) -> ValidationError:
    if not where or e.field.startswith(where):
        return e
    return ValidationError(f"{where}{e.field}", e.expected, e.got)
