"""The backend conformance checks: what every registered backend must do.

Shipped with the package (as River ships ``river.checks``) so that an adapter's author runs the
same checks as the built-in adapters, from any test runner; nothing here imports pytest::

    import asyncio
    from inferline.adapters.checks import run_conformance

    done = asyncio.run(run_conformance(make_backend, spec, inputs, bad_input=...))

``make_backend()`` returns a fresh, unconnected backend (a ``Backend``, or an awaitable of one);
``spec`` is a ``ModelSpec`` it can deploy on ``hardware``; ``inputs`` are at least three valid
queries; ``bad_input`` (optional) is a query the model must refuse; ``check_output(x, y)``
(optional) raises when ``y`` is not the right answer to ``x``. The checks, in order (their
names are :data:`CHECKS`):

1. ``protocol``: the object satisfies ``inferline.core.Backend``, has a ``scheme://`` url and
   offers ``hardware`` in ``inventory()``;
2. ``deploy``: ``deploy`` makes exactly one active replica (a ``ReplicaHandle`` of that model,
   alive) and tells subscribers; deploying the same name again is a ``ValidationError``;
3. ``predict_batch``: exactly one output per input for batches of 1 and 3, inputs untouched;
4. ``errors`` (only with ``bad_input``): a bad input comes back as an ``InferlineError`` (in its
   slot or raised), never as another exception type, while the good inputs of the batch still
   get outputs when the backend answers per item;
5. ``scale``: ``scale`` up to ``replicas`` and back to 1 changes the active set and tells
   subscribers of both;
6. ``named errors``: unknown models raise ``NotFoundError``, a negative replica count
   ``ValidationError``;
7. ``stats and remove``: ``stats`` returns a mapping; ``remove`` empties the set (subscribers
   see ``[]``);
8. ``close``: ``close`` is idempotent, and a closed backend refuses work with an
   ``InferlineError``.

It returns the names of the checks that ran. A backend that fails one raises
``AssertionError`` with a message naming what it did (raised explicitly, so the checks hold
under ``python -O`` too); wrong arguments to ``run_conformance`` raise ``ValidationError``.
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

__all__ = ["CHECKS", "run_conformance"]

CHECKS: tuple[str, ...] = (
    "protocol",
    "deploy",
    "predict_batch",
    "errors",
    "scale",
    "named errors",
    "stats and remove",
    "close",
)
"""The names of the checks, in the order they run (``errors`` only with a ``bad_input``)."""

_NO_INPUT = object()

OutputCheck = Callable[[Any, Any], None]


def _require(cond: object, message: str) -> None:
    """``assert`` that survives ``python -O``."""
    if not cond:
        raise AssertionError(message)


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


async def _expect(call: Callable[[], Any], error: type[Exception], message: str) -> None:
    """Call (and await, if it returns a coroutine); it must raise ``error``."""
    try:
        r = call()
        if asyncio.iscoroutine(r):
            await r
    except error:
        return
    raise AssertionError(message)


def _check_protocol(b: Any, hardware: str) -> None:
    _require(isinstance(b, Backend), f"{type(b).__name__} does not satisfy inferline.core.Backend")
    _require(isinstance(b.url, str) and "://" in b.url, f"url {b.url!r} is not scheme://...")
    inv = b.inventory()
    _require(inv.get(hardware, 0) >= 1, f"inventory {inv!r} lacks {hardware!r}")
    _require(isinstance(b.free(), Mapping), f"free() returned {type(b.free()).__name__}")


async def _check_deploy(
    b: Backend, spec: ModelSpec, hardware: str, events: list[tuple[str, int]]
) -> ReplicaHandle:
    name = spec.name
    await b.deploy(spec, ModelConfig(hardware, 4, 1))
    hs = b.replicas(name)
    _require(len(hs) == 1, f"deploy with 1 replica made {len(hs)}")
    h = hs[0]
    _require(isinstance(h, ReplicaHandle), f"{type(h).__name__} is not a ReplicaHandle")
    _require(
        h.model == name and h.alive and isinstance(h.id, str) and h.hardware == hardware,
        f"the replica {h!r} is not an alive {name!r} replica on {hardware!r} with a str id",
    )
    _require((name, 1) in events, f"subscribers were not told about the deployment: {events}")
    await _expect(
        lambda: b.deploy(spec, ModelConfig(hardware, 4, 1)),
        ValidationError,
        "deploying a deployed model again must raise ValidationError",
    )
    return h


async def _check_predict(
    h: ReplicaHandle, inputs: Sequence[Any], check_output: OutputCheck | None
) -> None:
    for k in (1, 3):
        batch = list(inputs[:k])
        before = copy.deepcopy(batch)
        out = await h.predict_batch(batch)
        _require(
            isinstance(out, list) and len(out) == k, f"{k} inputs gave {len(out)} outputs: {out!r}"
        )
        for x, y in zip(batch, out, strict=True):
            _require(not isinstance(y, BaseException), f"valid input {x!r} failed: {y!r}")
            if check_output is not None:
                check_output(x, y)
        _require(_same(batch, before), "predict_batch changed its inputs")


async def _check_errors(
    h: ReplicaHandle, inputs: Sequence[Any], bad_input: Any, check_output: OutputCheck | None
) -> None:
    batch = [inputs[0], bad_input, inputs[1]]
    try:
        out = await h.predict_batch(batch)
    except InferlineError:
        return  # the whole batch refused with a named error: allowed
    except Exception as e:
        raise AssertionError(
            f"a bad input raised {type(e).__name__}, not an InferlineError: {e}"
        ) from e
    _require(len(out) == 3, f"3 inputs gave {len(out)} outputs")
    _require(isinstance(out[1], InferlineError), f"bad input answered {out[1]!r}")
    # per-item answers: the good inputs of the batch still get outputs
    for i in (0, 2):
        _require(
            not isinstance(out[i], BaseException),
            f"a bad input in the batch failed the good input {i}: {out[i]!r}",
        )
        if check_output is not None:
            check_output(batch[i], out[i])


async def _check_scale(
    b: Backend, name: str, inputs: Sequence[Any], replicas: int, events: list[tuple[str, int]]
) -> None:
    await b.scale(name, replicas)
    await _wait_for(lambda: len(b.replicas(name)) == replicas, f"{replicas} replicas")
    _require((name, replicas) in events, f"subscribers missed the scale-up: {events}")
    outs = await asyncio.gather(*(r.predict_batch(list(inputs[:2])) for r in b.replicas(name)))
    _require(all(len(o) == 2 for o in outs), f"2 inputs per replica gave {outs!r}")
    told = len(events)  # what subscribers heard before: the deploy's (name, 1) is there
    await b.scale(name, 1)
    await _wait_for(lambda: len(b.replicas(name)) == 1, "1 replica after scale-down")
    await _wait_for(
        lambda: (name, 1) in events[told:], "subscribers told of the scale-down", timeout_s=5.0
    )
    _require(events[-1] == (name, 1), f"scale-down not told last: {events[told:]}")
    out = await b.replicas(name)[0].predict_batch(list(inputs[:2]))
    _require(len(out) == 2, f"2 inputs gave {len(out)} outputs after the scale-down")


async def _check_named_errors(b: Backend, name: str) -> None:
    for call in (lambda: b.replicas("no-such-model"), lambda: b.scale("no-such-model", 1)):
        await _expect(call, NotFoundError, "an unknown model must raise NotFoundError")
    await _expect(
        lambda: b.scale(name, -1), ValidationError, "scale(model, -1) must raise ValidationError"
    )


async def _check_stats_and_remove(b: Backend, name: str, events: list[tuple[str, int]]) -> None:
    st = await b.stats(name)
    _require(isinstance(st, Mapping), f"stats returned {type(st).__name__}")
    await b.remove(name)
    try:
        left = b.replicas(name)
    except NotFoundError:
        left = []
    _require(left == [], f"replicas left after remove: {left}")
    _require(events[-1] == (name, 0), f"subscribers were not told about the removal: {events}")


async def _check_closed(b: Backend, spec: ModelSpec, hardware: str) -> None:
    await b.close()  # idempotent
    await _expect(
        lambda: b.deploy(spec, ModelConfig(hardware, 1, 1)),
        InferlineError,
        "a closed backend must refuse deploy with an InferlineError",
    )


async def run_conformance(
    make_backend: Callable[[], Backend | Awaitable[Backend]],
    spec: ModelSpec,
    inputs: Sequence[Any],
    *,
    bad_input: Any = _NO_INPUT,
    hardware: str = "cpu",
    replicas: int = 2,
    check_output: OutputCheck | None = None,
) -> list[str]:
    """Run the checks on a fresh backend from ``make_backend``; returns the names of those run.

    Raises ``AssertionError`` naming the first check the backend fails (the backend is closed
    either way) and ``ValidationError`` for fewer than three inputs or ``replicas < 2``.
    """
    if len(inputs) < 3:
        raise ValidationError("inputs", "at least three valid inputs", inputs)
    if replicas < 2:
        raise ValidationError("replicas", "an int >= 2 (the checks scale up to it)", replicas)
    done: list[str] = []
    b = make_backend()
    if isinstance(b, Awaitable):
        b = await b
    events: list[tuple[str, int]] = []
    try:
        _check_protocol(b, hardware)
        done.append("protocol")
        b.subscribe(lambda model, handles: events.append((model, len(handles))))
        h = await _check_deploy(b, spec, hardware, events)
        done.append("deploy")
        await _check_predict(h, inputs, check_output)
        done.append("predict_batch")
        if bad_input is not _NO_INPUT:
            await _check_errors(h, inputs, bad_input, check_output)
            done.append("errors")
        await _check_scale(b, spec.name, inputs, replicas, events)
        done.append("scale")
        await _check_named_errors(b, spec.name)
        done.append("named errors")
        await _check_stats_and_remove(b, spec.name, events)
        done.append("stats and remove")
    finally:
        await b.close()
    await _check_closed(b, spec, hardware)
    done.append("close")
    return done
