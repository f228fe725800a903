"""Tables the measuring commands print (rich): the profiler's latency fits and a replay's summary."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["finite_or_none", "print_fits", "print_replay"]


def print_fits(result: Any, console: Any = None) -> None:
    """The latency-vs-batch-size fits as a table (one row per model and hardware)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="batch latency fit (quantile regression: latency = intercept + slope x batch)")
    for col in ("model", "hw", "batch", "p50@min", "p50@max", "fixed", "per item", "R1"):
        t.add_column(col, justify="right" if col not in ("model", "hw") else "left", no_wrap=True)
    t.add_column("linear?", justify="left", no_wrap=True)
    for f in result.fits:
        if f.quantile != 0.5:
            continue
        prof = result.profiles.models[f.model][f.hardware]
        sizes = sorted(prof)
        p50 = [prof[b].p50_s or prof[b].latency_s for b in (sizes[0], sizes[-1])]
        t.add_row(
            f.model,
            f.hardware,
            f"{sizes[0]}..{sizes[-1]}",
            f"{p50[0] * 1e3:.2f} ms",
            f"{p50[1] * 1e3:.2f} ms",
            f"{f.intercept_s * 1e3:.2f} ms",
            f"{f.slope_s * 1e3:.3f} ms",
            f"{f.pseudo_r2:.2f}",
            "yes" if f.linear else f"[yellow]no[/] (off by {f.max_rel_deviation:.0%})",
        )
    (console or Console(width=max(100, Console().width))).print(t)


def finite_or_none(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _ms(v: float) -> str:
    return f"{v:.2f} ms" if math.isfinite(v) else "n/a (no predictions)"


def print_replay(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="replay")
    t.add_column("metric")
    t.add_column("value", justify="right")
    # A one-query trace (or all at one time) spans no time, so has no rate; still a fair smoke
    # test of a server, so it runs rather than being refused, and the rate says why it is n/a.
    rate = s["offered_qps"]
    rows = [
        ("queries sent", f"{s['queries']}"),
        ("offered rate", f"{rate:.1f} q/s" if math.isfinite(rate) else "n/a (the trace spans 0 s)"),
        ("answered", f"{s['answered']}"),
        ("predictions", f"{s['ok']}"),
        ("default outputs", f"{s['defaults']}"),
        ("errors", f"{s['errors']}  {s['error_kinds'] or ''}"),
        ("status codes", ", ".join(f"{k}: {v}" for k, v in s["status"].items())),
        ("P50 latency", _ms(s["p50_ms"])),
        ("P99 latency", _ms(s["p99_ms"])),
        ("max latency", _ms(s["max_ms"])),
    ]
    if s["slo_ms"] is not None:
        rows.append(("SLO miss rate", f"{s['slo_miss_rate']:.2%} (SLO {s['slo_ms']:.0f} ms)"))
    rows.append(("client send lag P99", f"{s['send_lag_p99_ms']:.2f} ms"))
    for k, v in rows:
        t.add_row(k, v)
    Console().print(t)
