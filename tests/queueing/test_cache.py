"""PredictionCache: exact CLOCK eviction sequences, keys, invalidation, async coalescing."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferline.core.errors import ValidationError
from inferline.queueing import PredictionCache, cache_key, key_prefix, parse_key


def k(name: str) -> bytes:
    return cache_key("m", 1, name)


# ---------------------------------------------------------------- keys


def test_key_distinguishes_model_version_and_type() -> None:
    keys = {
        cache_key("m", 1, 5),
        cache_key("m", 2, 5),
        cache_key("n", 1, 5),
        cache_key("m", "1", 5),
        cache_key("m", 1, "5"),
        cache_key("m", 1, 5.0),
        cache_key("m", 1, True),
        cache_key("m", 1, [5]),
        cache_key("m", 1, (5,)),
        cache_key("m", 1, np.array([5], dtype=np.int64)),
        cache_key("m", 1, np.array([5], dtype=np.int32)),
        cache_key("m", 1, np.array([[5]], dtype=np.int64)),
        cache_key("m", 1, b"5"),
    }
    assert len(keys) == 13


def test_key_is_canonical() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert cache_key("m", 1, a) == cache_key("m", 1, np.asfortranarray(a))  # layout-free
    assert cache_key("m", 1, a.T) != cache_key("m", 1, a)
    assert cache_key("m", 1, {"a": 1, "b": [1, 2]}) == cache_key("m", 1, {"b": [1, 2], "a": 1})
    long = "x" * 200  # hashed path
    assert cache_key("m", 1, long) == cache_key("m", 1, "x" * 200)
    # Length prefixes: concatenation cannot make two inputs collide.
    assert cache_key("m", 1, ["ab", "c"]) != cache_key("m", 1, ["a", "bc"])
    assert cache_key("m", 1, 5).startswith(key_prefix("m", 1))
    assert cache_key("m", 1, 5, prefix=key_prefix("m", 1)) == cache_key("m", 1, 5)


def test_parse_key_round_trip() -> None:
    assert parse_key(cache_key("resnet", 7, np.zeros(3))) == ("resnet", 7)
    assert parse_key(cache_key("résumé", "v2", "x")) == ("résumé", "v2")
    assert parse_key(b"\x00") is None


@pytest.mark.parametrize("bad", [object(), {1: 2}, np.array([object()]), {1.5}])
def test_key_rejects_unhashable_encodings(bad: object) -> None:
    with pytest.raises(ValidationError) as e:
        cache_key("m", 1, bad)
    assert e.value.field == "x"


def test_key_rejects_bad_model_and_version() -> None:
    with pytest.raises(ValidationError):
        cache_key("", 1, 1)
    with pytest.raises(ValidationError):
        cache_key("m", 1.5, 1)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        cache_key("m", True, 1)


# ---------------------------------------------------------------- CLOCK


def test_fifo_when_nothing_is_read() -> None:
    c = PredictionCache(3)
    for name in "abcd":
        c.put(k(name), name)
    # New entries start with a clear bit, so the hand (at slot 0) evicts "a" at once.
    assert c.keys() == [k("d"), k("b"), k("c")]
    c.put(k("e"), "e")
    assert c.keys() == [k("d"), k("e"), k("c")]
    assert c.evictions == 2
    assert len(c) == 3


def test_exact_clock_sequence_with_second_chances() -> None:
    c = PredictionCache(3)
    for name in "abc":
        c.put(k(name), name)
    assert c.get(k("a")) == (True, "a")
    assert c.get(k("b")) == (True, "b")
    # Hand at 0: a has its bit -> cleared; b has its bit -> cleared; c clear -> evicted.
    c.put(k("d"), "d")
    assert c.keys() == [k("a"), k("b"), k("d")]
    assert c.get(k("c")) == (False, None)
    # Hand now at slot 0 (after 2); a's bit was cleared, so a goes next.
    c.put(k("e"), "e")
    assert c.keys() == [k("e"), k("b"), k("d")]
    # Read d; hand at 1: b is clear -> evicted.
    c.get(k("d"))
    c.put(k("f"), "f")
    assert c.keys() == [k("e"), k("f"), k("d")]
    # Hand at 2: d has its bit -> cleared, wraps to e (clear) -> evicted.
    c.put(k("g"), "g")
    assert c.keys() == [k("g"), k("f"), k("d")]
    assert (c.hits, c.misses, c.evictions) == (3, 1, 4)


def test_all_bits_set_sweeps_full_turn() -> None:
    c = PredictionCache(3)
    for name in "abc":
        c.put(k(name), name)
        c.get(k(name))
    c.put(k("d"), "d")  # clears a, b, c then evicts a
    assert c.keys() == [k("d"), k("b"), k("c")]


def test_reput_updates_value_and_gives_second_chance() -> None:
    c = PredictionCache(2)
    c.put(k("a"), 1)
    c.put(k("b"), 2)
    c.put(k("a"), 10)
    c.put(k("c"), 3)  # a is referenced, b is evicted
    assert c.get(k("a")) == (True, 10)
    assert c.get(k("b")) == (False, None)


def test_invalidate_frees_slots_which_are_refilled_lowest_first() -> None:
    c = PredictionCache(4)
    for i, name in enumerate("abcd"):
        c.put(cache_key("m", i % 2, name), name)
    assert c.invalidate(model="m", version=0) == 2  # a (slot 0), c (slot 2)
    assert len(c) == 2
    c.put(k("x"), "x")
    c.put(k("y"), "y")
    assert c.keys() == [k("x"), cache_key("m", 1, "b"), k("y"), cache_key("m", 1, "d")]
    assert c.evictions == 0
    assert c.invalidate(lambda key: key == k("x")) == 1
    assert c.invalidate(model="other") == 0
    assert c.invalidate(model="m") == 3
    assert len(c) == 0


def test_invalidate_version_needs_model() -> None:
    with pytest.raises(ValidationError):
        PredictionCache(1).invalidate(version=1)


def test_capacity_zero_disables() -> None:
    c = PredictionCache(0)
    c.put(k("a"), 1)
    assert c.get(k("a")) == (False, None)
    assert len(c) == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_capacity(bad: object) -> None:
    with pytest.raises(ValidationError) as e:
        PredictionCache(bad)  # type: ignore[arg-type]
    assert e.value.field == "capacity"


def test_get_many_matches_get() -> None:
    c = PredictionCache(3)
    c.put(k("a"), 1)
    c.put(k("b"), 2)
    assert c.get_many([k("a"), k("z"), k("b")]) == [(True, 1), (False, None), (True, 2)]
    assert (c.hits, c.misses) == (2, 1)


class ClockModel:
    """Straight-line reference CLOCK, to check the ring implementation against."""

    def __init__(self, n: int) -> None:
        self.n, self.slots, self.ref, self.hand = n, [None] * n, [0] * n, 0

    def get(self, key: int) -> bool:
        if key in self.slots:
            self.ref[self.slots.index(key)] = 1
            return True
        return False

    def put(self, key: int) -> None:
        if self.n == 0:
            return
        if key in self.slots:
            self.ref[self.slots.index(key)] = 1
            return
        if None in self.slots:
            i = self.slots.index(None)
        else:
            while self.ref[self.hand]:
                self.ref[self.hand] = 0
                self.hand = (self.hand + 1) % self.n
            i = self.hand
            self.hand = (self.hand + 1) % self.n
        self.slots[i], self.ref[i] = key, 0


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(0, 6),
    ops=st.lists(st.tuples(st.sampled_from(["get", "put"]), st.integers(0, 9)), max_size=80),
)
def test_property_bounded_and_matches_reference(capacity: int, ops: list[tuple[str, int]]) -> None:
    c = PredictionCache(capacity)
    ref = ClockModel(capacity)
    gets = 0
    for op, x in ops:
        if op == "put":
            c.put(cache_key("m", 1, x), x)
            ref.put(x)
            if capacity:
                assert c.get(cache_key("m", 1, x)) == (True, x)  # just-put key is resident
                ref.get(x)
                gets += 1
        else:
            assert c.get(cache_key("m", 1, x))[0] == ref.get(x)
            gets += 1
        assert len(c) <= capacity
        assert c.hits + c.misses == gets
    assert c.keys() == [cache_key("m", 1, s) for s in ref.slots if s is not None]


# ---------------------------------------------------------------- coalescing


def test_concurrent_identical_queries_evaluate_once() -> None:
    async def main() -> None:
        c = PredictionCache(8)
        calls = 0
        gate = asyncio.Event()

        async def compute() -> str:
            nonlocal calls
            calls += 1
            await gate.wait()
            return "y"

        waiters = [asyncio.create_task(c.get_or_compute(k("q"), compute)) for _ in range(5)]
        await asyncio.sleep(0)
        gate.set()
        assert await asyncio.gather(*waiters) == ["y"] * 5
        assert calls == 1
        assert c.coalesced == 4
        assert await c.get_or_compute(k("q"), compute) == "y"  # now a plain hit
        assert calls == 1

    asyncio.run(main())


def test_failure_reaches_every_waiter_and_is_not_cached() -> None:
    async def main() -> None:
        c = PredictionCache(8)
        calls = 0
        gate = asyncio.Event()

        async def boom() -> str:
            nonlocal calls
            calls += 1
            await gate.wait()
            raise RuntimeError("model died")

        waiters = [asyncio.create_task(c.get_or_compute(k("q"), boom)) for _ in range(3)]
        await asyncio.sleep(0)
        gate.set()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, RuntimeError) for r in results)
        assert calls == 1
        assert k("q") not in c

        async def ok() -> str:
            return "fine"

        assert await c.get_or_compute(k("q"), ok) == "fine"  # retried, not the failed result

    asyncio.run(main())


def test_cancelled_waiter_does_not_cancel_shared_computation() -> None:
    async def main() -> None:
        c = PredictionCache(8)
        gate = asyncio.Event()

        async def compute() -> int:
            await gate.wait()
            return 42

        first = asyncio.create_task(c.get_or_compute(k("q"), compute))
        second = asyncio.create_task(c.get_or_compute(k("q"), compute))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        gate.set()
        assert await second == 42
        assert c.get(k("q")) == (True, 42)

    asyncio.run(main())
