"""Evaluation harness of the selection layer: the experiments of ``benchmarks/selection.py``
as pure, seeded functions over model predictions, so the tests can check the same claims on
small inputs (``tests/selection/test_experiments.py``).

The predictions come from wherever the caller got them (the benchmark: real digits classifiers
served by the bundled runtime); here they are arrays ``preds[model][i]`` = label predicted for
test image ``i``.

- :func:`model_failure` (Clipper Fig. 3.8): a stream of queries with immediate feedback; one
  model fails (answers a random wrong label) for a span of the stream; cumulative error of
  Exp3, Exp4 and every single model.
- :func:`confidence_table`: ensemble confidence (agreement) versus error, per threshold.
- :func:`personalized`: users whose inputs are distorted differently; per-user Exp4 state
  against one global Exp4 state.
- :func:`switching_replay` (Model-Switching): a real arrival trace replayed in the estimator
  with the switching controller deciding every ``interval_s``, against every fixed option.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferline.core import (
    DEFAULT_CATALOG,
    Hardware,
    HardwareCatalog,
    ModelConfig,
    Pipeline,
    ValidationError,
)
from inferline.core import simulate as core_simulate
from inferline.selection import (
    Exp3,
    Exp4,
    RateEstimator,
    SwitchingConfig,
    SwitchingController,
    SwitchingTable,
    combine_votes,
)

__all__ = [
    "FailureResult",
    "confidence_table",
    "model_failure",
    "personalized",
    "switching_replay",
]

Preds = Mapping[str, np.ndarray]
Decisions = list[tuple[float, Any]]  # (time, SwitchOption active from then on)


@dataclass(frozen=True)
class FailureResult:
    """Cumulative error curves (fraction of the first n queries answered wrongly)."""

    curves: Mapping[str, np.ndarray]
    fail_model: str
    fail_span: tuple[int, int]

    def final(self) -> dict[str, float]:
        return {k: float(v[-1]) for k, v in self.curves.items()}


def _stream(n_images: int, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, n_images, n)


def _failed_preds(
    preds: Preds, y: np.ndarray, q: np.ndarray, fail: str, span: tuple[int, int], seed: int
) -> dict[str, np.ndarray]:
    """Per query (not per image) predictions, with ``fail`` answering a random wrong label in
    ``span``."""
    out = {m: np.asarray(p)[q] for m, p in preds.items()}
    rng = np.random.default_rng(seed + 1)
    a, b = span
    wrong = (y[q[a:b]] + rng.integers(1, 10, b - a)) % 10
    out[fail] = out[fail].copy()
    out[fail][a:b] = wrong
    return out


def _policy_curve(policy: Any, per_query: Mapping[str, np.ndarray], yq: np.ndarray) -> np.ndarray:
    state = policy.init()
    errs = np.empty(len(yq))
    for i in range(len(yq)):
        chosen = policy.select(state, None)
        p = {m: int(per_query[m][i]) for m in chosen}
        out = policy.combine(state, None, p).output
        errs[i] = out != yq[i]
        state = policy.observe(state, None, int(yq[i]), p)
    return np.cumsum(errs) / np.arange(1, len(yq) + 1)


def model_failure(
    preds: Preds,
    y: np.ndarray,
    *,
    n_queries: int = 20_000,
    fail_span: tuple[int, int] = (5_000, 10_000),
    fail_model: str | None = None,
    seed: int = 0,
    exp3: Mapping[str, float] | None = None,
    exp4: Mapping[str, float] | None = None,
) -> FailureResult:
    """Clipper's model-failure experiment; ``fail_model`` defaults to the most accurate."""
    models = list(preds)
    y = np.asarray(y)
    if fail_model is None:
        fail_model = max(models, key=lambda m: float(np.mean(np.asarray(preds[m]) == y)))
    rng = np.random.default_rng(seed)
    q = _stream(len(y), n_queries, rng)
    yq = y[q]
    per_q = _failed_preds(preds, y, q, fail_model, fail_span, seed)
    curves: dict[str, np.ndarray] = {}
    for m in models:
        curves[m] = np.cumsum(per_q[m] != yq) / np.arange(1, n_queries + 1)
    curves["exp3"] = _policy_curve(
        Exp3(models, rng=random.Random(seed), **dict(exp3 or {})), per_q, yq
    )
    curves["exp4"] = _policy_curve(
        Exp4(models, rng=random.Random(seed), **dict(exp4 or {})), per_q, yq
    )
    return FailureResult(curves, fail_model, fail_span)


