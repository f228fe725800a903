"""What a protocol front door runs requests through: a served name's tensors (``Signature``) and ``FrontDoor``, which turns a batched request into one query per row of inferline's queue and stacks the answers back."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from inferline.core import NotFoundError, ValidationError
from inferline.server._service import Service

T = TypeVar("T")

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
    and the batch dimension holds at most ``max_rows`` rows. Returns the element count (a
    Python int: a huge shape cannot wrap around as an int64 product would)."""
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ValidationError(field, "a list of sizes (integers >= 0)", list(shape))
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
    on every protocol and transport (the native predict route's default)."""

    def __init__(
        self,
        service: Service,
        signatures: Mapping[str, Signature] | None = None,
        *,
        model_slo_s: float = 1.0,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> None:
        check_max_rows(max_rows)
        self.service = service
        self.signatures = dict(signatures or {})
        self.model_slo_s = model_slo_s
        self.max_rows = max_rows
        self.stats: dict[str, NameStats] = {}

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
        self.check(name)
        if name in self.signatures:
            return self.signatures[name]
        app = self.service.apps.get(name)
        if app is not None and app.input_spec is not None:
            shape = tuple(-1 if s is None else int(s) for s in (app.input_spec.shape or ()))
            return Signature(
                (TensorInfo("input", app.input_spec.dtype, shape),),
                (TensorInfo("output", "float32", (-1,)),),
            )
        return Signature(
            (TensorInfo("input", "float32", (-1,)),), (TensorInfo("output", "float32", (-1,)),)
        )

    def max_batch_size(self, name: str) -> int:
        """The rows one request to ``name`` may carry (> 0: every tensor has a batch
        dimension): the door's cap, or an app's ``max_batch_inputs`` when smaller."""
        app = self.service.apps.get(name)
        cap = app.max_batch_inputs if app is not None else self.max_rows
        return max(1, min(self.max_rows, int(cap)))

    def model_config(self, name: str) -> dict[str, Any]:
        """Triton's model-configuration extension (``GET /v2/models/{m}/config``), with the
        fields load generators such as perf_analyzer read: ``max_batch_size`` > 0 and
        per-query ``dims`` (-1: any size)."""
        sig = self.signature(name)

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
        sizes = {int(a.shape[0]) if a.ndim else -1 for a in tensors.values()}
        if len(sizes) != 1 or -1 in sizes:
            raise ValidationError(
                "inputs", "tensors with one batch dimension of the same size", sorted(sizes)
            )
        (n,) = sizes
        if n > self.max_rows:
            raise ValidationError(
                "inputs", f"at most {self.max_rows} rows in the batch dimension", f"{n} rows"
            )
        if len(want) == 1:
            return [tensors[want[0]][i] for i in range(n)]
        return [{k: tensors[k][i] for k in want} for i in range(n)]

    async def run(self, name: str, queries: Sequence[Any]) -> list[Any]:
        """Outputs of ``queries``, in order; raises the first query's error. Counted in
        ``stats`` (what the statistics extension reports)."""
        self.check(name)
        t0 = time.perf_counter_ns()
        ok = False
        try:
            outs = await self._run(name, queries)
            ok = True
            return outs
        finally:
            self.stats.setdefault(name, NameStats()).record(
                len(queries), time.perf_counter_ns() - t0, ok
            )

    async def _run(self, name: str, queries: Sequence[Any]) -> list[Any]:
        svc = self.service
        if name in svc.apps:
            app = svc.apps[name]
            xs = [
                svc.check_input(app, q, f"inputs[{i}]") if app.input_spec is not None else q
                for i, q in enumerate(queries)
            ]
            preds = await asyncio.gather(
                *(svc.predict(name, x) for x in xs), return_exceptions=True
            )
            outs = [p if isinstance(p, BaseException) else p.output for p in preds]
        else:
            d = svc.dispatcher
            outs = await d.submit_many(name, list(queries), deadline=d.clock() + self.model_slo_s)
        for o in outs:
            if isinstance(o, BaseException):
                raise o
        return outs

    def stack(
        self, name: str, outs: Sequence[Any], wanted: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        """Per-query outputs as named batched tensors."""
        sig = self.signature(name)
        names = [t.name for t in sig.outputs] or ["output"]
        declared = {t.name: tuple(t.shape) for t in sig.outputs} if name in self.signatures else {}
        first = outs[0] if outs else None
        if isinstance(first, Mapping):
            cols = {str(k): [o[k] for o in outs] for k in first}
        else:
            cols = {names[0] if len(names) == 1 else "output": list(outs)}
        result = {}
        for k, vals in cols.items():
            if wanted and k not in wanted:
                continue
            try:
                result[k] = arr = np.stack([np.asarray(v) for v in vals])
            except ValueError as e:
                raise ValidationError(
                    f"outputs.{k}", "outputs of one shape across the batch", str(e)
                ) from None
            # the declared shape: a model's [1] output reaches pipelines as a scalar (a
            # label), but a client of the model's route expects the model's [n, 1]
            want = declared.get(k)
            if (
                want is not None
                and all(d >= 0 for d in want)
                and arr.shape[1:] != want
                and math.prod(arr.shape[1:]) == math.prod(want)
            ):
                result[k] = arr.reshape((arr.shape[0], *want))
        missing = [w for w in wanted if w not in result]
        if missing:
            raise ValidationError("outputs", f"names among {sorted(cols)}", missing)
        return result
