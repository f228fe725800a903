"""Adopting a model a fleet's servers already serve (``inferline attach URL URL ...``), and
the per-member parameters a deployment gives a mixed fleet (``params.members``).

Each member discovers and adopts on its own server, the way a one-URL attach does; the fleet
records the members that hold the model as its shares. A Triton member and a TF Serving
member that serve the same model contract (inputs and outputs) then serve one logical model:
their own parameters (Triton's config, TF Serving's ``base_path`` and signature) are what each
adapter found on its server, so no shared ``params`` have to suit both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from inferline.core import ModelConfig, ModelSpec, ValidationError

__all__ = [
    "MEMBERS_KEY",
    "adopted_config",
    "check_contracts",
    "check_dtypes",
    "check_members",
    "dtypes",
    "is_ready",
    "member_spec",
    "merge_found",
]


def is_ready(info: Any) -> bool:
    """Whether a member's ``discover()`` entry is a model ready to serve: Triton's
    ``TritonModelInfo`` (state READY), TF Serving's dict (a version AVAILABLE on a server), or
    any adapter's ``{"ready": bool}``."""
    if isinstance(info, Mapping) and "servers" in info:
        return any(s.get("state") == "AVAILABLE" for st in info["servers"].values() for s in st)
    if isinstance(info, Mapping):
        return bool(info.get("ready"))
    return str(getattr(info, "state", "")) == "READY"


def merge_found(found: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, list[int]]]:
    """The members' discoveries as one: per model, the entry of the first member where it is
    ready (else the first that lists it), and the members where it is ready."""
    merged: dict[str, Any] = {}
    ready: dict[str, list[int]] = {}
    for i, f in enumerate(found):
        for name, info in f.items():
            if is_ready(info):
                if not ready.get(name):
                    merged[name] = info  # a ready member's signature describes the model
                ready.setdefault(name, []).append(i)
            else:
                merged.setdefault(name, info)
                ready.setdefault(name, [])
    return merged, ready


Contract = tuple[tuple[tuple[str, tuple[int, ...]], ...], tuple[tuple[str, tuple[int, ...]], ...]]


def contract(info: Any) -> Contract | None:
    """A discovered model's inputs and outputs as (name, per-row shape), sorted; None when the
    entry does not say (an adapter without signatures). Types are compared apart, in one
    spelling (``check_dtypes``), so that the error can name the tensor."""
    if isinstance(info, Mapping) and "servers" in info:  # TF Serving
        sigs = info.get("signatures") or {}
        sd = sigs.get("serving_default") or next(iter(sigs.values()), None)
        if not sd:
            return None

        def tf(d: Mapping[str, Any]) -> tuple[tuple[str, tuple[int, ...]], ...]:
            return tuple(
                sorted(
                    (a, tuple(int(x) for x in (t.get("shape") or [-1])[1:])) for a, t in d.items()
                )
            )

        return tf(sd["inputs"]), tf(sd["outputs"])
    io = getattr(info, "io", None)  # Triton
    if io is None:
        return None
    return (
        tuple(sorted((t.name, tuple(int(x) for x in t.dims)) for t in io.inputs)),
        tuple(sorted((t.name, tuple(int(x) for x in t.dims)) for t in io.outputs)),
    )


def check_contracts(model: str, infos: Mapping[str, Any]) -> None:
    """Refuse to adopt ``model`` as one when the servers (URL -> discovered entry) serve
    different inputs or outputs (names, per-row shapes, then types: ``check_dtypes``): a
    query answered by one server would not mean what the other's answer means."""
    known = {u: c for u, c in ((u, contract(i)) for u, i in infos.items()) if c is not None}
    if len({c for c in known.values()}) > 1:
        raise ValidationError(
            f"adopt({model!r})",
            "the same inputs and outputs (names, shapes) on every server",
            {u: {"inputs": list(c[0]), "outputs": list(c[1])} for u, c in known.items()},
        )
    check_dtypes(model, infos)


# TF Serving's dtype names in Triton's (the KServe v2 protocol's) spelling, to compare them
_TF_DTYPES = {
    "DT_FLOAT": "FP32",
    "DT_DOUBLE": "FP64",
    "DT_HALF": "FP16",
    "DT_BFLOAT16": "BF16",
    "DT_INT8": "INT8",
    "DT_INT16": "INT16",
    "DT_INT32": "INT32",
    "DT_INT64": "INT64",
    "DT_UINT8": "UINT8",
    "DT_UINT16": "UINT16",
    "DT_UINT32": "UINT32",
    "DT_UINT64": "UINT64",
    "DT_BOOL": "BOOL",
    "DT_STRING": "BYTES",
}


