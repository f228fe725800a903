"""SelectionService: straggler mitigation at the deadline, confidence defaults, feedback joins."""

import asyncio
import random

import pytest

from inferline.core import NotFoundError, ValidationError
from inferline.selection import (
    Exp3,
    Exp4,
    MemoryStore,
    SelectionConfig,
    SelectionService,
    SQLiteStore,
    WeightState,
)


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


def test_exp3_learns_away_from_a_model_that_never_answers():
    """A selected model that misses every deadline loses (missing_loss): before, only the
    answering models were charged their mistakes and the silent one became the favourite."""

    async def main():
        svc = SelectionService(
            "app",
            Exp3(["ok", "dead"], rng=random.Random(1)),
            _caller({"ok": 0, "dead": 5}, {"ok": 1, "dead": 1}),
        )
        loop = asyncio.get_running_loop()
        picks = []
        for i in range(400):
            p = await svc.predict(i, deadline=loop.time() + 0.002)
            picks.append(p.models)
            label = 1 if i % 10 else 0  # "ok" is wrong one time in ten
            svc.feedback(label, query_id=p.query_id)
        return picks, svc.state()

    picks, st = asyncio.run(main())
    last = picks[-100:]
    assert sum(1 for m in last if m == ("ok",)) >= 90
    assert st.weights()[st.index("dead")] < 0.01
    assert st.total_loss[st.index("dead")] == st.counts[st.index("dead")]  # loss 1 each time


def test_exp3_importance_weight_is_the_probability_at_selection_time():
    """With delayed feedback the state moves between selection and feedback: the update
    -eta * L / p_i must use the p_i the model was selected with (logged with the query)."""
    pol = Exp3(["a", "b"], eta=0.2, gamma=0.0, weight_floor=0.0)
    st = WeightState(("a", "b"), (0.0, -1.0), (0, 0), (0.0, 0.0), 0)
    new = pol.observe(st, None, 0, {"b": 1}, selected_p={"a": 0.5, "b": 0.5})
    assert new.log_weights == pytest.approx((0.0, -1.0 - 0.2 / 0.5))
    now = pol.observe(st, None, 0, {"b": 1})  # no logged p: the current one
    assert now.log_weights[1] == pytest.approx(-1.0 - 0.2 / pol.probabilities(st)[1])

    seen = []

    class Spy(Exp3):
        def observe(self, state, x, feedback, predictions, selected_p=None):
            seen.append(selected_p)
            return super().observe(state, x, feedback, predictions, selected_p)

    async def main():
        svc = SelectionService(
            "app",
            Spy(["a", "b"], rng=random.Random(3)),
            _caller({"a": 0, "b": 0}, {"a": 1, "b": 2}),
        )
        first = await svc.predict("x1")
        p_then = svc.policy.selection_probabilities(svc.state())
        for i in range(20):  # feedback on later queries moves the state first
            q = await svc.predict(f"y{i}")
            svc.feedback(1, query_id=q.query_id)
        svc.feedback(1, query_id=first.query_id)
        return p_then, svc.policy.selection_probabilities(svc.state())

    p_then, p_now = asyncio.run(main())
    assert seen[-1] == p_then and p_then != p_now


def test_feedback_label_kind_and_user_checks():
    async def main():
        svc = SelectionService(
            "app",
            Exp4(["a", "b"]),
            _caller({"a": 0, "b": 0}, {"a": 2, "b": 2}),
            config=SelectionConfig(per_user=True),
        )
        p = await svc.predict("x", user="erin")
        with pytest.raises(ValidationError, match=r"label: expected a number"):
            svc.feedback("2", query_id=p.query_id)  # would count as both models' mistake
        with pytest.raises(ValidationError, match="user: expected the user the query was made for"):
            svc.feedback(2, query_id=p.query_id, user="mallory")
        first = svc.feedback(2, query_id=p.query_id, user="erin")
        assert svc.feedback(2.0, query_id=p.query_id)["duplicate"]  # 2 and 2.0: one label
        q = await svc.predict("z")  # made without a user: feedback may personalize it
        svc.feedback(2, query_id=q.query_id, user="dave")
        return first, svc.state("erin"), svc.state("dave"), svc.state(None)

    first, erin, dave, glob = asyncio.run(main())
    assert first["context"] == "app/user/erin" and erin.steps == 1 and dave.steps == 1
    assert glob.steps == 0 and erin.total_loss == (0.0, 0.0)


def test_feedback_receipts_survive_a_restart(tmp_path):
    """The query log is memory; the store's receipt, written with the state, is not: a
    client retrying after a crash gets duplicate (it counted), or 404 (it did not)."""
    db = tmp_path / "sel.sqlite"

    async def before_crash():
        svc = SelectionService(
            "app",
            Exp4(["a", "b"]),
            _caller({"a": 0, "b": 0}, {"a": 1, "b": 2}),
            store=SQLiteStore(db),
        )
        p = await svc.predict("x")
        await svc.predict("w")
        unanswered = await svc.predict("y")
        ans = svc.feedback(1, query_id=p.query_id)
        svc.feedback(2, x="w")
        return p.query_id, ans, unanswered.query_id

    qid, ans, unanswered = asyncio.run(before_crash())
    svc = SelectionService("app", Exp4(["a", "b"]), None, store=SQLiteStore(db))  # restarted
    again = svc.feedback(1, query_id=qid)
    assert again == {**ans, "duplicate": True}
    assert svc.state().steps == 2  # not counted twice
    with pytest.raises(ValidationError, match="already recorded"):
        svc.feedback(0, query_id=qid)
    assert svc.feedback(2, x="w")["duplicate"]
    with pytest.raises(NotFoundError):
        svc.feedback(1, query_id=unanswered)  # never counted: a 404 says so


def test_receipts_are_bounded(tmp_path):
    st = SQLiteStore(tmp_path / "r.sqlite", receipt_capacity=10)
    for i in range(600):
        st.update(
            "k",
            lambda s: {"n": (s or {"n": 0})["n"] + 1},
            receipt=([f"r{i}"], lambda n: {"i": n["n"]}),
        )
    rows = st._db.execute("SELECT COUNT(*) FROM receipts").fetchone()[0]
    assert rows <= 10 + 256
    assert st.receipt("r599") == {"i": 600} and st.receipt("r0") is None
    m = MemoryStore(receipt_capacity=3)
    for i in range(5):
        m.update("k", lambda s: {}, receipt=([f"r{i}"], lambda n: {"i": 1}))
    assert m.receipt("r4") == {"i": 1} and m.receipt("r1") is None
    m.put("a", {})
    m.delete("a")  # raised AttributeError before
    assert m.get("a") is None
