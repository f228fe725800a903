"""Triton model configurations: what inferline changes, and what discovery reports.

Deploying or reconfiguring a model in explicit model-control mode sends the *whole* model
configuration (protobuf JSON) with ``load_model(name, config=...)``; it is not merged with the
repository's ``config.pbtxt`` and unknown keys are rejected. So the adapter always starts from
the configuration the server reports, changes only ``max_batch_size``, ``instance_group`` and
the batcher, and sends the result back. Changing only the instance count updates the model in
place (running instances keep serving).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferline.core import ValidationError

from ._tensors import ModelIO

__all__ = [
    "KEEP_BATCHER",
    "BatcherSettings",
    "TritonModelInfo",
    "build_config",
    "config_differs",
    "instance_count",
    "steer_config",
]


@dataclass(frozen=True)
class BatcherSettings:
    """Triton's own dynamic batcher. inferline turns it off by default: its interposed queue
    forms the batches and keeps at most one in flight per instance, so Triton's queue stays
    empty. Turned on only to compare against (or to serve without inferline's queue)."""

    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.max_queue_delay_us, bool) or self.max_queue_delay_us < 0:
            raise ValidationError("max_queue_delay_us", "an int >= 0", self.max_queue_delay_us)
        object.__setattr__(
            self, "preferred_batch_sizes", tuple(int(b) for b in self.preferred_batch_sizes)
        )

    def to_config(self) -> dict[str, Any]:
        d: dict[str, Any] = {"max_queue_delay_microseconds": int(self.max_queue_delay_us)}
        if self.preferred_batch_sizes:
            d["preferred_batch_size"] = list(self.preferred_batch_sizes)
        return d

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_queue_delay_us": self.max_queue_delay_us,
            "preferred_batch_sizes": list(self.preferred_batch_sizes),
        }

    @classmethod
    def from_dict(cls, d: Any) -> BatcherSettings:
        if not isinstance(d, Mapping):
            raise ValidationError("dynamic_batching", "a mapping", d)
        extra = set(d) - {"max_queue_delay_us", "preferred_batch_sizes"}
        if extra:
            raise ValidationError(
                "dynamic_batching", "keys max_queue_delay_us, preferred_batch_sizes", sorted(extra)
            )
        return cls(int(d.get("max_queue_delay_us", 0)), tuple(d.get("preferred_batch_sizes", ())))

    @classmethod
    def from_config(cls, d: Mapping[str, Any]) -> BatcherSettings:
        return cls(
            int(d.get("max_queue_delay_microseconds", 0) or 0),
            tuple(d.get("preferred_batch_size", ()) or ()),
        )


KEEP_BATCHER = object()  # build_config: leave dynamic_batching as the server has it


def instance_count(cfg: Mapping[str, Any]) -> int:
    """Total instances of a configuration (each group's count, times its GPUs if any)."""
    return sum(_group_instances(g) for g in cfg.get("instance_group", []) or [])


def _group_instances(g: Mapping[str, Any]) -> int:
    """A group's instances: its count, times its GPUs for ``KIND_GPU`` (count is per GPU)."""
    n = int(g.get("count", 1) or 1)
    return n * max(1, len(g.get("gpus") or [])) if g.get("kind") == "KIND_GPU" else n


def _scaled_groups(
    groups: list[dict[str, Any]], replicas: int, gpus: Sequence[int] | None, name: str
) -> list[dict[str, Any]]:
    """``groups`` with ``replicas`` instances in all. inferline manages the first group only
    (the model's only group, usually); it changes that group's ``count`` and keeps each of its
    other fields (name, kind, gpus, rate limiter, host policy, profile, passive, secondary
    devices) and every other group exactly. ``gpus`` given (placing on GPU hardware) and a
    first group that is not ``KIND_GPU``: that group becomes one ``KIND_GPU`` group per GPU,
    round-robin (a hardware change inferline was asked to make)."""
    first = groups[0] if groups else {"kind": "KIND_GPU" if gpus else "KIND_CPU"}
    others = groups[1:]
    held = sum(_group_instances(g) for g in others)
    mine = replicas - held
    if mine < 1:
        raise ValidationError(
            f"{name}.replicas",
            f"more than {held}: the model's other instance groups hold {held} instance(s) "
            "inferline does not change (it scales the first group)",
            replicas,
        )
    kind = first.get("kind", "KIND_CPU")
    if gpus and kind != "KIND_GPU":
        per: dict[int, int] = {}
        for i in range(mine):
            g = int(gpus[i % len(gpus)])
            per[g] = per.get(g, 0) + 1
        base = {k: v for k, v in first.items() if k not in ("name", "count", "kind", "gpus")}
        made = [
            {**base, "count": n, "kind": "KIND_GPU", "gpus": [g]} for g, n in sorted(per.items())
        ]
        return made + others
    group = dict(first)
    if (
        gpus is not None and not gpus and kind == "KIND_GPU"
    ):  # placing on CPU hardware: asked to move it off GPU
        group["kind"] = "KIND_CPU"
        group.pop("gpus", None)
    per_gpu = len(group.get("gpus") or []) if group.get("kind") == "KIND_GPU" else 0
    if per_gpu > 1 and mine % per_gpu:
        raise ValidationError(
            f"{name}.replicas",
            f"{held} + a multiple of {per_gpu}: the first instance group is KIND_GPU on "
            f"{per_gpu} GPUs and its count is per GPU (replicas = count x GPUs)",
            replicas,
        )
    group["count"] = mine // max(1, per_gpu)
    return [group, *others]


