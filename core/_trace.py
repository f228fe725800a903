"""Arrival traces: generation (gamma processes, time-varying), loading, rescaling, envelopes.

A trace is a non-decreasing float64 array of arrival times in seconds. On disk it is a text file
with one time per line (docs/design.md); times are relative, so a trace may start anywhere.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TextIO

import numpy as np
import numpy.typing as npt

from ._validate import read_text
from .errors import ValidationError

__all__ = [
    "Trace",
    "compress",
    "gamma_trace",
    "load_csv_trace",
    "load_trace",
    "max_arrivals_in_window",
    "mean_rate",
    "peak_rate",
    "rescale_to_rate",
    "save_trace",
    "split_trace",
    "varying_trace",
]

Trace = npt.NDArray[np.float64]


def _check_rate_cv(rate: float, cv: float, where: str = "") -> None:
    if not (rate > 0 and np.isfinite(rate)):
        raise ValidationError(f"{where}rate", "a number of queries/s > 0", rate)
    if not (cv > 0 and np.isfinite(cv)):
        raise ValidationError(f"{where}cv", "a coefficient of variation > 0", cv)


def gamma_trace(
    rate: float, cv: float, duration_s: float, rng: np.random.Generator, start_s: float = 0.0
) -> Trace:
    """Arrivals with gamma inter-arrival times of mean ``1/rate`` and true CV ``cv``.

    Shape ``k = 1/cv^2`` and scale ``1/(rate k)`` give mean 1/rate and CV exactly ``cv``.
    """
    _check_rate_cv(rate, cv)
    if not duration_s > 0:
        raise ValidationError("duration_s", "a duration > 0", duration_s)
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    out: list[Trace] = []
    t = start_s
    end = start_s + duration_s
    # Draw in chunks sized for the expected count so long traces need one or two draws.
    n = max(16, int(rate * duration_s * 1.1) + 16)
    while t < end:
        gaps = rng.gamma(shape, scale, size=n)
        times = t + np.cumsum(gaps)
        out.append(times[times < end])
        if times[-1] >= end:
            break
        t = float(times[-1])
    return np.concatenate(out) if out else np.empty(0)


# Most steps a transition of varying_trace takes; finer than any rate change a tuner could
# tell apart, and a normal transition (under 10,000 steps of step_s) is unchanged.
MAX_RAMP_STEPS = 10_000


def varying_trace(
    segments: Sequence[tuple[float, float, float]],
    rng: np.random.Generator,
    transition_s: float = 0.0,
    step_s: float = 1.0,
) -> Trace:
    """A trace that moves through ``(rate, cv, duration_s)`` segments (InferLine §6).

    Between consecutive segments the rate and CV change linearly over ``transition_s`` seconds
    (taken from the start of the next segment), piecewise-constant in steps of ``step_s``, or
    of ``transition_s / MAX_RAMP_STEPS`` where that is longer.
    """
    if not segments:
        raise ValidationError("segments", "at least one (rate, cv, duration_s)", [])
    # a step costs a gamma draw of its own: a transition of 1e9 s in 1 s steps took hours
    step_s = max(step_s, transition_s / MAX_RAMP_STEPS)
    parts: list[Trace] = []
    t = 0.0
    prev: tuple[float, float] | None = None
    for i, (rate, cv, dur) in enumerate(segments):
        _check_rate_cv(rate, cv, f"segments[{i}].")
        seg_end = t + dur
        if prev is not None and transition_s > 0:
            ramp_end = min(seg_end, t + transition_s)
            u = t
            while u < ramp_end:
                frac = min(1.0, (u - t + step_s / 2) / transition_s)
                r = prev[0] + (rate - prev[0]) * frac
                c = prev[1] + (cv - prev[1]) * frac
                w = min(step_s, ramp_end - u)
                parts.append(gamma_trace(r, c, w, rng, start_s=u))
                u += w
            t = ramp_end
        if seg_end > t:
            parts.append(gamma_trace(rate, cv, seg_end - t, rng, start_s=t))
        t = seg_end
        prev = (rate, cv)
    return np.concatenate(parts)


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read the text format (one arrival time in seconds per line; ``#`` comments allowed)."""
    p = Path(path)
    lines = read_text(p, "an existing trace file").splitlines()
    vals: list[float] = []
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            vals.append(float(s))
        except ValueError:
            raise ValidationError(f"{p}:{i}", "an arrival time in seconds", s) from None
    arr = np.asarray(vals, dtype=np.float64)
    if arr.size == 0:
        raise ValidationError(str(p), "at least one arrival time", "an empty trace")
    if not np.all(np.isfinite(arr)):
        raise ValidationError(str(p), "finite arrival times", "nan or inf")
    bad = np.nonzero(np.diff(arr) < 0)[0]
    if bad.size:
        raise ValidationError(f"{p}:{bad[0] + 2}", "non-decreasing arrival times", arr[bad[0] + 1])
    return arr