def confidence_table(
    preds: Preds,
    y: np.ndarray,
    thresholds: Sequence[float],
    weights: Mapping[str, float] | None = None,
) -> list[dict[str, float]]:
    """Per threshold: fraction of queries declined (confidence below it), error of all
    predictions, error of the confident ones (the ones returned)."""
    models = list(preds)
    y = np.asarray(y)
    w = dict(weights) if weights is not None else dict.fromkeys(models, 1.0)
    outs, conf = [], []
    for i in range(len(y)):
        c = combine_votes({m: int(preds[m][i]) for m in models}, w, models)
        outs.append(c.output)
        conf.append(c.confidence)
    wrong = np.asarray(outs) != y
    conf_a = np.asarray(conf)
    rows = []
    for t in thresholds:
        keep = conf_a >= t - 1e-12
        rows.append(
            {
                "threshold": float(t),
                "declined": float(1.0 - keep.mean()),
                "error_all": float(wrong.mean()),
                "error_confident": float(wrong[keep].mean()) if keep.any() else float("nan"),
            }
        )
    return rows


def personalized(
    user_preds: Mapping[str, Preds],
    user_y: Mapping[str, np.ndarray],
    *,
    n_queries: int = 6_000,
    seed: int = 0,
    eta: float = 0.3,
) -> dict[str, Any]:
    """Users take turns at random; each query is image ``i`` of that user's (distorted) test
    set. Error of Exp4 with one state per user, Exp4 with one global state, and every single
    model; also per user."""
    users = sorted(user_preds)
    models = list(user_preds[users[0]])
    rng = np.random.default_rng(seed)
    who = rng.integers(0, len(users), n_queries)
    idx = np.array([rng.integers(0, len(user_y[users[u]])) for u in who])
    pol = Exp4(models, eta=eta, rng=random.Random(seed))
    states = {u: pol.init() for u in users}
    glob = pol.init()
    err = {"exp4-per-user": 0, "exp4-global": 0, **dict.fromkeys(models, 0)}
    per_user = {u: {"n": 0, "exp4-per-user": 0, "exp4-global": 0} for u in users}
    for u_i, i in zip(who, idx, strict=True):
        u = users[u_i]
        y = int(user_y[u][i])
        p = {m: int(user_preds[u][m][i]) for m in models}
        a = pol.combine(states[u], None, p).output != y
        b = pol.combine(glob, None, p).output != y
        states[u] = pol.observe(states[u], None, y, p)
        glob = pol.observe(glob, None, y, p)
        err["exp4-per-user"] += a
        err["exp4-global"] += b
        for m in models:
            err[m] += p[m] != y
        per_user[u]["n"] += 1
        per_user[u]["exp4-per-user"] += a
        per_user[u]["exp4-global"] += b
    return {
        "error": {k: v / n_queries for k, v in err.items()},
        "per_user": {
            u: {k: (v / d["n"] if k != "n" else v) for k, v in d.items()}
            for u, d in per_user.items()
        },
        "weights": {u: dict(zip(models, states[u].weights().round(3), strict=True)) for u in users},
    }