def build_config(
    current: Mapping[str, Any],
    *,
    max_batch_size: int,
    replicas: int,
    gpus: Sequence[int] | None = None,
    batcher: BatcherSettings | object | None = None,
) -> dict[str, Any]:
    """``current`` with inferline's settings: ``replicas`` instances, ``max_batch_size`` and
    the batcher; every other field as it is.

    ``gpus``: None keeps the first instance group's kind and placement (``KIND_CPU``,
    ``KIND_MODEL`` or ``KIND_GPU`` with its ``gpus``: scaling changes its count only); a list
    of GPU ids places the model on GPU hardware (a group already ``KIND_GPU`` keeps its own
    ``gpus``); ``[]`` places it on CPU hardware (a ``KIND_GPU`` group becomes ``KIND_CPU``).
    ``batcher``: ``KEEP_BATCHER`` leaves ``dynamic_batching`` exactly as it is (an adopted
    model: the operator's), None turns it off, settings turn it on.
    """
    if replicas < 1:
        raise ValidationError("replicas", "an int >= 1 (0 unloads the model)", replicas)
    cfg = copy.deepcopy(dict(current))
    name = str(cfg.get("name", "model"))
    cur_mb = int(cfg.get("max_batch_size", 0) or 0)
    if cur_mb == 0:
        if max_batch_size > 1:
            raise ValidationError(
                f"{name}.max_batch_size",
                "1 (the model's configuration has max_batch_size 0: it takes no batch dimension)",
                max_batch_size,
            )
    elif cur_mb != max_batch_size:
        cfg["max_batch_size"] = int(max_batch_size)
    groups = [dict(g) for g in cfg.get("instance_group", []) or []]
    cfg["instance_group"] = _scaled_groups(groups, int(replicas), gpus, name)
    if batcher is KEEP_BATCHER:
        return cfg
    if batcher is None or cur_mb == 0:
        cfg.pop("dynamic_batching", None)
    else:
        assert isinstance(batcher, BatcherSettings)
        db = batcher.to_config()
        # Triton rejects preferred sizes above max_batch_size (a smaller planned batch)
        pref = [b for b in db.get("preferred_batch_size", []) if b <= max_batch_size]
        if pref:
            db["preferred_batch_size"] = pref
        else:
            db.pop("preferred_batch_size", None)
        cfg["dynamic_batching"] = db
    return cfg