def save_trace(trace: Trace, path: str | os.PathLike[str]) -> None:
    # repr-exact floats so a saved trace reloads to the identical array
    Path(path).write_text("".join(f"{float(t)!r}\n" for t in trace))


def load_csv_trace(
    path: str | os.PathLike[str], column: str = "TIMESTAMP", relative: bool = True
) -> Trace:
    """Arrival times from a CSV column of timestamps (ISO datetimes or seconds).

    Datetimes with seven fractional digits (the Azure traces) are cut to microseconds.
    """
    p = Path(path)
    try:
        fh = p.open(newline="")
    except FileNotFoundError:
        raise ValidationError(str(p), "an existing CSV file", "no such file") from None
    except OSError as e:  # a folder, no permission: a traceback before
        raise ValidationError(str(p), "a readable CSV file", e.strerror) from None
    with fh:
        try:
            vals = _csv_timestamps(fh, p, column)
        except UnicodeDecodeError:  # read as it streams (the traces are large): a traceback
            raise ValidationError(str(p), "a UTF-8 text file", "binary data") from None
    arr = np.asarray(vals, dtype=np.float64)
    if arr.size == 0:
        raise ValidationError(str(p), "at least one row", "no rows")
    # Rows are in arrival order but clock jitter can reorder neighbours by microseconds.
    arr = np.maximum.accumulate(arr)
    return arr - arr[0] if relative else arr


def _csv_timestamps(fh: TextIO, p: Path, column: str) -> list[float]:
    """The ``column`` of the CSV ``fh`` (read from ``p``) as seconds."""
    vals: list[float] = []
    reader = csv.DictReader(fh)
    if reader.fieldnames is None or column not in reader.fieldnames:
        raise ValidationError(f"{p}: column", f"a column named {column!r}", reader.fieldnames)
    for i, row in enumerate(reader, 2):
        raw = (row[column] or "").strip()
        try:
            vals.append(float(raw))
        except ValueError:
            try:
                vals.append(datetime.fromisoformat(raw[:26]).timestamp())
            except ValueError:
                raise ValidationError(
                    f"{p}:{i}.{column}", "a timestamp (seconds or ISO datetime)", raw
                ) from None
    return vals


def mean_rate(trace: Trace) -> float:
    """Mean arrival rate: arrivals per second over the span between first and last arrival."""
    if trace.size < 2:
        raise ValidationError("trace", "at least two arrivals to measure a rate", trace.size)
    span = float(trace[-1] - trace[0])
    if span <= 0:
        raise ValidationError("trace", "arrivals spread over time", "all at one instant")
    return (trace.size - 1) / span


def rescale_to_rate(trace: Trace, target_rate: float) -> Trace:
    """Keep the shape; multiply inter-arrival gaps by ``observed_rate / target_rate``."""
    if not target_rate > 0:
        raise ValidationError("target_rate", "a rate > 0", target_rate)
    factor = mean_rate(trace) / target_rate
    return trace[0] + (trace - trace[0]) * factor


def compress(trace: Trace, factor: float) -> Trace:
    """The same arrivals ``factor`` times as fast (gaps divided by ``factor``, first kept);
    ``factor == 1`` returns ``trace`` itself."""
    if not factor > 0:
        raise ValidationError("factor", "a factor > 0", factor)
    if factor == 1.0:
        return trace
    return trace[0] + (trace - trace[0]) / factor


def split_trace(trace: Trace, fraction: float) -> tuple[Trace, Trace]:
    """Split at ``fraction`` of the time span (e.g. plan on the first 25%, serve the rest)."""
    if not 0 < fraction < 1:
        raise ValidationError("fraction", "a number in (0, 1)", fraction)
    cut = trace[0] + (trace[-1] - trace[0]) * fraction
    i = int(np.searchsorted(trace, cut, side="left"))
    return trace[:i], trace[i:]


def max_arrivals_in_window(trace: Trace, window_s: float) -> int:
    """Largest number of arrivals in any half-open window ``[t, t + window_s)``.

    The maximum is attained by a window that starts at an arrival, so a two-pointer scan over
    sorted times is exact.
    """
    if trace.size == 0:
        return 0
    ends = np.searchsorted(trace, trace + window_s, side="left")
    return int(np.max(ends - np.arange(trace.size)))


def peak_rate(trace: Trace, window_s: float) -> float:
    """Peak arrival rate over a sliding window (CG-Peak uses a window equal to the SLO)."""
    if not window_s > 0:
        raise ValidationError("window_s", "a window > 0", window_s)
    return max_arrivals_in_window(trace, window_s) / window_s
