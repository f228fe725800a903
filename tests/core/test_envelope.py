"""Traffic envelopes: windows, offline envelope, online envelope (exactness and memory)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inferline.core import (
    OnlineEnvelope,
    TrafficEnvelope,
    ValidationError,
    envelope_windows,
    gamma_trace,
    max_arrivals_in_window,
    trace_envelope,
)


def test_windows_double_from_service_time_up_to_60s():
    assert envelope_windows(0.1) == (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2, 60.0)
    assert envelope_windows(7.5) == (7.5, 15.0, 30.0, 60.0)  # 60 reached exactly: no duplicate
    assert envelope_windows(80.0) == (80.0,)
    assert envelope_windows(1.0, max_window_s=4.0) == (1.0, 2.0, 4.0)
    with pytest.raises(ValidationError):
        envelope_windows(0.0)


def test_offline_envelope_by_hand():
    t = np.array([0.0, 0.1, 0.15, 1.0, 1.05, 1.1, 1.12, 5.0])
    env = trace_envelope(t, (0.1, 0.2, 1.0, 10.0))
    # [1.0, 1.1) holds 1.0, 1.05; [1.05, 1.15) holds 1.05, 1.1, 1.12 -> 3 in 0.1 s
    assert env.points == ((0.1, 3), (0.2, 4), (1.0, 5), (10.0, 8))  # [0.15, 1.15): 5
    assert env.rates() == pytest.approx((30.0, 20.0, 5.0, 0.8))
    assert TrafficEnvelope.from_dict(env.to_dict()) == env


def test_exceeded_by_names_the_windows():
    a = TrafficEnvelope(((0.1, 5), (1.0, 20)))
    b = TrafficEnvelope(((0.1, 7), (1.0, 19)))
    assert a.exceeded_by(b) == [(0.1, 7, 5)]
    with pytest.raises(ValidationError):
        a.exceeded_by(TrafficEnvelope(((0.2, 5),)))
    with pytest.raises(ValidationError):
        TrafficEnvelope(((1.0, 2), (0.5, 3)))


# Times on a coarse grid make ties, equal gaps and window-boundary hits common.
_times = st.lists(
    st.one_of(st.integers(0, 400).map(lambda i: i * 0.05), st.floats(0, 20, allow_nan=False)),
    min_size=1,
    max_size=120,
).map(sorted)
_windows = st.lists(
    st.sampled_from([0.05, 0.1, 0.15, 0.3, 0.7, 1.0, 2.5, 5.0]), min_size=1, max_size=5, unique=True
).map(sorted)


@settings(max_examples=150, deadline=None)
@given(_times, _windows, st.lists(st.integers(1, 30), min_size=1, max_size=10))
def test_online_equals_offline_on_the_same_stream(times, windows, cuts):
    arr = np.asarray(times)
    on = OnlineEnvelope(windows)
    i = 0
    k = 0
    # Feed in batches of arbitrary sizes (including single arrivals).
    while i < arr.size:
        n = cuts[k % len(cuts)]
        on.extend(arr[i : i + n])
        i += n
        k += 1
    assert on.envelope() == trace_envelope(arr, windows)
    assert on.total == arr.size


@settings(max_examples=60, deadline=None)
@given(_times, _windows, st.integers(1, 20))
def test_peaks_cover_the_windows_since_the_last_take(times, windows, split):
    arr = np.asarray(times)
    on = OnlineEnvelope(windows)
    a, b = arr[:split], arr[split:]
    on.extend(a)
    first = on.take_peaks()
    on.extend(b)
    second = on.take_peaks()
    full = trace_envelope(arr, windows).counts
    assert tuple(max(x, y) for x, y in zip(first, second, strict=True)) == full
    # Windows ending at the second batch's arrivals, counted over the whole stream.
    for w, peak in zip(windows, second, strict=True):
        # (x - w, x] tested with the online predicate t + w > x
        expect = max((int(np.sum((arr + w > x) & (arr <= x))) for x in b), default=0)
        assert peak == expect
    assert on.take_peaks() == tuple(0 for _ in windows)


def test_counts_at_is_the_current_curve():
    on = OnlineEnvelope((0.5, 2.0))
    on.extend([0.0, 0.2, 0.9, 1.0, 1.0, 1.4])
    assert on.counts_at(1.45) == (3, 6)  # (0.95, 1.45] and everything
    assert on.counts_at(2.1) == (0, 5)  # (1.6, 2.1] and (0.1, 2.1]
    assert on.counts_at(10.0) == (0, 0)


def test_memory_is_bounded_by_the_largest_window():
    rng = np.random.default_rng(1)
    t = gamma_trace(500.0, 2.0, 200.0, rng)
    on = OnlineEnvelope((0.1, 1.0, 10.0))
    most = 0
    bound = max_arrivals_in_window(t, 10.0) + 1
    for chunk in np.array_split(t, 400):
        on.extend(chunk)
        most = max(most, on.buffered)
        # live entries never exceed the arrivals of the last 10 s (+ the entry at the edge)
        assert on.buffered <= bound
        assert on.capacity <= 2 * (on.buffered + chunk.size) + 1024
    assert most < t.size / 10


def test_resolution_bounds_memory_whatever_the_rate():
    rng = np.random.default_rng(2)
    t = gamma_trace(20_000.0, 1.0, 3.0, rng)  # 60k arrivals in 3 s
    on = OnlineEnvelope((0.01, 1.0), resolution_s=0.001)
    for chunk in np.array_split(t, 30):
        on.extend(chunk)
        assert on.buffered <= 1.0 / 0.001 + 2
    snapped = np.floor(t / 0.001) * 0.001
    assert on.envelope() == trace_envelope(snapped, (0.01, 1.0))


def test_rejects_time_going_backwards():
    on = OnlineEnvelope((1.0,))
    on.extend([1.0, 2.0])
    with pytest.raises(ValidationError):
        on.add(1.5)
    with pytest.raises(ValidationError):
        on.extend([3.0, 2.5])
    with pytest.raises(ValidationError):
        OnlineEnvelope(())


def test_window_boundaries_within_an_ulp_match_the_offline_scan():
    # 0.1 + 0.2 != 0.3 in floating point: the online search must use the offline predicate.
    base = [0.1, 0.2, 0.3, 0.30000000000000004, 0.7, 0.8, 0.9, 1.0]
    times = sorted(
        {*base, *(np.nextafter(x, 2.0) for x in base), *(np.nextafter(x, 0) for x in base)}
    )
    arr = np.asarray(times)
    windows = (0.1, 0.2, 0.3, 0.6)
    for step in (1, 2, 5):
        on = OnlineEnvelope(windows)
        for i in range(0, arr.size, step):
            on.extend(arr[i : i + step])
        assert on.envelope() == trace_envelope(arr, windows)
