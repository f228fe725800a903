"""SelectionService: straggler mitigation at the deadline, confidence defaults, feedback joins."""

import asyncio
import random

import pytest

from inferline.core import NotFoundError, ValidationError
from inferline.selection import Exp3, Exp4, SelectionConfig, SelectionService, SQLiteStore


def _caller(delays, outputs):
    async def call(model, x):
        await asyncio.sleep(delays[model])
        if isinstance(outputs[model], BaseException):
            raise outputs[model]
        return outputs[model]

    return call


def test_combine_at_deadline_uses_what_arrived():
    async def main():
        svc = SelectionService(
            "app",
            Exp4(["fast1", "fast2", "slow"]),
            _caller({"fast1": 0, "fast2": 0, "slow": 5}, {"fast1": 7, "fast2": 7, "slow": 1}),
        )
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        p = await svc.predict("x", deadline=t0 + 0.2)
        return p, loop.time() - t0

    p, took = asyncio.run(main())
    assert took < 1.0
    assert (p.output, p.contributed, p.selected) == (7, 2, 3)
    assert p.confidence == pytest.approx(2 / 3)


def test_low_confidence_returns_default_with_explanation():
    async def main():
        svc = SelectionService(
            "app",
            Exp4(["a", "b", "c"]),
            _caller({"a": 0, "b": 0, "c": 0}, {"a": 1, "b": 2, "c": 3}),
            config=SelectionConfig(confidence_threshold=0.5, default_output="unknown"),
        )
        return await svc.predict("x")

    p = asyncio.run(main())
    assert p.default and p.output == "unknown"
    assert "confidence 0.33 below the threshold 0.50" in p.default_explanation


def test_all_models_failing_gives_default_with_reasons():
    async def main():
        svc = SelectionService(
            "app",
            Exp4(["a"]),
            _caller({"a": 0}, {"a": RuntimeError("boom")}),
            config=SelectionConfig(default_output=-1),
        )
        return await svc.predict("x", deadline=asyncio.get_running_loop().time() + 1)

    p = asyncio.run(main())
    assert p.default and p.output == -1 and "boom" in p.default_explanation


def test_a_model_call_that_ends_cancelled_is_a_failed_model_not_a_failed_query():
    # e.g. an RPC cancelled under the call when its channel closed: the other models still count
    async def main():
        svc = SelectionService(
            "app",
            Exp4(["a", "b"]),
            _caller({"a": 0, "b": 0}, {"a": asyncio.CancelledError(), "b": 5}),
        )
        return await svc.predict("x", deadline=asyncio.get_running_loop().time() + 1)

    p = asyncio.run(main())
    assert (p.output, p.contributed, p.selected) == (5, 1, 2)


def test_feedback_by_query_id_or_input_updates_per_user_state(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")

    async def main():
        svc = SelectionService(
            "app",
            Exp3(["good", "bad"], gamma=0.1, rng=random.Random(0)),
            _caller({"good": 0, "bad": 0}, {"good": 1, "bad": 0}),
            config=SelectionConfig(per_user=True),
            store=store,
        )
        for i in range(200):
            p = await svc.predict({"i": i}, user="u1")
            if i % 2:
                svc.feedback(1, query_id=p.query_id)
            else:
                svc.feedback(1, x={"i": i}, user="u1")
        return svc

    svc = asyncio.run(main())
    w = svc.state("u1").weights()
    assert w[0] > 0.9  # learned that "good" is right for u1
    assert svc.state("u2").steps == 0  # other users untouched
    assert SQLiteStore(tmp_path / "s.db").get("app/user/u1")["steps"] == 200
    # a retried feedback (same query, same label) changes nothing; another label is refused
    qid = next(reversed(svc._log))
    again = svc.feedback(1, query_id=qid)
    assert again["duplicate"] is True and again["steps"] == 200
    assert SQLiteStore(tmp_path / "s.db").get("app/user/u1")["steps"] == 200
    with pytest.raises(ValidationError, match="label: expected the label already recorded"):
        svc.feedback(0, query_id=qid)
    with pytest.raises(NotFoundError):
        svc.feedback(1, query_id="nope")
    with pytest.raises(ValidationError, match="query_id"):
        svc.feedback(1)
