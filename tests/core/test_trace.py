import numpy as np
import pytest

from inferline.core import (
    ValidationError,
    gamma_trace,
    load_csv_trace,
    load_trace,
    max_arrivals_in_window,
    mean_rate,
    rescale_to_rate,
    save_trace,
    split_trace,
    varying_trace,
)


@pytest.mark.parametrize(("rate", "cv"), [(100.0, 1.0), (50.0, 4.0), (200.0, 0.5)])
def test_gamma_trace_has_requested_rate_and_true_cv(rate, cv):
    t = gamma_trace(rate, cv, 2000.0, np.random.default_rng(1))
    gaps = np.diff(t)
    assert mean_rate(t) == pytest.approx(rate, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)
    assert np.all(gaps >= 0) and t[-1] < 2000.0


def test_gamma_trace_is_seeded():
    a = gamma_trace(10, 2, 100, np.random.default_rng(7))
    b = gamma_trace(10, 2, 100, np.random.default_rng(7))
    assert np.array_equal(a, b)


def test_varying_trace_moves_between_rates():
    t = varying_trace([(100, 1, 100), (300, 1, 100)], np.random.default_rng(0), transition_s=20)
    first = np.sum(t < 100) / 100
    ramp = np.sum((t >= 100) & (t < 120)) / 20
    last = np.sum(t >= 120) / 80
    assert first == pytest.approx(100, rel=0.1)
    assert 120 < ramp < 280
    assert last == pytest.approx(300, rel=0.1)


def _stepwise_varying_trace(segments, rng, transition_s, step_s=1.0):
    """varying_trace before its transitions were bounded to MAX_RAMP_STEPS steps: the
    reference its output must still equal for transitions of fewer steps."""
    parts, t, prev = [], 0.0, None
    for rate, cv, dur in segments:
        seg_end = t + dur
        if prev is not None and transition_s > 0:
            ramp_end = min(seg_end, t + transition_s)
            u = t
            while u < ramp_end:
                frac = min(1.0, (u - t + step_s / 2) / transition_s)
                w = min(step_s, ramp_end - u)
                r, c = prev[0] + (rate - prev[0]) * frac, prev[1] + (cv - prev[1]) * frac
                parts.append(gamma_trace(r, c, w, rng, start_s=u))
                u += w
            t = ramp_end
        if seg_end > t:
            parts.append(gamma_trace(rate, cv, seg_end - t, rng, start_s=t))
        t, prev = seg_end, (rate, cv)
    return np.concatenate(parts)


@pytest.mark.parametrize(
    ("segments", "transition_s"),
    [
        ([(100, 1, 100), (300, 1, 100)], 20),
        ([(5, 0.5, 30), (50, 4, 7.5), (1, 1, 200)], 10.25),  # a ramp cut short by its segment
        ([(10, 1, 50), (20, 2, 50)], 0),
        ([(0.01, 1, 20_000), (0.02, 1, 20_000)], 10_000),  # exactly MAX_RAMP_STEPS steps
    ],
)
def test_varying_trace_is_unchanged_for_transitions_of_few_steps(segments, transition_s):
    a = varying_trace(segments, np.random.default_rng(3), transition_s=transition_s)
    b = _stepwise_varying_trace(segments, np.random.default_rng(3), transition_s)
    assert np.array_equal(a, b)


def test_a_long_transition_takes_a_bounded_number_of_steps(monkeypatch):
    """``trace varying --transition-s 1e9`` over a 1e9 s segment drew once a second: 1e9 steps
    (hours). Steps are now at least transition_s / MAX_RAMP_STEPS long."""
    import inferline.core._trace as trace_mod

    calls = 0

    def counted(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls > trace_mod.MAX_RAMP_STEPS + 10:
            raise AssertionError("a step per second")
        return gamma_trace(*args, **kwargs)

    monkeypatch.setattr(trace_mod, "gamma_trace", counted)
    segments = [(1e-4, 1, 1e9), (2e-4, 1, 1e9)]
    t = varying_trace(segments, np.random.default_rng(0), transition_s=1e9)
    assert calls <= trace_mod.MAX_RAMP_STEPS + 2
    # still a ramp: about 1e5 arrivals before it, 1.5e5 over it
    assert np.sum(t < 1e9) == pytest.approx(1e5, rel=0.02)
    assert t.size - np.sum(t < 1e9) == pytest.approx(1.5e5, rel=0.02)


def test_a_binary_csv_is_one_error_naming_it(tmp_path):
    """Was a UnicodeDecodeError traceback (the header, or a row further on)."""
    for name, data in (
        ("bin.csv", b"\x7fELF\x02\x01\xf0\x9f"),
        ("late.csv", b"TIMESTAMP\n1\n\xff\n"),
    ):
        f = tmp_path / name
        f.write_bytes(data)
        with pytest.raises(ValidationError) as e:
            load_csv_trace(f)
        assert str(e.value) == f"{f}: expected a UTF-8 text file, got 'binary data'"


def test_text_format_round_trip(tmp_path):
    t = gamma_trace(10, 1, 10, np.random.default_rng(0))
    save_trace(t, tmp_path / "t.txt")
    assert np.array_equal(load_trace(tmp_path / "t.txt"), t)


def test_load_trace_rejects_decreasing_times_with_line(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("0.1\n0.3\n0.2\n")
    with pytest.raises(ValidationError, match=r"t.txt:3"):
        load_trace(f)


def test_csv_trace_and_rescale(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,1,1\n2023-11-16 18:15:47.6805900,1,1\n"
        "2023-11-16 18:15:49.6805900,1,1\n"
    )
    t = load_csv_trace(f)
    assert t.tolist() == pytest.approx([0.0, 1.0, 3.0])
    r = rescale_to_rate(t, 2.0)
    assert mean_rate(r) == pytest.approx(2.0)
    assert r.tolist() == pytest.approx([0.0, 1 / 3, 1.0])


def test_window_max_and_split():
    t = np.array([0.0, 0.1, 0.2, 1.0, 1.05, 1.1, 1.15])
    assert max_arrivals_in_window(t, 0.2) == 4
    assert max_arrivals_in_window(t, 0.09) == 2
    a, b = split_trace(t, 0.5)
    assert a.tolist() == [0.0, 0.1, 0.2] and b.size == 4


def test_real_azure_trace_loads():
    import pathlib

    p = pathlib.Path(__file__).resolve().parents[3] / "shared/data/traces/azure_llm_2023_conv.csv"
    if not p.exists():
        pytest.skip(f"shared data folder absent: {p}")
    t = load_csv_trace(p)
    assert t.size == 19366
    assert mean_rate(t) == pytest.approx(5.5, rel=0.05)
