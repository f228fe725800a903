"""Timeline plot of a simulation with a tuner in the loop (matplotlib, Agg backend).

Three panels sharing the time axis: the arrival rate (1 s bins), the serving replicas of
every model (from the estimator's replica timeline, scaling decisions marked), and the query
latencies (P99 and median per second, against the SLO).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["plot_formats", "plot_timeline", "replicas_over_time"]


def plot_formats() -> list[str]:
    """The file extensions :func:`plot_timeline` can write (matplotlib's, without dots), for
    checking a plot path before a simulation runs rather than after."""
    import matplotlib.figure

    return sorted(matplotlib.figure.Figure().canvas.get_supported_filetypes())


def replicas_over_time(
    timeline: Sequence[tuple[float, str, int]], models: Sequence[str]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per model, step points ``(times, counts)`` from ``SimResult.replica_timeline``."""
    out: dict[str, tuple[list[float], list[int]]] = {m: ([], []) for m in models}
    for t, m, n in timeline:
        if m in out:
            out[m][0].append(float(t))
            out[m][1].append(int(n))
    return {m: (np.asarray(ts), np.asarray(ns)) for m, (ts, ns) in out.items()}


def plot_timeline(
    result: Any,
    slo_s: float,
    path: str | os.PathLike[str],
    *,
    decisions: Sequence[Any] = (),
    title: str = "",
    bin_s: float = 1.0,
) -> None:
    """Write the timeline of ``result`` (a ``SimResult``) to ``path`` (PNG, SVG, PDF...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arr = np.asarray(result.arrivals_s, dtype=np.float64)
    lat = np.asarray(result.latencies_s, dtype=np.float64)
    t0 = float(arr[0]) if arr.size else 0.0
    t1 = float(arr[-1]) if arr.size else 1.0
    edges = np.arange(t0, t1 + bin_s, bin_s)
    if edges.size < 2:
        edges = np.array([t0, t0 + bin_s])
    mid = (edges[:-1] + edges[1:]) / 2 - t0
    counts, _ = np.histogram(arr, edges)

    fig, ax = plt.subplots(3, 1, figsize=(10, 8), sharex=True, constrained_layout=True)
    ax[0].plot(mid, counts / bin_s, lw=1, color="tab:blue")
    ax[0].set_ylabel("arrivals / s")
    ax[0].set_title(title or "simulation timeline")

    models = list(dict.fromkeys(m for _, m, _ in result.replica_timeline))
    steps = replicas_over_time(result.replica_timeline, models)
    for m in models:
        ts, ns = steps[m]
        if ts.size:
            ts = np.append(ts, t1) - t0
            ns = np.append(ns, ns[-1])
            ax[1].step(ts, ns, where="post", label=m, lw=1.5)
    for d in decisions:
        ax[1].axvline(
            float(d.time_s) - t0,
            color={"up": "tab:green", "settle": "tab:gray"}.get(
                getattr(d, "action", "up"), "tab:red"
            ),
            lw=0.5,
            alpha=0.4,
        )
    top = ax[1].get_ylim()[1]
    for t, stage, variant in getattr(result, "variant_switches", ()):
        # a variant switch: the stage's new model, written along the line
        x = float(t) - t0
        ax[1].axvline(x, color="tab:orange", lw=1, ls=":")
        ax[1].text(x, top, f" {stage}: {variant}", rotation=90, va="top", fontsize="x-small")
    ax[1].set_ylabel("serving replicas")
    if models:
        ax[1].legend(loc="upper left", fontsize="small", ncol=min(5, len(models)))

    idx = np.clip(np.searchsorted(edges, arr, side="right") - 1, 0, mid.size - 1)
    p99 = np.full(mid.size, np.nan)
    p50 = np.full(mid.size, np.nan)
    finite = np.where(np.isfinite(lat), lat, np.nan)
    for i in np.unique(idx):
        sel = finite[idx == i]
        if np.any(np.isfinite(sel)):
            p99[i] = np.nanpercentile(sel, 99)
            p50[i] = np.nanpercentile(sel, 50)
    ax[2].plot(mid, p99, lw=1, color="tab:purple", label="P99")
    ax[2].plot(mid, p50, lw=1, color="tab:gray", label="median")
    ax[2].axhline(slo_s, color="tab:red", ls="--", lw=1, label=f"SLO {slo_s:g} s")
    ax[2].set_yscale("log")
    ax[2].set_ylabel("latency (s)")
    ax[2].set_xlabel("time (s)")
    ax[2].legend(loc="upper left", fontsize="small")
    fig.savefig(path)
    plt.close(fig)
