"""The FAKE fleet member the fleet's unit tests share (``test_fleet*.py``): a server of
``cores`` CPU cores ``delay_s`` away, with no real server behind it, so that the fleet's
placement, cover and hop bookkeeping can be checked on exact counts and delays and on
failures a real server cannot be made to produce on cue. And the model metadata the
contract checks read: Triton's ``TritonModelInfo`` and TF Serving's, as plain data."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import SimpleNamespace as NS
from typing import Any

from inferline.core import CapacityError, InferlineError, ModelConfig, ModelSpec

__all__ = ["FakeMember", "tf_digits_metadata", "triton_info"]


class _FakeClient:
    """A FAKE server client: ``ready()`` answers after ``delay_s`` (a server that far)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def ready(self) -> bool:
        await asyncio.sleep(self.delay_s)
        return True


class _FakeHandle:
    def __init__(self, model: str, rid: str) -> None:
        self.model, self.id, self.hardware, self.alive = model, rid, "cpu", True

    async def predict_batch(self, inputs: Any) -> list[Any]:
        return list(inputs)


class FakeMember:
    """A FAKE member backend. ``held``: its replicas per model; ``calls``: the fleet's
    deploy/scale/remove calls in order; ``fail``: the calls that raise (a member refusing);
    ``lose()``/``back()``: its server goes away (its replicas with it) and comes back (its
    replicas reloaded)."""

    def __init__(self, url: str, cores: int = 4, delay_s: float = 0.0) -> None:
        self.url, self.cores = url, cores
        self.client = _FakeClient(delay_s)
        self.held: dict[str, int] = {}
        self.away = False
        self.fail: set[str] = set()
        self.calls: list[tuple[str, str, int]] = []
        self.subs: list[Any] = []

    def inventory(self) -> dict[str, int]:
        return {"cpu": self.cores}

    def free(self) -> dict[str, int]:
        return {"cpu": max(0, self.cores - sum(self.held.values()))}

    def subscribe(self, cb: Any) -> None:
        self.subs.append(cb)

    def _set(self, model: str, n: int) -> None:
        if n - self.held.get(model, 0) > self.free()["cpu"]:
            raise CapacityError(f"{self.url}: no room for {n} of {model!r}", self.free())
        self.held[model] = n
        for cb in self.subs:
            cb(model, self.replicas(model))

    def replicas(self, model: str) -> list[Any]:
        if model not in self.held:
            raise InferlineError(f"{model!r} not here")
        if self.away:
            return []
        return [_FakeHandle(model, f"{model}-{k}") for k in range(self.held[model])]

    async def deploy(self, spec: ModelSpec, config: ModelConfig) -> None:
        self.calls.append(("deploy", spec.name, config.replicas))
        if "deploy" in self.fail:
            raise InferlineError(f"{self.url} refused")
        self._set(spec.name, config.replicas)

    async def scale(self, model: str, n: int) -> None:
        self.calls.append(("scale", model, n))
        self._set(model, n)

    async def remove(self, model: str) -> None:
        self.calls.append(("remove", model, 0))
        self.held.pop(model, None)

    async def stats(self, model: str) -> dict[str, Any]:
        return {"held": self.held.get(model)}

    async def close(self) -> None:
        pass

    def lose(self) -> None:
        self.away = True
        for m in self.held:
            for cb in self.subs:
                cb(m, [])

    def back(self) -> None:
        self.away = False
        for m, n in list(self.held.items()):
            self._set(m, n)


def triton_info(
    inputs: Mapping[str, list[int]],
    outputs: Mapping[str, list[int]],
    dtypes: Mapping[str, str] | None = None,
) -> NS:
    """Stands in for Triton's ``TritonModelInfo`` (only ``io`` is read): each tensor's name,
    dims and datatype (``dtypes[name]``; None where not given: a type not reported)."""
    dt = dtypes or {}
    ts = lambda d: [NS(name=n, dims=dims, datatype=dt.get(n)) for n, dims in d.items()]  # noqa: E731
    return NS(io=NS(inputs=ts(inputs), outputs=ts(outputs)))


def tf_digits_metadata(output_dtype: str = "DT_FLOAT") -> dict[str, Any]:
    """TF Serving's model metadata for a digits classifier: ``x`` float [-1, 64] in,
    ``probabilities`` [-1, 10] of ``output_dtype`` out, served by one available version."""
    return {
        "servers": {"h2": [{"state": "AVAILABLE"}]},
        "signatures": {
            "serving_default": {
                "inputs": {"x": {"dtype": "DT_FLOAT", "shape": [-1, 64]}},
                "outputs": {"probabilities": {"dtype": output_dtype, "shape": [-1, 10]}},
            }
        },
    }
