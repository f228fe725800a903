"""Backend calls without wrapper overhead (issue 44 item 2) and the deadline they carry (issue
45 item 4), in pure pieces: the queue sets ``core.BATCH_DEADLINE`` around each batch of a model
that expires late queries (its earliest deadline plus the grace), ``batch_call_timeout`` turns
it into a call's timeout, Triton requests are written as protobuf bytes with the ``timeout``
parameter, raw tensor contents round-trip, and the casts on the way are exact. The real servers
are in ``integration/test_deadline_carried.py``."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest

from inferline.core import (
    BATCH_DEADLINE,
    DeadlineExceededError,
    ValidationError,
    batch_call_timeout,
)
from inferline.queueing import Dispatcher, FixedBatching, InProcessReplica


def test_batch_call_timeout_is_the_shorter_of_the_default_and_the_deadline() -> None:
    async def main() -> None:
        now = asyncio.get_running_loop().time
        assert batch_call_timeout(5.0) == (5.0, False)  # nothing set: the default
        assert batch_call_timeout(None) == (None, False)
        token = BATCH_DEADLINE.set(now() + 0.5)
        try:
            t, bound = batch_call_timeout(5.0)
            assert bound and t is not None and 0.4 < t <= 0.5
            t, bound = batch_call_timeout(None)
            assert bound and t is not None and 0.4 < t <= 0.5
            assert batch_call_timeout(0.1) == (0.1, False)  # the default is shorter
        finally:
            BATCH_DEADLINE.reset(token)
        token = BATCH_DEADLINE.set(now() - 1.0)
        try:
            assert batch_call_timeout(5.0) == (0.0, True)  # already past: no time at all
        finally:
            BATCH_DEADLINE.reset(token)

    asyncio.run(main())


class _Recorder:
    """A container that records the batch deadline its replica call sees (a test double for
    the protocol clients, which read the same variable)."""

    def __init__(self, fail: bool = False) -> None:
        self.seen: list[float] = []
        self.fail = fail

    def predict_batch(self, xs: list[Any]) -> list[Any]:
        self.seen.append(BATCH_DEADLINE.get())
        if self.fail:
            raise DeadlineExceededError("m", 0.0, "cut at the deadline")
        return xs


def _run(expire_late: bool, fail: bool = False) -> tuple[_Recorder, float, list[Any]]:
    rec = _Recorder(fail)

    async def main() -> tuple[float, list[Any]]:
        d = Dispatcher(expire_grace_s=0.03)
        d.add_model("m", batching=FixedBatching(4), expire_late=expire_late, max_retries=2)
        now = d.clock()
        futs = [d.submit_nowait("m", i, deadline=now + dl) for i, dl in enumerate((2.0, 1.0))]
        d.set_replicas("m", [InProcessReplica("m", rec)])
        outs = await asyncio.gather(*futs, return_exceptions=True)
        await d.close()
        return now, outs

    now, outs = asyncio.run(main())
    return rec, now, outs


def test_the_queue_carries_the_earliest_deadline_plus_the_grace() -> None:
    rec, now, outs = _run(expire_late=True)
    assert outs == [0, 1]
    (seen,) = rec.seen  # one batch of both
    assert seen == pytest.approx(now + 1.0 + 0.03, abs=0.01)  # the dispatcher's clock is monotonic
    assert BATCH_DEADLINE.get() == math.inf  # reset after the call


def test_no_deadline_is_carried_where_late_queries_are_still_answered() -> None:
    rec, _, outs = _run(expire_late=False)
    assert outs == [0, 1] and rec.seen == [math.inf]


def test_a_batch_cut_at_its_deadline_is_answered_not_retried() -> None:
    rec, _, outs = _run(expire_late=True, fail=True)
    assert all(isinstance(o, DeadlineExceededError) for o in outs), outs
    assert len(rec.seen) == 1  # another replica could only be later


# -- Triton: raw contents and requests written as bytes --------------------------------------


def test_raw_contents_round_trip() -> None:
    from inferline.adapters.triton._tensors import from_raw_contents, raw_contents

    for a, dt in (
        (np.arange(6, dtype=np.float32).reshape(2, 3), "FP32"),
        (np.array([[-(2**40)], [7]], dtype=np.int64), "INT64"),
        (np.array([True, False]), "BOOL"),
        (np.array([[b"ab"], [b""], ["\xe9".encode()]], dtype=object), "BYTES"),
    ):
        back = from_raw_contents(raw_contents(a, dt), dt, a.shape, "t")
        assert back.shape == a.shape and back.tolist() == a.tolist()
    with pytest.raises(ValidationError, match="24 bytes"):
        from_raw_contents(b"\0" * 20, "FP32", (2, 3), "output 'y'")
    with pytest.raises(ValidationError, match="length-prefixed"):
        from_raw_contents(b"\5\0\0\0ab", "BYTES", (1,), "output 'y'")


def test_triton_request_bytes_carry_the_tensors_and_the_timeout() -> None:
    pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] (extra 'triton')")
    from tritonclient.grpc import service_pb2

    from inferline.adapters.triton import GrpcInfer

    g = GrpcInfer("127.0.0.1:1", {})
    g._pb = service_pb2
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    body = g.request("m", {"x": (x, "FP32")}, ["y", "z"], "2", 25_000)
    req = service_pb2.ModelInferRequest.FromString(body)
    assert (req.model_name, req.model_version) == ("m", "2")
    assert [o.name for o in req.outputs] == ["y", "z"]
    (t,) = req.inputs
    assert (t.name, t.datatype, list(t.shape)) == ("x", "FP32", [2, 4])
    assert np.frombuffer(req.raw_input_contents[0], np.float32).tolist() == x.ravel().tolist()
    assert req.parameters["timeout"].int64_param == 25_000
    # the model's constant part is written once and reused; no deadline: no timeout parameter
    again = service_pb2.ModelInferRequest.FromString(
        g.request("m", {"x": (x, "FP32")}, ["y", "z"], "2")
    )
    assert "timeout" not in again.parameters and len(g._heads) == 1


def test_triton_inputs_refuse_a_cast_that_changes_values() -> None:
    from inferline.adapters.triton import ModelIO, TensorSpec

    io = ModelIO((TensorSpec("x", "INT8", (3,)),), (TensorSpec("y", "INT8", (3,)),), 8)
    with pytest.raises(ValidationError, match=r"INT8|int8"):
        io.encode_item(np.array([1000, 200, -129], dtype=np.int64))  # was [-24, -56, 127]
    assert io.encode_item(np.array([1, -2, 3], dtype=np.int64))["x"].dtype == np.int8


# -- TF Serving: tensors written in place, typed values cast exactly --------------------------


def test_tfserving_tensor_protos_in_place_and_exact() -> None:
    from inferline.adapters.tfserving._protos import (
        available,
        from_tensor_proto,
        stubs,
        to_tensor_proto,
    )

    if not available():
        pytest.skip("tensorflow-serving-api not installed")
    st = stubs()
    req = st.predict_pb2.PredictRequest()
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    tp = to_tensor_proto(a, st, into=req.inputs["x"])
    assert tp is req.inputs["x"]  # written into the request, not copied in
    assert from_tensor_proto(req.inputs["x"]).tolist() == a.tolist()
    bad = st.tensor_pb2.TensorProto(dtype=6)  # DT_INT8 from the wider int_val field
    bad.tensor_shape.dim.add().size = 2
    bad.int_val.extend([1000, 5])
    with pytest.raises(ValidationError, match=r"outputs\.y"):
        from_tensor_proto(bad, "outputs.y")  # astype made 1000 into -24
    ok = st.tensor_pb2.TensorProto(dtype=6)
    ok.tensor_shape.dim.add().size = 2
    ok.int_val.extend([-3, 5])
    assert from_tensor_proto(ok).tolist() == [-3, 5]