def switching_replay(
    trace: np.ndarray,
    table: SwitchingTable,
    config: SwitchingConfig,
    profiles: Any,
    *,
    interval_s: float = 1.0,
    warm_replicas: int = 1,
    queue: str = "shared",
    activation_s: float = 1.0,
    simulate: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Replay ``trace``: (a) each fixed option of ``table``; (b) the controller, deciding every
    ``interval_s`` from the arrivals so far. Effective accuracy = sum over queries that met the
    deadline of the accuracy of the variant that served them / number of queries.

    ``queue="shared"`` (default; Clipper's single task queue, as in the Model-Switching paper):
    one FIFO queue; whichever variant is active when a replica frees takes the next batch. On a
    switch the old variant's replicas finish their batch and stop; the new variant has
    ``warm_replicas`` replicas at once and the rest of its option's after ``activation_s``.
    ``queue="per-variant"``: each query stays with the variant active at its arrival (the live
    ``LiveSwitcher``'s behaviour); each variant's queue is simulated with inferline's estimator,
    the active variant with the option's replicas and the others with ``warm_replicas``."""
    trace = np.asarray(trace, dtype=float)
    if trace.size < 2:
        raise ValidationError("trace", "at least two arrivals", trace.size)
    est = _Estimate(simulate or core_simulate, profiles, _thread_catalog(table), config.deadline_s)
    if queue not in ("shared", "per-variant"):
        raise ValidationError("queue", "'shared' or 'per-variant'", queue)
    fixed = _fixed_options(trace, table, est, queue)
    decisions = _controller_decisions(trace, table, config, interval_s)
    if queue == "shared":
        ok, by = _serve_shared(
            trace, decisions, profiles, est.deadline_s, warm_replicas, activation_s
        )
        controller = _shared_summary(trace, table, decisions, ok, by)
    else:
        controller = _per_variant_summary(trace, table, config, decisions, est, warm_replicas)
    return {
        "controller": controller,
        "fixed": fixed,
        "decisions": [(tt, o.to_dict()) for tt, o in decisions],
    }


@dataclass(frozen=True)
class _Estimate:
    """Which queries of one variant's queue meet the deadline, by inferline's estimator."""

    sim: Callable[..., Any]
    profiles: Any
    catalog: HardwareCatalog
    deadline_s: float

    def met(
        self, variant: str, arr: np.ndarray, cfg: ModelConfig, schedule: Sequence[Any] = ()
    ) -> np.ndarray:
        if arr.size == 0:
            return np.zeros(0, bool)
        pipe = Pipeline(variant, (variant,))
        res = self.sim(
            pipe, {variant: cfg}, self.profiles, arr, catalog=self.catalog, schedule=schedule
        )
        return np.asarray(res.latencies_s) <= self.deadline_s + 1e-12


def _thread_catalog(table: SwitchingTable) -> HardwareCatalog:
    """The default catalog plus one CPU kind per option's thread count (priced per thread)."""
    cpu = DEFAULT_CATALOG["cpu"].cost_per_hour
    return DEFAULT_CATALOG.merged(
        HardwareCatalog({o.hardware: Hardware("cpu", cpu * o.threads) for o in table.options})
    )


def _fixed_options(
    trace: np.ndarray, table: SwitchingTable, est: _Estimate, queue: str
) -> dict[str, dict[str, Any]]:
    """Each option of ``table`` serving the whole trace alone."""
    fixed = {}
    for o in table.options:
        if queue == "shared":
            ok, _ = _serve_shared(
                trace, [(float(trace[0]), o)], est.profiles, est.deadline_s, 0, 0.0
            )
        else:
            ok = est.met(o.variant, trace, ModelConfig(o.hardware, o.max_batch_size, o.replicas))
        fixed[f"{o.variant} R{o.replicas}xT{o.threads}"] = {
            "option": o,
            "meet": float(ok.mean()),
            "effective_accuracy": float(table.accuracy[o.variant] * ok.mean()),
        }
    return fixed


def _controller_decisions(
    trace: np.ndarray, table: SwitchingTable, config: SwitchingConfig, interval_s: float
) -> Decisions:
    """The controller deciding every ``interval_s`` from the arrivals so far; one entry per
    change of option (the first at the first arrival)."""
    ctl = SwitchingController(table, config)
    est = RateEstimator(config.rate_window)
    t0, t_end = float(trace[0]), float(trace[-1])
    j = 0
    t = t0
    active = ctl.decide(t0, est).option
    decisions: Decisions = [(t0, active)]
    while t < t_end:
        t += interval_s
        k = int(np.searchsorted(trace, t, side="right"))
        if k > j:
            est = est.add(trace[j:k])
            j = k
        d = ctl.decide(t, est)
        if d.option != active:
            active = d.option
            decisions.append((t, active))
    return decisions


def _shared_summary(
    trace: np.ndarray, table: SwitchingTable, decisions: Decisions, ok: np.ndarray, by: np.ndarray
) -> dict[str, Any]:
    acc_of = np.array([table.accuracy.get(v, 0.0) for v in by])
    used = {v: int(np.sum(by == v)) for v in sorted({o.variant for _, o in decisions})}
    return {
        "effective_accuracy": float(np.sum(acc_of * ok) / trace.size),
        "meet": float(ok.mean()),
        "switches": len(decisions) - 1,
        "queries_per_variant": used,
    }


def _per_variant_summary(
    trace: np.ndarray,
    table: SwitchingTable,
    config: SwitchingConfig,
    decisions: Decisions,
    est: _Estimate,
    warm_replicas: int,
) -> dict[str, Any]:
    """Each query queued at the option active at its arrival; each queue in the estimator."""
    times = np.array([d[0] for d in decisions])
    which = np.searchsorted(times, trace, side="right") - 1
    total_eff = 0.0
    met_all = 0
    used: dict[str, int] = {}
    # one queue per (variant, threads): a thread-count change is a redeploy in the live system
    keys = sorted({(o.variant, o.hardware) for _, o in decisions})
    for v, hw in keys:
        mask = np.array(
            [(decisions[w][1].variant, decisions[w][1].hardware) == (v, hw) for w in which]
        )
        arr = trace[mask]
        used[v] = used.get(v, 0) + int(mask.sum())
        if arr.size == 0:
            continue
        sched = [
            (tt, v, o.replicas if (o.variant, o.hardware) == (v, hw) else warm_replicas)
            for tt, o in decisions
        ]
        # the count in effect at this queue's first arrival, then the later changes
        start = max(i for i, s in enumerate(sched) if s[0] <= arr[0])
        cfg = ModelConfig(hw, config.max_batch_size, sched[start][2])
        ok = est.met(v, arr, cfg, schedule=sched[start + 1 :])
        met_all += int(ok.sum())
        total_eff += table.accuracy[v] * float(ok.sum())
    n = trace.size
    return {
        "effective_accuracy": total_eff / n,
        "meet": met_all / n,
        "switches": len(decisions) - 1,
        "queries_per_variant": used,
    }


def _serve_shared(
    trace: np.ndarray,
    decisions: Sequence[tuple[float, Any]],
    profiles: Any,
    deadline_s: float,
    warm: int,
    activation_s: float,
) -> tuple[np.ndarray, np.ndarray]:
    """One FIFO queue served by the active option's replicas (batches of up to its
    ``max_batch_size``, latency from ``profiles``). Returns (met deadline, variant that served)
    per query."""
    import heapq
    from collections import deque

    n = trace.size
    met = np.zeros(n, dtype=bool)
    by = np.empty(n, dtype=object)
    k = 0
    opt = decisions[0][1]
    free = [float(trace[0])] * opt.replicas  # start with the first option fully up
    heapq.heapify(free)
    q: deque[int] = deque()
    i = 0
    t = float(trace[0])
    inf = float("inf")
    while i < n or q:
        ta = float(trace[i]) if i < n else inf
        td = float(decisions[k + 1][0]) if k + 1 < len(decisions) else inf
        ts = max(free[0], t) if (q and free) else inf
        t = min(ta, td, ts)
        if t == inf:  # queue left without replicas: never served
            break
        if ta <= t:  # arrivals first at one instant
            while i < n and trace[i] <= t:
                q.append(i)
                i += 1
            continue
        if td <= t:
            k += 1
            opt = decisions[k][1]
            now = [t] * min(opt.replicas, warm) if warm > 0 else [t] * opt.replicas
            later = [t + activation_s] * (opt.replicas - len(now))
            free = now + later  # the old variant's replicas finish their batch and stop
            heapq.heapify(free)
            continue
        heapq.heappop(free)
        b = min(opt.max_batch_size, len(q))
        fin = t + profiles.latency(opt.variant, opt.hardware, b)
        for _ in range(b):
            j = q.popleft()
            met[j] = fin - trace[j] <= deadline_s + 1e-12
            by[j] = opt.variant
        heapq.heappush(free, fin)
    return met, by
