"""What a protocol front door runs requests through: a served name's tensors (``Signature``) and ``FrontDoor``, which turns a batched request into one query per row of inferline's queue and stacks the answers back."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from inferline.core import NotFoundError, ValidationError, cast_exact
from inferline.server._service import Service
from inferline.server.frontdoors._deadline import DEFAULT_LIMITS, RequestLimits
from inferline.server.frontdoors._outputs import columns, per_query, stack_column

T = TypeVar("T")
log = logging.getLogger(__name__)

__all__ = [
    "CONFIG_TYPE_OF",
    "DEFAULT_MAX_ROWS",
    "KSERVE_DTYPES",
    "KSERVE_EXTENSIONS",
    "KSERVE_OF",
    "OFF_LOOP_BYTES",
    "TF_DTYPES",
    "TF_OF",
    "FrontDoor",
    "Signature",
    "TensorInfo",
    "check_max_rows",
    "check_shape",
    "decode_off_loop",
    "dtype_name",
]

# The rows one request may carry on every door: the native route's ``App.max_batch_inputs``.
DEFAULT_MAX_ROWS = 256
# The KServe v2 extensions both doors serve (what ``/v2`` and ``ServerMetadata`` list).
KSERVE_EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics")
# Requests larger than this are decoded in a worker thread, not on the event loop.
OFF_LOOP_BYTES = 64 << 10

KSERVE_DTYPES = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}


KSERVE_OF = {v: k for k, v in KSERVE_DTYPES.items()}


# numpy dtype name -> Triton model-configuration ``DataType`` (what ``/config`` reports).
CONFIG_TYPE_OF = {
    v: "TYPE_STRING" if k == "BYTES" else f"TYPE_{k}" for k, v in KSERVE_DTYPES.items()
}


TF_DTYPES = {
    "DT_FLOAT": "float32",
    "DT_DOUBLE": "float64",
    "DT_INT32": "int32",
    "DT_UINT8": "uint8",
    "DT_INT16": "int16",
    "DT_INT8": "int8",
    "DT_INT64": "int64",
    "DT_BOOL": "bool",
    "DT_UINT16": "uint16",
    "DT_HALF": "float16",
    "DT_UINT32": "uint32",
    "DT_UINT64": "uint64",
    "DT_STRING": "object",
}


TF_OF = {v: k for k, v in TF_DTYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    """One named tensor: numpy dtype name and per-query shape (-1: any size)."""

    name: str
    dtype: str = "float32"
    shape: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TensorInfo:
        return cls(
            str(d["name"]),
            str(d.get("dtype", "float32")),
            tuple(int(s) for s in d.get("shape", ())),
        )


@dataclass(frozen=True)
class Signature:
    """The tensors of a served name (queries are rows of the batch dimension)."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Signature:
        return cls(
            tuple(TensorInfo.from_dict(t) for t in d.get("inputs", ())),
            tuple(TensorInfo.from_dict(t) for t in d.get("outputs", ())),
        )


@dataclass
class NameStats:
    """Per-name request counters for the KServe statistics extension (``/stats``)."""

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    inference_count: int = 0  # rows (queries) answered
    execution_count: int = 0  # requests answered
    last_inference_ms: int = 0

    def record(self, rows: int, ns: int, ok: bool) -> None:
        if ok:
            self.success_count += 1
            self.success_ns += ns
            self.inference_count += rows
            self.execution_count += 1
        else:
            self.fail_count += 1
            self.fail_ns += ns
        self.last_inference_ms = time.time_ns() // 1_000_000


def dtype_name(a: np.ndarray) -> str:
    return "object" if a.dtype.kind in "OSU" else a.dtype.name


def check_shape(shape: Sequence[Any], field: str, max_rows: int | None) -> int:
    """A declared tensor shape, before anything is allocated for it: sizes are integers >= 0
    and the batch dimension holds at least one row and at most ``max_rows``. Returns the
    element count (a Python int: a huge shape cannot wrap around as an int64 product
    would)."""
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ValidationError(field, "a list of sizes (integers >= 0)", list(shape))
    if shape and shape[0] == 0:  # no query to run: before, an internal "need at least one array"
        raise ValidationError(field, "at least one row in the batch dimension", list(shape))
    if max_rows is not None and shape and shape[0] > max_rows:
        raise ValidationError(
            field, f"at most {max_rows} rows in the batch dimension", f"{shape[0]} rows"
        )
    return math.prod(shape)