def _dtype_name(raw: Any) -> str | None:
    """One spelling for a tensor's type: ``DT_FLOAT``, ``TYPE_FP32`` and ``FP32`` are all
    ``FP32``; None when the entry gives none (or one this table does not know)."""
    if not raw:
        return None
    t = str(raw).upper()
    if t.startswith("DT_"):
        return _TF_DTYPES.get(t)
    t = t[5:] if t.startswith("TYPE_") else t
    return "BYTES" if t == "STRING" else t


def dtypes(info: Any) -> dict[str, str] | None:
    """A discovered model's tensor types, ``{"input x": "FP32", "output probabilities":
    ...}`` (each in Triton's spelling); None when the entry has no signature."""
    if isinstance(info, Mapping) and "servers" in info:  # TF Serving
        sigs = info.get("signatures") or {}
        sd = sigs.get("serving_default") or next(iter(sigs.values()), None)
        if not sd:
            return None
        pairs = [
            (f"{side[:-1]} {a}", t.get("dtype"))
            for side in ("inputs", "outputs")
            for a, t in sd[side].items()
        ]
    else:
        io = getattr(info, "io", None)  # Triton
        if io is None:
            return None
        pairs = [
            (f"{side[:-1]} {t.name}", getattr(t, "datatype", None))
            for side in ("inputs", "outputs")
            for t in getattr(io, side)
        ]
    return {k: n for k, v in pairs if (n := _dtype_name(v)) is not None}


def check_dtypes(model: str, infos: Mapping[str, Any]) -> None:
    """Refuse to adopt ``model`` as one when two servers give one tensor different types
    (FP32 here, FP64 there: the same query would be encoded differently); the error names
    the tensor and each server's type. A type a server does not report is not compared."""
    per = {u: d for u, d in ((u, dtypes(i)) for u, i in infos.items()) if d}
    for tensor in sorted({t for d in per.values() for t in d}):
        seen = {u: d[tensor] for u, d in per.items() if tensor in d}
        if len(set(seen.values())) > 1:
            side, name = tensor.split(" ", 1)
            raise ValidationError(
                f"adopt({model!r}).{side}s[{name!r}].dtype",
                "the same type on every server",
                seen,
            )


def adopted_config(model: str, configs: Mapping[int, ModelConfig]) -> ModelConfig:
    """The fleet's view of a model adopted on several members: every member's replicas, the
    largest batch all of them take, one hardware kind (a batch goes to any replica)."""
    kinds = sorted({c.hardware for c in configs.values()})
    if len(kinds) > 1:
        raise ValidationError(
            f"adopt({model!r}).hardware", "one hardware kind on every member", kinds
        )
    return ModelConfig(
        kinds[0],
        min(c.max_batch_size for c in configs.values()),
        sum(c.replicas for c in configs.values()),
    )


MEMBERS_KEY = "members"


def member_spec(spec: ModelSpec, url: str, urls: Sequence[str]) -> ModelSpec:
    """``spec`` as member ``url`` deploys it: ``params`` without ``members``, overlaid with
    ``params.members[scheme]`` (the member URL's scheme, e.g. ``tfserving+grpc``) and then
    ``params.members[url]`` (one member). An entry's ``source`` replaces ``spec.source`` (the
    model's name on that server). A Triton and a TF Serving member of one fleet so get their
    own parameters (TF Serving's ``base_path``, which Triton refuses)."""
    per = spec.params.get(MEMBERS_KEY)
    if per is None:
        return spec
    check_members(spec, urls)
    params = {k: v for k, v in spec.params.items() if k != MEMBERS_KEY}
    source = spec.source
    for key in (url.split("://", 1)[0], url):
        extra = dict(per.get(key) or {})
        source = str(extra.pop("source", source))
        params.update(extra)
    return replace(spec, source=source, params=params)


def check_members(spec: ModelSpec, urls: Sequence[str]) -> None:
    """``params.members``: a mapping from a member's scheme or URL to a mapping of params;
    a key that names no member is refused (a typo would silently deploy the shared params)."""
    where = f"{spec.name}.params.{MEMBERS_KEY}"
    per = spec.params.get(MEMBERS_KEY)
    if not isinstance(per, Mapping):
        raise ValidationError(where, "a mapping {scheme or member URL: {params}}", per)
    known = set(urls) | {u.split("://", 1)[0] for u in urls}
    for key, extra in per.items():
        if key not in known:
            raise ValidationError(f"{where}[{key!r}]", f"one of {sorted(known)}", key)
        if not isinstance(extra, Mapping):
            raise ValidationError(f"{where}[{key!r}]", "a mapping of params", extra)