def steer_config(
    current: Mapping[str, Any], batcher: Mapping[str, Any], instances: int
) -> dict[str, Any]:
    """``current`` with a planned Triton batcher (``TritonBatcher.to_dict()``, a plan's
    ``server_batchers[model]``) and ``instances`` in all: ``max_batch_size`` (where the model
    has a batch dimension), the first instance group's count (``build_config``), and in
    ``dynamic_batching`` the queue delay, the preferred sizes (empty: unset, the max) and, with
    a timeout, ``default_queue_policy`` (REJECT after it, overridable per request). Every
    other field stays as the operator set it: other instance groups, rate limiter, warmup,
    parameters, the batcher's priority levels, ``preserve_ordering``, the queue's size."""
    where = f"{current.get('name', 'model')}.server_batchers"
    if batcher.get("kind", "triton") != "triton":
        raise ValidationError(f"{where}.kind", "'triton'", batcher.get("kind"))
    mb = int(batcher.get("max_batch_size", 0) or 0)
    if int(current.get("max_batch_size", 0) or 0) == 0:
        mb = 1  # no batch dimension: the model takes one item per request, as it is
    # the operator's other instance groups stay and count: the first group keeps at least one
    held = sum(_group_instances(g) for g in (current.get("instance_group") or [])[1:])
    instances = max(int(instances), held + 1)
    cfg = build_config(current, max_batch_size=mb, replicas=instances, batcher=KEEP_BATCHER)
    if int(cfg.get("max_batch_size", 0) or 0) == 0:
        return cfg  # nothing for a batcher to form
    db = dict(cfg.get("dynamic_batching") or {})
    db["max_queue_delay_microseconds"] = int(batcher.get("max_queue_delay_microseconds", 0))
    pref = [int(b) for b in batcher.get("preferred_batch_size", ()) or () if int(b) <= mb]
    if pref:
        db["preferred_batch_size"] = pref
    else:
        db.pop("preferred_batch_size", None)
    timeout = int(batcher.get("default_timeout_microseconds", 0) or 0)
    if timeout > 0:
        q = dict(db.get("default_queue_policy") or {})
        q.update(
            timeout_action="REJECT",
            default_timeout_microseconds=timeout,
            allow_timeout_override=True,
        )
        db["default_queue_policy"] = q
    cfg["dynamic_batching"] = db
    return cfg


def config_differs(cfg: Mapping[str, Any], want: Mapping[str, Any]) -> str | None:
    """What of inferline's configuration ``want`` the server's ``cfg`` lacks, or None."""
    if instance_count(cfg) != instance_count(want):
        return f"{instance_count(cfg)} instances, not {instance_count(want)}"
    if cfg.get("max_batch_size", 0) != want.get("max_batch_size", 0):
        got, exp = cfg.get("max_batch_size", 0), want.get("max_batch_size", 0)
        return f"max batch size {got}, not {exp}"
    if (cfg.get("dynamic_batching") is None) != (want.get("dynamic_batching") is None):
        return "dynamic batching " + ("on" if cfg.get("dynamic_batching") is not None else "off")
    return None


@dataclass(frozen=True)
class TritonModelInfo:
    """What discovery reports about one model of an existing server."""

    name: str
    state: str  # READY, UNAVAILABLE, LOADING, ... ("" when never loaded)
    versions: tuple[str, ...] = ()
    backend: str = ""
    io: ModelIO | None = None
    instances: int = 0
    instance_kind: str = ""
    batcher: BatcherSettings | None = None
    reason: str = ""
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def max_batch_size(self) -> int:
        return self.io.max_batch_size if self.io else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "versions": list(self.versions),
            "backend": self.backend,
            "io": self.io.to_dict() if self.io else None,
            "instances": self.instances,
            "instance_kind": self.instance_kind,
            "batcher": self.batcher.to_dict() if self.batcher else None,
            "reason": self.reason,
            "config": dict(self.config),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TritonModelInfo:
        return cls(
            name=str(d["name"]),
            state=str(d.get("state", "")),
            versions=tuple(d.get("versions", ())),
            backend=str(d.get("backend", "")),
            io=ModelIO.from_dict(d["io"]) if d.get("io") else None,
            instances=int(d.get("instances", 0)),
            instance_kind=str(d.get("instance_kind", "")),
            batcher=BatcherSettings.from_dict(d["batcher"]) if d.get("batcher") else None,
            reason=str(d.get("reason", "")),
            config=dict(d.get("config", {})),
        )

    @classmethod
    def from_server(
        cls, name: str, entries: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None
    ) -> TritonModelInfo:
        states = [str(e.get("state", "")) for e in entries]
        state = "READY" if "READY" in states else (states[0] if states else "")
        versions = tuple(sorted(str(e["version"]) for e in entries if e.get("version")))
        reason = next((str(e["reason"]) for e in entries if e.get("reason")), "")
        if config is None:
            return cls(name, state, versions, reason=reason)
        groups = config.get("instance_group", []) or []
        kinds = sorted({str(g.get("kind", "KIND_CPU")) for g in groups})
        db = config.get("dynamic_batching")
        return cls(
            name=name,
            state=state,
            versions=versions,
            backend=str(config.get("backend", "") or config.get("platform", "")),
            io=ModelIO.from_config(config),
            instances=instance_count(config),
            instance_kind=",".join(kinds),
            batcher=BatcherSettings.from_config(db) if isinstance(db, Mapping) else None,
            reason=reason,
            config=dict(config),
        )
