"""The backend conformance suite: what every registered backend must do.

Use it from any test (adapter authors too)::

    import sys; sys.path.insert(0, "<repo>/tests/adapters")
    from conformance import run_conformance

    report = asyncio.run(run_conformance(make_backend, spec, inputs, bad_input=...))

``make_backend()`` returns a fresh, unconnected backend (a ``Backend``); ``spec`` is a
``ModelSpec`` it can deploy on ``hardware``; ``inputs`` are at least three valid queries;
``bad_input`` (optional) is a query the model must refuse. The suite checks, in order:

1. the object satisfies ``inferline.core.Backend`` and offers ``hardware`` in ``inventory()``;
2. ``deploy`` makes exactly one active replica (a ``ReplicaHandle`` of that model, alive) and
   tells subscribers; deploying the same name again is a ``ValidationError``;
3. ``predict_batch`` returns exactly one output per input for batches of 1 and 3, leaves its
   inputs untouched, and a bad input comes back as an ``InferlineError`` (in its slot or
   raised), never as another exception type, while the good inputs of the batch still get
   outputs when the backend answers per item;
4. ``scale`` up to ``replicas`` and back to 1 changes the active set and tells subscribers;
5. unknown models raise ``NotFoundError``, a negative replica count ``ValidationError``;
6. ``stats`` returns a mapping; ``remove`` empties the set (subscribers see ``[]``);
7. ``close`` is idempotent, and a closed backend refuses work with an ``InferlineError``.

It returns the list of checks that ran; any failure raises ``AssertionError`` naming it.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from inferline.core import (
    Backend,
    InferlineError,
    ModelConfig,
    ModelSpec,
    NotFoundError,
    ReplicaHandle,
    ValidationError,
)

__all__ = ["run_conformance"]

_NO_INPUT = object()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b)
        )
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


async def _wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def run_conformance(
    make_backend: Callable[[], Backend | Awaitable[Backend]],
    spec: ModelSpec,
    inputs: Sequence[Any],
    *,
    bad_input: Any = _NO_INPUT,
    hardware: str = "cpu",
    replicas: int = 2,
    check_output: Callable[[Any, Any], None] | None = None,
) -> list[str]:
    """Run the suite on a fresh backend from ``make_backend``; returns the checks run."""
    assert len(inputs) >= 3, "give at least three valid inputs"
    done: list[str] = []
    b = make_backend()
    if asyncio.iscoroutine(b) or isinstance(b, Awaitable):
        b = await b  # type: ignore[misc]
    events: list[tuple[str, int]] = []
    try:
        assert isinstance(b, Backend), f"{type(b).__name__} does not satisfy inferline.core.Backend"
        assert isinstance(b.url, str) and "://" in b.url, f"url {b.url!r}"
        inv = b.inventory()
        assert inv.get(hardware, 0) >= 1, f"inventory {inv!r} lacks {hardware!r}"
        assert isinstance(b.free(), Mapping)
        done.append("protocol")

        b.subscribe(lambda model, handles: events.append((model, len(handles))))
        name = spec.name
        await b.deploy(spec, ModelConfig(hardware, 4, 1))
        hs = b.replicas(name)
        assert len(hs) == 1, f"deploy with 1 replica made {len(hs)}"
        h = hs[0]
        assert isinstance(h, ReplicaHandle), f"{type(h).__name__} is not a ReplicaHandle"
        assert h.model == name and h.alive and isinstance(h.id, str) and h.hardware == hardware
        assert (name, 1) in events, f"subscribers were not told about the deployment: {events}"
        try:
            await b.deploy(spec, ModelConfig(hardware, 4, 1))
        except ValidationError:
            pass
        else:
            raise AssertionError("deploying a deployed model again must raise ValidationError")
        done.append("deploy")

        for k in (1, 3):
            batch = list(inputs[:k])
            before = copy.deepcopy(batch)
            out = await h.predict_batch(batch)
            assert isinstance(out, list) and len(out) == k, f"{k} inputs gave {len(out)} outputs"
            for x, y in zip(batch, out, strict=True):
                assert not isinstance(y, BaseException), f"valid input {x!r} failed: {y!r}"
                if check_output is not None:
                    check_output(x, y)
            assert _same(batch, before), "predict_batch changed its inputs"
        done.append("predict_batch")

        if bad_input is not _NO_INPUT:
            batch = [inputs[0], bad_input, inputs[1]]
            try:
                out = await h.predict_batch(batch)
            except InferlineError:
                pass  # the whole batch refused with a named error: allowed
            except Exception as e:
                raise AssertionError(
                    f"a bad input raised {type(e).__name__}, not an InferlineError: {e}"
                ) from e
            else:
                assert len(out) == 3, f"3 inputs gave {len(out)} outputs"
                assert isinstance(out[1], InferlineError), f"bad input answered {out[1]!r}"
                # per-item answers: the good inputs of the batch still get outputs
                for i in (0, 2):
                    assert not isinstance(out[i], BaseException), (
                        f"a bad input in the batch failed the good input {i}: {out[i]!r}"
                    )
                    if check_output is not None:
                        check_output(batch[i], out[i])
            done.append("errors")

        await b.scale(name, replicas)
        await _wait_for(lambda: len(b.replicas(name)) == replicas, f"{replicas} replicas")
        assert (name, replicas) in events, f"subscribers missed the scale-up: {events}"
        outs = await asyncio.gather(*(r.predict_batch(list(inputs[:2])) for r in b.replicas(name)))
        assert all(len(o) == 2 for o in outs)
        told = len(events)  # what subscribers heard before: the deploy's (name, 1) is there
        await b.scale(name, 1)
        await _wait_for(lambda: len(b.replicas(name)) == 1, "1 replica after scale-down")
        await _wait_for(
            lambda: (name, 1) in events[told:], "subscribers told of the scale-down", timeout_s=5.0
        )
        assert events[-1] == (name, 1), f"scale-down not told last: {events[told:]}"
        assert len(await b.replicas(name)[0].predict_batch(list(inputs[:2]))) == 2
        done.append("scale")

        for call in (lambda: b.replicas("no-such-model"), lambda: b.scale("no-such-model", 1)):
            try:
                r = call()
                if asyncio.iscoroutine(r):
                    await r
            except NotFoundError:
                pass
            else:
                raise AssertionError("an unknown model must raise NotFoundError")
        try:
            await b.scale(name, -1)
        except ValidationError:
            pass
        else:
            raise AssertionError("scale(model, -1) must raise ValidationError")
        done.append("named errors")

        st = await b.stats(name)
        assert isinstance(st, Mapping), f"stats returned {type(st).__name__}"
        await b.remove(name)
        try:
            left = b.replicas(name)
        except NotFoundError:
            left = []
        assert left == [], f"replicas left after remove: {left}"
        assert events[-1] == (name, 0), f"subscribers were not told about the removal: {events}"
        done.append("stats and remove")
    finally:
        await b.close()
    await b.close()  # idempotent
    try:
        await b.deploy(spec, ModelConfig(hardware, 1, 1))
    except InferlineError:
        pass
    else:
        raise AssertionError("a closed backend must refuse deploy with an InferlineError")
    done.append("close")
    return done
