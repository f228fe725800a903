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
