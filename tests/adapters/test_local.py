"""LocalBackend with real replica processes and real gRPC sockets."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest

from inferline.adapters.local import LocalBackend
from inferline.core import (
    Backend,
    BackendError,
    CapacityError,
    ModelConfig,
    ModelSpec,
    ReplicaError,
    ReplicaHandle,
    ValidationError,
)

EX = "inferline.adapters.local.examples"
pytestmark = pytest.mark.timeout(60)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # Still in the table: a zombie counts as gone (it runs nothing and is about to be reaped).
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def run(
    body: Callable[[LocalBackend, list[tuple[str, list[str]]]], Awaitable[Any]], **kw: Any
) -> Any:
    """Run ``body(backend, events)`` on a fresh backend that is always closed afterwards."""

    async def main() -> Any:
        kw.setdefault("oversubscribe", True)  # CI has 2 cores; tests need more replicas
        b = LocalBackend(**kw)
        events: list[tuple[str, list[str]]] = []
        b.subscribe(lambda m, reps: events.append((m, [r.id for r in reps])))
        try:
            return await body(b, events)
        finally:
            pids = b.pids()
            await b.close()
            for pid in pids:
                assert gone(pid), f"replica process {pid} survived close()"

    return asyncio.run(main())


async def wait_until(cond: Callable[[], bool], timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


def test_deploy_predict_scale_and_stats() -> None:
    async def body(b: LocalBackend, events: list[tuple[str, list[str]]]) -> None:
        assert isinstance(b, Backend)
        await b.deploy(ModelSpec("noop", f"{EX}:noop"), ModelConfig("cpu", 8, 2))
        reps = b.replicas("noop")
        assert len(reps) == 2 and all(isinstance(r, ReplicaHandle) and r.alive for r in reps)
        assert events[-1] == ("noop", [r.id for r in reps])
        inputs = [
            np.arange(6, dtype=np.float32).reshape(2, 3),
            "text",
            b"\x00raw",
            {"k": [1, None]},
        ]
        for r in reps:
            out = await r.predict_batch(inputs)
            assert len(out) == len(inputs)
            np.testing.assert_array_equal(out[0], inputs[0])
            assert out[0].dtype == np.float32
            assert out[1:] == inputs[1:]
        # Unencodable input fails alone, with a ValidationError naming its position.
        out = await reps[0].predict_batch([1, object(), 3])
        assert out[0] == 1 and out[2] == 3 and isinstance(out[1], ValidationError)
        assert out[1].field == "inputs[1]"
        # Scale up, then down; pids of the removed replicas must be gone.
        pids_before = set(b.pids())
        await b.scale("noop", 3)
        assert len(b.replicas("noop")) == 3 and len(events[-1][1]) == 3
        await b.scale("noop", 1)
        assert len(b.replicas("noop")) == 1 and len(events[-1][1]) == 1
        assert len(b.pids()) == 1
        for pid in pids_before - set(b.pids()):
            assert gone(pid)
        st = await b.stats("noop")
        assert st["active_replicas"] == 1 and st["target_replicas"] == 1
        d = st["activation_delay_s"]
        assert d["samples"] == 3 and 0 < d["mean"] <= d["max"] < 30
        everything = st["replicas"] + st["retired"]
        assert sum(x["batches"] for x in everything) == 3
        assert sum(x["items"] for x in everything) == 2 * len(inputs) + 2
        served = [x for x in everything if x["batches"]]
        assert all(x["service_p99_s"] >= x["service_p50_s"] > 0 for x in served)
        await b.remove("noop")
        assert b.pids() == [] and events[-1] == ("noop", [])

    run(body)


def test_scale_down_drains_the_in_flight_batch() -> None:
    async def body(b: LocalBackend, events: list[tuple[str, list[str]]]) -> None:
        await b.deploy(ModelSpec("slow", f"{EX}:sleep", {"base_s": 1.0}), ModelConfig("cpu", 4, 2))
        victim = max(b.replicas("slow"), key=lambda r: int(r.id.rsplit("-", 1)[1]))
        pid = victim.pid  # type: ignore[attr-defined]
        call = asyncio.create_task(victim.predict_batch(["a", "b"]))
        await asyncio.sleep(0.2)  # the batch is now inside the container
        t0 = time.monotonic()
        scale = asyncio.create_task(b.scale("slow", 1))
        await wait_until(lambda: len(b.replicas("slow")) == 1, 0.5, "the victim to leave")
        assert victim.id not in events[-1][1]  # subscribers saw it leave right away
        assert not call.done() and not gone(pid)  # ... while its batch still runs
        with pytest.raises(ReplicaError):  # a draining replica takes no new batches
            await victim.predict_batch(["late"])
        out = await call
        assert [o["x"] for o in out] == ["a", "b"] and out[0]["pid"] == pid
        await scale
        assert time.monotonic() - t0 >= 0.6  # scale() waited for the batch
        assert gone(pid)

    run(body)


def test_capacity_is_refused_with_what_is_free() -> None:
    async def body(b: LocalBackend, events: list[tuple[str, list[str]]]) -> None:
        core = b.inventory()["cpu"]
        assert core == 1 and b.free() == {"cpu": 1}
        with pytest.raises(CapacityError, match=r"free: cpu=1 \(cores \[\d+\]\)") as ei:
            await b.deploy(ModelSpec("m", f"{EX}:noop"), ModelConfig("cpu", 1, 2))
        assert ei.value.free == {"cpu": 1}
        with pytest.raises(CapacityError, match="2 cpu cores"):
            await b.deploy(ModelSpec("m", f"{EX}:noop", threads=2), ModelConfig("cpu", 1, 1))
        with pytest.raises(CapacityError, match="gpu-v100"):
            await b.deploy(ModelSpec("m", f"{EX}:noop"), ModelConfig("gpu-v100", 1, 1))
        with pytest.raises(CapacityError, match="not in this backend's inventory"):
            await b.deploy(ModelSpec("m", f"{EX}:noop"), ModelConfig("tpu", 1, 1))
        assert b.pids() == [] and b.models() == [] and b.free() == {"cpu": 1}
        await b.deploy(ModelSpec("m", f"{EX}:noop"), ModelConfig("cpu", 1, 1))
        assert b.free() == {"cpu": 0}
        with pytest.raises(CapacityError, match=r"free: cpu=0 \(cores \[\]\)"):
            await b.scale("m", 2)
        assert len(b.replicas("m")) == 1

    run(body, cores=[sorted(os.sched_getaffinity(0))[0]], gpus=[], oversubscribe=False)


def test_placement_pins_cores_threads_and_gpu() -> None:
    async def body(b: LocalBackend, events: list[tuple[str, list[str]]]) -> None:
        assert b.inventory() == {"cpu": len(os.sched_getaffinity(0)), "gpu-k80": 2}
        assert b.core_sharing() == {"pinned_cores": b.inventory()}  # what the estimate pins
        await b.deploy(ModelSpec("p", f"{EX}:probe", threads=1), ModelConfig("gpu-k80", 1, 2))
        infos = [(await r.predict_batch([0]))[0] for r in b.replicas("p")]
        assert sorted(i["cuda"] for i in infos) == ["0", "1"]  # one device each
        assert all(len(i["cores"]) == 1 and i["omp"] == "1" and i["mkl"] == "1" for i in infos)
        assert b.free()["gpu-k80"] == 0
        spec = ModelSpec("c", f"{EX}:probe", {"import_torch": True}, threads=2)
        await b.deploy(spec, ModelConfig("cpu", 1, 1))
        (info,) = await b.replicas("c")[0].predict_batch([0])
        assert info["cuda"] == ""  # CPU replicas see no GPU
        assert info["omp"] == "2" and info["torch_threads"] == 2
        assert len(info["cores"]) == min(2, len(os.sched_getaffinity(0)))

    # The GPU ids are only handed to CUDA_VISIBLE_DEVICES, so this runs without a GPU.
    run(body, gpus=["0", "1"], gpu_kind="gpu-k80")


def test_container_errors_surface_as_named_errors() -> None:
    async def body(b: LocalBackend, events: list[tuple[str, list[str]]]) -> None:
        await b.deploy(ModelSpec("f", f"{EX}:failing"), ModelConfig("cpu", 4, 1))
        (r,) = b.replicas("f")
        out = await r.predict_batch(["ok", "bad", 3])
        assert out[0] == "ok" and out[2] == 3
        assert isinstance(out[1], BackendError) and out[1].error_type == "ValueError"
        # the container raises for the whole batch: each input then runs alone, so only the
        # one that fails gets the error and the good one its output
        out = await r.predict_batch(["ok", "fail"])
        assert out[0] == "ok"
        assert isinstance(out[1], BackendError) and "asked to fail" in str(out[1])
        await b.deploy(ModelSpec("w", f"{EX}:wrong_count"), ModelConfig("cpu", 4, 1))
        with pytest.raises(BackendError, match=r"model 'w' returned 3 outputs.* 2 inputs"):
            await b.replicas("w")[0].predict_batch([1, 2])
        assert b.replicas("w")[0].alive  # a bad batch does not kill the replica
        free = b.free()
        with pytest.raises(BackendError, match="container refuses to load"):
            await b.deploy(
                ModelSpec("x", f"{EX}:crashing", {"at_load": True}), ModelConfig("cpu", 1, 2)
            )
        with pytest.raises(BackendError, match="ModuleNotFoundError"):
            await b.deploy(ModelSpec("y", "no_such_module:f"), ModelConfig("cpu", 1, 1))
        with pytest.raises(ValidationError, match="source"):
            await b.deploy(ModelSpec("z", "not-an-import-path"), ModelConfig("cpu", 1, 1))
        assert b.free() == free and sorted(b.models()) == ["f", "w"] and len(b.pids()) == 2
        # A batch over the message limit is the request's fault: BackendError, not ReplicaError.
        big = np.zeros(300_000, dtype=np.float32)  # 1.2 MB > the 1 MiB limit below
        with pytest.raises(BackendError, match="RESOURCE_EXHAUSTED") as ei:
            await r.predict_batch([big])
        assert not isinstance(ei.value, ReplicaError) and r.alive
        assert await r.predict_batch(["still", "serving"]) == ["still", "serving"]

    run(body, max_message_bytes=1 << 20)


def test_kill9_fails_in_flight_batch_promptly_then_restarts() -> None:
    async def body(b: LocalBackend, events: list[tuple[str, list[str]]]) -> None:
        await b.deploy(ModelSpec("s", f"{EX}:sleep", {"base_s": 5.0}), ModelConfig("cpu", 1, 2))
        first, other = b.replicas("s")
        pid = first.pid  # type: ignore[attr-defined]
        call = asyncio.create_task(first.predict_batch(["x"]))
        await asyncio.sleep(0.2)
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ReplicaError) as ei:
            await call
        assert time.monotonic() - t0 < 1.0, "the in-flight batch was not failed promptly"
        assert first.id in str(ei.value) and not first.alive
        # Subscribers saw it leave, then a new replica (new id) join.
        await wait_until(lambda: len(b.replicas("s")) == 2, 15, "the restarted replica")
        assert any(first.id not in ids and other.id in ids and len(ids) == 1 for _, ids in events)
        new = next(r for r in b.replicas("s") if r.id not in (first.id, other.id))
        assert events[-1][0] == "s" and sorted(events[-1][1]) == sorted([other.id, new.id])
        assert (await b.stats("s"))["restarts"] == 1
        assert gone(pid)

    run(body)


def test_heartbeat_detects_a_hung_replica() -> None:
    async def body(b: LocalBackend, events: list[tuple[str, list[str]]]) -> None:
        await b.deploy(ModelSpec("h", f"{EX}:noop"), ModelConfig("cpu", 1, 1))
        (r,) = b.replicas("h")
        pid = r.pid  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGSTOP)  # alive as a process, but answers nothing
        took = await wait_until(lambda: not r.alive, 5, "the hung replica to be declared dead")
        assert took >= 0.3  # it took missed heartbeats, not the process watch
        await wait_until(lambda: len(b.replicas("h")) == 1, 15, "the replacement")
        assert await b.replicas("h")[0].predict_batch([7]) == [7]
        assert gone(pid)
        # Hung in the middle of a batch: detected too (after the longer busy limit), and the
        # in-flight batch fails with ReplicaError instead of hanging.
        await b.deploy(ModelSpec("s", f"{EX}:sleep", {"base_s": 30.0}), ModelConfig("cpu", 1, 1))
        (r,) = b.replicas("s")
        call = asyncio.create_task(r.predict_batch([1]))
        await asyncio.sleep(0.1)
        os.kill(r.pid, signal.SIGSTOP)  # type: ignore[attr-defined]
        t0 = time.monotonic()
        # marked unresponsive (health stops counting it) from the idle limit on, before the
        # busy limit kills it
        await wait_until(lambda: r.unresponsive, 3, "the replica marked unresponsive")  # type: ignore[attr-defined]
        assert r.alive
        with pytest.raises(ReplicaError, match="missed 6 heartbeats"):
            await call
        assert time.monotonic() - t0 >= 0.6

    run(
        body,
        heartbeat_interval_s=0.1,
        heartbeat_timeout_s=0.2,
        heartbeat_misses=3,
        busy_heartbeat_misses=6,
    )


def test_a_batch_whose_rpc_is_cancelled_under_it_fails_with_replica_error() -> None:
    # The exit watcher closes a dead replica's channel, which cancels its RPCs: when the
    # waiting batch resumes only after both happened (a loaded machine), it must still see a
    # ReplicaError (the queue retries those), not a CancelledError that kills the caller.
    async def body(b: LocalBackend, events: list[tuple[str, list[str]]]) -> None:
        await b.deploy(ModelSpec("s", f"{EX}:sleep", {"base_s": 30.0}), ModelConfig("cpu", 1, 1))
        (r,) = b.replicas("s")
        call = asyncio.create_task(r.predict_batch([1]))
        await asyncio.sleep(0.2)
        await r.channel.close()  # type: ignore[attr-defined]
        with pytest.raises(ReplicaError, match="cancelled"):
            await call

    run(body)


def test_closed_backend_fails_calls_and_close_is_idempotent() -> None:
    async def main() -> None:
        b = LocalBackend(oversubscribe=True)
        await b.deploy(ModelSpec("s", f"{EX}:sleep", {"base_s": 5.0}), ModelConfig("cpu", 1, 1))
        (r,) = b.replicas("s")
        pids = b.pids()
        call = asyncio.create_task(r.predict_batch([1]))
        await asyncio.sleep(0.2)
        await b.close()
        await b.close()
        with pytest.raises(ReplicaError):
            await call
        with pytest.raises(BackendError, match="closed"):
            await b.deploy(ModelSpec("t", f"{EX}:noop"), ModelConfig("cpu", 1, 1))
        assert pids and all(gone(p) for p in pids)

    asyncio.run(main())


PARENT = """
import asyncio, sys
from inferline.adapters.local import LocalBackend
from inferline.core import ModelConfig, ModelSpec