async def decode_off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, in a worker thread when the request is ``size`` > ``OFF_LOOP_BYTES``
    bytes: decoding one large body must not hold the event loop (health checks and every
    other request wait on it)."""
    if size > OFF_LOOP_BYTES:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


def check_max_rows(max_rows: Any) -> int:
    """The row cap of every door: an integer >= 1."""
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValidationError("max_rows", "an integer >= 1", max_rows)
    return max_rows


class FrontDoor:
    """Runs protocol requests through a ``Service``: names are apps (pipelines) or models of
    its dispatcher; one query per row. ``max_rows``: the most rows one request may carry,
    on every protocol and transport (the native predict route's default).

    Without a declared ``Signature`` a name's outputs are the ones it answers: traced the
    first time a door describes it (metadata, config) by running ``samples[name]`` through
    it, or zeros of the app's ``InputSpec``; else learned from its first answer."""

    def __init__(
        self,
        service: Service,
        signatures: Mapping[str, Signature] | None = None,
        *,
        model_slo_s: float = 1.0,
        max_rows: int = DEFAULT_MAX_ROWS,
        samples: Mapping[str, Sequence[Any]] | None = None,
    ) -> None:
        check_max_rows(max_rows)
        self.service = service
        self.signatures = dict(signatures or {})
        self.model_slo_s = model_slo_s
        self.max_rows = max_rows
        self.samples = {k: list(v) for k, v in (samples or {}).items()}
        self.stats: dict[str, NameStats] = {}
        # outputs of undeclared names, traced or seen; names traced once (a failed trace is
        # not retried on every metadata request)
        self._outputs: dict[str, tuple[TensorInfo, ...]] = {}
        self._traced: set[str] = set()
        self._trace_lock = asyncio.Lock()

    def names(self) -> list[str]:
        d = self.service.dispatcher
        return sorted(set(self.service.apps) | set(d.models if d is not None else ()))

    def ready(self, name: str | None = None) -> bool:
        """The server (``name`` None) or one model/app can answer now: what the KServe and
        TF Serving readiness routes report. A model with no serving replica (its backend
        down, recovering) is not ready, so a readiness probe written for Triton stops
        sending traffic to this instance."""
        h = self.service.health()
        if name is None:
            return bool(h["status"] == "ok")
        if self.service.closing or name not in self.names():
            return False
        app = self.service.apps.get(name)
        models = app.models if app is not None and app.models else (name,)
        reps = h.get("replicas", {})
        return all(reps.get(m, 1) > 0 for m in models)  # not a backend model: in process

    def check(self, name: str) -> None:
        if name not in self.names():
            raise NotFoundError("model", name, self.names())

    def signature(self, name: str) -> Signature:
        """The declared signature, else what is known now: the app's ``InputSpec`` and the
        outputs traced or seen (``output`` before either; :meth:`describe` traces)."""
        self.check(name)
        if name in self.signatures:
            return self.signatures[name]
        outputs = self._outputs.get(name, (TensorInfo("output", "float32", (-1,)),))
        app = self.service.apps.get(name)
        if app is not None and app.input_spec is not None:
            shape = tuple(-1 if s is None else int(s) for s in (app.input_spec.shape or ()))
            return Signature((TensorInfo("input", app.input_spec.dtype, shape),), outputs)
        return Signature((TensorInfo("input", "float32", (-1,)),), outputs)

    async def describe(self, name: str) -> Signature:
        """The signature metadata and config routes declare: an undeclared name's outputs
        traced first (once), so they are the ones it really returns."""
        self.check(name)
        if name not in self.signatures and name not in self._outputs:
            async with self._trace_lock:
                if name not in self._outputs and name not in self._traced:
                    self._traced.add(name)
                    await self._trace(name)
        return self.signature(name)

    async def _trace(self, name: str) -> None:
        xs = self._trace_inputs(name)
        if not xs:
            return
        try:
            outs = await self._run(name, xs)
            found = per_query(outs, "output")
        except Exception as e:  # an app's own code may raise anything: declare it later
            log.warning("front door: tracing the outputs of %r failed: %s", name, e)
            return
        self._outputs[name] = tuple(TensorInfo(k, dt, sh) for k, (dt, sh) in found.items())

    def _trace_inputs(self, name: str) -> list[Any]:
        """``samples[name]``, else zeros of the app's ``InputSpec`` (sizes left free: 1 and 2,
        so the outputs' sizes that follow them are declared -1); [] for a dispatcher model."""
        if name in self.samples:
            return list(self.samples[name])
        app = self.service.apps.get(name)
        if app is None or app.input_spec is None:
            return []
        spec = app.input_spec
        if spec.shape is None:
            return [np.zeros(1, spec.dtype)]
        sizes = [1, 2] if None in spec.shape else [1]
        return [
            np.zeros(tuple(n if s is None else s for s in spec.shape), spec.dtype) for n in sizes
        ]

    def max_batch_size(self, name: str) -> int:
        """The rows one request to ``name`` may carry (> 0: every tensor has a batch
        dimension): the door's cap, or an app's ``max_batch_inputs`` when smaller."""
        app = self.service.apps.get(name)
        cap = app.max_batch_inputs if app is not None else self.max_rows
        return max(1, min(self.max_rows, int(cap)))

    async def model_config(self, name: str) -> dict[str, Any]:
        """Triton's model-configuration extension (``GET /v2/models/{m}/config``), with the
        fields load generators such as perf_analyzer read: ``max_batch_size`` > 0 and
        per-query ``dims`` (-1: any size)."""
        sig = await self.describe(name)

        def tensor(t: TensorInfo) -> dict[str, Any]:
            return {
                "name": t.name,
                "data_type": CONFIG_TYPE_OF.get(t.dtype, "TYPE_FP32"),
                "dims": [int(s) for s in t.shape] or [1],
            }

        return {
            "name": name,
            "platform": "inferline",
            "backend": "inferline",
            "max_batch_size": self.max_batch_size(name),
            "input": [tensor(t) for t in sig.inputs],
            "output": [tensor(t) for t in sig.outputs],
        }

    def model_stats(self, name: str | None = None) -> dict[str, Any]:
        """The KServe statistics extension (``GET /v2/models/{m}/stats``; every name when
        ``name`` is None). Success/fail counts and times are the door's own per-name counters
        (whole requests, as the door sees them); the queue/compute split of that time is not
        measured here and reads zero."""
        if name is not None:
            self.check(name)
        zero = {"count": 0, "ns": 0}
        out = []
        for n in [name] if name is not None else self.names():
            st = self.stats.get(n, NameStats())
            out.append(
                {
                    "name": n,
                    "version": "1",
                    "last_inference": st.last_inference_ms,
                    "inference_count": st.inference_count,
                    "execution_count": st.execution_count,
                    "inference_stats": {
                        "success": {"count": st.success_count, "ns": st.success_ns},
                        "fail": {"count": st.fail_count, "ns": st.fail_ns},
                        # every answered request passed the queue once (perf_analyzer finds
                        # the model's version by this count growing); its time is not split
                        "queue": {"count": st.success_count, "ns": 0},
                        "compute_input": dict(zero),
                        "compute_infer": dict(zero),
                        "compute_output": dict(zero),
                        "cache_hit": dict(zero),
                        "cache_miss": dict(zero),
                    },
                    "batch_stats": [],
                }
            )
        return {"model_stats": out}

    def check_datatypes(self, name: str, tensors: Mapping[str, np.ndarray]) -> None:
        """KServe requests declare each input's datatype: one that is not the declared
        signature's is refused, as Triton does, rather than converted (FP64 values for an
        FP32 input lost precision silently). TF Serving's JSON has no datatype to check."""
        self.check(name)
        sig = self.signatures.get(name)
        if sig is None:
            return
        for t in sig.inputs:
            a = tensors.get(t.name)
            if a is not None and a.size and dtype_name(a) != t.dtype:
                raise ValidationError(
                    f"inputs.{t.name}.datatype",
                    KSERVE_OF.get(t.dtype, t.dtype),
                    KSERVE_OF.get(dtype_name(a), dtype_name(a)),
                )

    def queries(self, name: str, tensors: Mapping[str, np.ndarray]) -> list[Any]:
        """Split named batched tensors into per-row queries."""
        sig = self.signature(name)
        want = [t.name for t in sig.inputs]
        if name not in self.signatures and len(tensors) == 1:
            want = list(tensors)  # no declared signature: take the one input by any name
        if set(tensors) != set(want):
            raise ValidationError("inputs", f"the tensors {want}", sorted(tensors))
        app = self.service.apps.get(name)
        if name not in self.signatures and app is not None and app.input_spec is not None:
            # to the app's dtype here, refusing what would change: astype wrapped INT64 1000
            # to an int8 -24
            dt = app.input_spec.dtype
            tensors = {k: cast_exact(a, dt, f"inputs.{k}") for k, a in tensors.items()}
        sizes = {int(a.shape[0]) if a.ndim else -1 for a in tensors.values()}
        if len(sizes) != 1 or -1 in sizes:
            raise ValidationError(
                "inputs", "tensors with one batch dimension of the same size", sorted(sizes)
            )
        (n,) = sizes
        if n == 0:
            raise ValidationError("inputs", "at least one row in the batch dimension", "0 rows")
        if n > self.max_rows:
            raise ValidationError(
                "inputs", f"at most {self.max_rows} rows in the batch dimension", f"{n} rows"
            )
        if len(want) == 1:
            return [tensors[want[0]][i] for i in range(n)]
        return [{k: tensors[k][i] for k in want} for i in range(n)]

    async def run(
        self, name: str, queries: Sequence[Any], limits: RequestLimits = DEFAULT_LIMITS
    ) -> list[Any]:
        """Outputs of ``queries``, in order; raises the first query's error. Counted in
        ``stats`` (what the statistics extension reports). ``limits``: the request's own
        deadline (the name's SLO is the default and the cap) and priority class."""
        self.check(name)
        t0 = time.perf_counter_ns()
        ok = False
        try:
            outs = await self._run(name, queries, limits)
            ok = True
            return outs
        finally:
            self.stats.setdefault(name, NameStats()).record(
                len(queries), time.perf_counter_ns() - t0, ok
            )

    async def _run(
        self, name: str, queries: Sequence[Any], limits: RequestLimits = DEFAULT_LIMITS
    ) -> list[Any]:
        svc = self.service
        if name in svc.apps:
            app = svc.apps[name]
            xs = [
                svc.check_input(app, q, f"inputs[{i}]") if app.input_spec is not None else q
                for i, q in enumerate(queries)
            ]
            slo = limits.budget(app.slo_s)
            preds = await asyncio.gather(
                *(svc.predict(name, x, slo, limits.priority) for x in xs),
                return_exceptions=True,
            )
            outs = [p if isinstance(p, BaseException) else p.output for p in preds]
        else:
            d = svc.dispatcher
            outs = await d.submit_many(
                name,
                list(queries),
                deadline=d.clock() + limits.budget(self.model_slo_s),
                priority=limits.priority,
            )
        for o in outs:
            if isinstance(o, BaseException):
                raise o
        return outs

    def stack(
        self, name: str, outs: Sequence[Any], wanted: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        """Per-query outputs as named batched tensors (``_outputs`` says the rule for None);
        an undeclared name's outputs are learned from its first answer."""
        sig = self.signature(name)
        declared = name in self.signatures
        names = [t.name for t in sig.outputs]
        cols = columns(outs, names[0] if declared and len(names) == 1 else "output")
        shapes = {t.name: tuple(t.shape) for t in sig.outputs} if declared else {}
        result = {}
        for k, vals in cols.items():
            if wanted and k not in wanted:
                continue
            arr = stack_column(k, vals, shapes.get(k))
            if arr is not None:
                result[k] = arr
        if not declared and name not in self._outputs and not wanted:
            # one answer shows names and dtypes, not which sizes vary: those read -1
            self._outputs[name] = tuple(
                TensorInfo(k, dtype_name(a), (-1,) * (a.ndim - 1)) for k, a in result.items()
            )
        missing = [w for w in wanted if w not in result]
        if missing:
            have = sorted(k for k, v in cols.items() if any(x is not None for x in v))
            raise ValidationError("outputs", f"names among {have}", missing)
        return result