async def main():
    b = LocalBackend(oversubscribe=True)
    await b.deploy(ModelSpec("n", "inferline.adapters.local.examples:noop"), ModelConfig("cpu", 1, 2))
    print(" ".join(map(str, b.pids())), flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_replicas_exit_when_the_parent_is_killed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and not any(gone(p) for p in pids)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not all(gone(p) for p in pids):
            time.sleep(0.05)
        assert all(gone(p) for p in pids), "orphaned replicas outlived their parent"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_serves_a_model_trained_in_the_test(tmp_path: Path) -> None:
    from sklearn.datasets import load_digits
    from sklearn.linear_model import RidgeClassifier  # closed form: trains in ~0.1 s

    x, y = load_digits(return_X_y=True)
    clf = RidgeClassifier().fit(x[:1200], y[:1200])
    assert clf.score(x[1200:], y[1200:]) > 0.8
    np.save(tmp_path / "w.npy", clf.coef_.T)
    np.save(tmp_path / "b.npy", clf.intercept_)
    params = {"weights": str(tmp_path / "w.npy"), "bias": str(tmp_path / "b.npy")}

    async def body(b: LocalBackend, events: list[tuple[str, list[str]]]) -> None:
        await b.deploy(ModelSpec("digits", f"{EX}:linear", params), ModelConfig("cpu", 32, 1))
        (r,) = b.replicas("digits")
        test = x[1200:1264]
        out = await r.predict_batch(list(test))
        assert out == clf.predict(test).tolist()
        scored = await b.replicas("digits")[0].predict_batch([test[0].astype(np.float32)])
        assert scored[0] == int(clf.predict(test[:1])[0])

    run(body)


def test_oversubscription_is_bounded_per_core() -> None:
    """Sharing cores is allowed, but not without end: a plan asking for thousands of
    replicas (PUT /admin/plan) is refused before a single process starts."""
    from inferline.adapters.local._inventory import MAX_USERS_PER_CORE, Inventory

    inv = Inventory([0, 1], [], "gpu", oversubscribe=True)
    inv.allocate("m", "cpu", 1, 2 * MAX_USERS_PER_CORE)
    with pytest.raises(CapacityError, match=f"more than {MAX_USERS_PER_CORE} replica threads"):
        inv.allocate("m", "cpu", 1, 1)
    assert sum(inv._core_users.values()) == 2 * MAX_USERS_PER_CORE  # nothing half-taken


def test_scale_tries_again_a_replica_given_up_on(tmp_path: Path) -> None:
    """A replica that keeps failing to start is given up on (its slot stays, counted); a
    later scale() to the same count starts it again instead of doing nothing."""
    w, bias = tmp_path / "w.npy", tmp_path / "b.npy"
    np.save(w, np.eye(3, dtype=np.float32))
    np.save(bias, np.zeros(3, dtype=np.float32))

    async def body(b: LocalBackend, events: list[tuple[str, list[str]]]) -> None:
        spec = ModelSpec("lin", f"{EX}:linear", {"weights": str(w), "bias": str(bias)})
        await b.deploy(spec, ModelConfig("cpu", 1, 1))
        (first,) = b.replicas("lin")
        w.rename(tmp_path / "moved.npy")  # every restart now fails to load
        os.kill(first.pid, signal.SIGKILL)  # type: ignore[attr-defined]
        await wait_until(lambda: b._models["lin"].slots[0].given_up, 20, "giving up on the replica")
        assert b.replicas("lin") == []
        (tmp_path / "moved.npy").rename(w)
        await b.scale("lin", 1)
        await wait_until(lambda: len(b.replicas("lin")) == 1, 20, "the replica after scale()")
        assert await b.replicas("lin")[0].predict_batch([[0.0, 2.0, 1.0]]) == [1]

    run(body, max_start_failures=2)


def test_a_replica_port_answers_only_its_backend() -> None:
    """Replica ports are on 127.0.0.1, where any local user could call the model and skip
    the frontend's token and queue: without the backend's secret a call is UNAUTHENTICATED.
    The secret is not on the command line (ps shows that to everyone)."""
    from inferline.adapters.local import replica_pb2 as pb
    from inferline.adapters.local import replica_pb2_grpc as pbg

    async def body(b: LocalBackend, events: list[tuple[str, list[str]]]) -> None:
        await b.deploy(ModelSpec("n", f"{EX}:noop"), ModelConfig("cpu", 1, 1))
        (r,) = b.replicas("n")
        assert await r.predict_batch([5]) == [5]  # the backend's own calls carry it
        cmdline = Path(f"/proc/{r.pid}/cmdline").read_bytes()  # type: ignore[attr-defined]
        assert b._replica_token.encode() not in cmdline
        async with grpc.aio.insecure_channel(f"127.0.0.1:{r.port}") as ch:  # type: ignore[attr-defined]
            stub = pbg.ReplicaStub(ch)
            for meta in ((), (("authorization", "Bearer guess"),)):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Ping(pb.PingRequest(), metadata=meta, timeout=5)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.PredictBatch(pb.PredictRequest(), metadata=meta, timeout=5)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED

    run(body)
