"""Model selection on real models: bandits under model failure, ensemble confidence, stragglers,
model switching on real traces, personalized selection, Rafiki's RL scheduling.

Models are real scikit-learn classifiers trained at run time on scikit-learn's digits
(``benchmarks/_digits.py``), served as replica processes of the bundled runtime
(``local://``); every prediction below came back from a replica over gRPC.

1. Model failure (Clipper Fig. 3.8). Five models (naive Bayes, tree, logistic regression,
   random forest, SVM); a stream of queries (test digits drawn with replacement) with immediate
   feedback. The most accurate model answers a random wrong label from query 5,000 to 10,000.
   Cumulative error of Exp3, Exp4 and each model alone. The policies run over the replicas'
   predictions; a prefix of the stream is also served live through ``SelectionService`` and
   must give the same answers.
2. Ensemble confidence: the five models' vote on clean and on noisy test digits; error of the
   predictions whose confidence (agreement) reaches a threshold, versus all, and the fraction
   declined.
3. Stragglers: ensembles of 3..6 models (Exp4 with immediate feedback), one of which (k-NN) sleeps an exponential extra time
   per batch (mean 40 ms, SLO 60 ms). Combining at the deadline versus waiting for every model:
   P99 latency and accuracy.
4. Model switching (Zhang et al.) in simulation (meet-probability tables from inferline's
   estimator; the replay is a discrete-event model of one task queue served by the active
   variant, Clipper's design in the paper, with warm spares of 2 replicas): random-forest
   variants (10 to 300 trees; latencies profiled on the runtime with 1 and 2 threads;
   accuracies measured on noisy digits, sigma 5 on the 0-16 scale, which spreads them like the
   paper's ResNets). Real arrival traces (Azure LLM inference 2023, conversation and code;
   Patel et al., "Splitwise", ISCA 2024, CC-BY 4.0 via the Azure Public Dataset) rescaled so
   the 10-s peak rate is 1.5x the capacity of the most accurate variant. The controller's rate
   window and assumed burstiness are chosen on the first 25% of each trace; effective accuracy
   on the remaining 75% against every single variant and split.
5. Personalized selection: four users whose inputs are distorted differently (none, mirrored,
   inverted, shifted) and four models each trained on one distortion. Exp4 with one state per
   user against one global Exp4 state.
6. Rafiki (simulation): three ensemble members (logistic regression, MLP, SVM on disjoint
   20-pixel subsets of the digits; subset accuracies by majority vote on held-out digits) with
   the paper's latency profile shape (batch 16..64, 0.07..0.50 s), tau = 1 s, the noisy sine
   arrival rate at r_l (sync capacity) and r_u (async capacity); the actor-critic against all
   models synchronously and one model per batch asynchronously (both with Algorithm 3).

Run: ``.venv/bin/python benchmarks/selection.py`` (about 15-25 minutes on 2 shared cores),
``--quick`` (about 3-5 minutes), ``--sections failure,rafiki`` for a subset. Plots go to
``--out`` (default ``out/selection``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import random
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks._* when run as a script

from benchmarks._digits import SOURCE as SRC
from benchmarks._digits import digits_data, distort
from benchmarks._selection_experiments import (
    confidence_table,
    model_failure,
    personalized,
    switching_replay,
)
from inferline.adapters.local import LocalBackend
from inferline.core import (
    ModelConfig,
    ModelSpec,
    Profiles,
    load_csv_trace,
    mean_rate,
    peak_rate,
    rescale_to_rate,
)
from inferline.queueing import Dispatcher, FixedBatching
from inferline.selection import (
    EnsembleEnv,
    Exp4,
    RafikiAgent,
    RafikiConfig,
    SelectionService,
    SwitchingConfig,
    Variant,
    build_switching_table,
    run_baseline,
    sine_arrivals,
    sine_rate,
    thread_hardware,
)

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
SECTIONS = ("failure", "confidence", "stragglers", "switching", "personal", "rafiki")
FIVE = {"nb": {}, "tree": {}, "logreg": {}, "forest": {}, "svc": {}}


def _size(args: argparse.Namespace, full: Any, quick: Any, smoke: Any) -> Any:
    """A run's size: ``smoke`` with ``--smoke``, ``quick`` with ``--quick``, else ``full``."""
    return smoke if getattr(args, "smoke", False) else quick if args.quick else full


def _spec(name: str, kind: str | None = None, **params: Any) -> ModelSpec:
    threads = int(params.get("n_jobs", 1))
    return ModelSpec(name, SRC, {"kind": kind or name, **params}, threads=threads)


async def _deploy(backend: LocalBackend, specs: Sequence[ModelSpec], batch: int = 64) -> None:
    await asyncio.gather(*(backend.deploy(s, ModelConfig("cpu", batch, 1)) for s in specs))


async def _predict_all(backend: LocalBackend, model: str, xs: np.ndarray) -> np.ndarray:
    h = backend.replicas(model)[0]
    out: list[int] = []
    for i in range(0, len(xs), 64):
        out += await h.predict_batch([x for x in xs[i : i + 64]])
    return np.asarray(out)


async def served_predictions(
    specs: Sequence[ModelSpec],
    inputs: dict[str, np.ndarray],
    backend: LocalBackend | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """``{input set: {model: labels}}``, every label from a replica process. ``backend``: a
    backend to deploy ``specs`` to and leave running (its owner closes it), else one of its own
    for this call."""
    own = backend is None
    backend = LocalBackend(oversubscribe=True) if backend is None else backend
    try:
        await _deploy(backend, specs)
        return {
            k: {s.name: await _predict_all(backend, s.name, xs) for s in specs}
            for k, xs in inputs.items()
        }
    finally:
        if own:
            await backend.close()


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in header]] + [
        [f"{v:.4f}" if isinstance(v, float) else str(v) for v in r] for r in rows
    ]
    w = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w[i]) for i, h in enumerate(cells[0]))]
    lines.append("  ".join("-" * x for x in w))
    lines += ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in cells[1:]]
    return "\n".join(lines)


def _plot(path: Path, draw: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    draw(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- 1 and 2


async def sec_failure(args: argparse.Namespace, out: Path) -> tuple[str, dict[str, Any]]:
    _, _, xte, yte = digits_data()
    noisy = distort(xte, "noise:4", args.seed)
    specs = [_spec(k) for k in FIVE]
    # one set of replicas for the predictions and the live run (its calls go to the replicas'
    # handles one query at a time, whatever their batch size): starting and training five
    # more replica processes took longer than the rest of the section
    backend = LocalBackend(oversubscribe=True)
    try:
        preds = await served_predictions(specs, {"clean": xte, "noisy": noisy}, backend)
        # the policies replay fast; --quick shortens the live run
        n = _size(args, 20_000, 20_000, 2_000)
        span = (n // 4, n // 2)
        res = model_failure(preds["clean"], yte, n_queries=n, fail_span=span, seed=args.seed)
        live = await live_failure(specs, preds["clean"], yte, res.fail_model, args, backend)
    finally:
        await backend.close()
    fin = res.final()
    rows = [(k, fin[k]) for k in sorted(fin, key=fin.get)]
    ls = live["span"]
    text = _table(
        f"1. Model failure: {n} queries, {res.fail_model} fails in [{span[0]}, {span[1]}) "
        f"(live SelectionService run of {live['n']} queries, failure in [{ls[0]}, {ls[1]}): "
        f"{live['agree']:.1%} same answers as the replay, {live['injected']} wrong answers "
        f"injected, {res.fail_model}'s Exp4 weight {live['fail_weight_start']:.2f} -> "
        f"{live['fail_weight_end']:.2f})",
        ("policy / model", "cumulative error"),
        rows,
    )

    def draw(ax: Any) -> None:
        for k, c in res.curves.items():
            ax.plot(c, label=k, lw=2 if k.startswith("exp") else 1)
        ax.axvspan(*span, color="0.9")
        ax.set_xlabel("queries")
        ax.set_ylabel("cumulative error")
        ax.set_ylim(0, 0.3)
        ax.legend(fontsize=7)

    _plot(out / "failure.png", draw)
    conf = {k: confidence_table(p, yte, (0.4, 0.6, 0.8, 1.0)) for k, p in preds.items()}
    rows2 = [
        (k, r["threshold"], r["declined"], r["error_all"], r["error_confident"])
        for k, rs in conf.items()
        for r in rs
    ]
    text2 = _table(
        "2. Ensemble confidence (5-model vote; confident = agreement >= threshold)",
        ("inputs", "threshold", "declined", "error all", "error confident"),
        rows2,
    )
    return text + "\n\n" + text2, {"failure": fin, "live": live, "confidence": conf}


def live_span(n: int) -> tuple[int, int]:
    """The failure span of a live run of ``n`` queries: the same quarter-to-half of the stream
    as the offline replay's, scaled to the run (a fixed 5,000 start never fires in 200)."""
    return (n // 4, n // 2)


async def live_failure(
    specs: Sequence[ModelSpec],
    preds: dict[str, np.ndarray],
    y: np.ndarray,
    fail: str,
    args: argparse.Namespace,
    backend: LocalBackend,
) -> dict[str, Any]:
    """A stream through SelectionService + the runtime (Exp4), with ``fail`` answering wrong
    labels in :func:`live_span` of it (injected at the model call); compared with an offline
    replay of the same stream. ``args.live_queries`` sets the length (default 200 with
    ``--quick``, else 1000). Reports how many wrong answers were injected and ``fail``'s Exp4
    weight at the start and the end of the failure, so a run shows the policy reacted.
    ``backend``: one that already runs ``specs`` (its calls go to the replicas' handles one
    query at a time, whatever their batch size); left running."""
    n = getattr(args, "live_queries", None) or _size(args, 1000, 200, 40)
    span = live_span(n)
    # the same draws as model_failure(n_queries=n, fail_span=span): the query stream, then the
    # failed model's wrong labels
    q = np.random.default_rng(args.seed).integers(0, len(y), n)
    extra = np.random.default_rng(args.seed + 1).integers(1, 10, span[1] - span[0])
    wrong = (y[q[span[0] : span[1]]] + extra) % 10
    _, _, xte, _ = digits_data()
    agree = 0
    handles = {s.name: backend.replicas(s.name)[0] for s in specs}
    step = {"i": 0}
    injected = 0
    weights: dict[int, float] = {}

    async def call(m: str, x: Any) -> int:
        nonlocal injected
        real = int((await handles[m].predict_batch([x]))[0])
        out = real
        i = step["i"]
        if m == fail and span[0] <= i < span[1]:
            out = int(wrong[i - span[0]])
        injected += out != real
        return out

    pol = Exp4(list(preds), rng=random.Random(args.seed))
    sel = SelectionService("failure", pol, call)
    offline = pol.init()
    for i in range(n):
        step["i"] = i
        if i in span:
            st = sel.state()
            weights[i] = float(st.weights()[list(st.models).index(fail)])
        p = await sel.predict(xte[q[i]], query_id=str(i))
        sel.feedback(int(y[q[i]]), query_id=str(i))
        ref = {m: int(preds[m][q[i]]) for m in preds}
        if fail in ref and span[0] <= i < span[1]:
            ref[fail] = int(wrong[i - span[0]])
        agree += p.output == pol.combine(offline, None, ref).output
        offline = pol.observe(offline, None, int(y[q[i]]), ref)
    return {
        "n": n,
        "span": span,
        "agree": agree / n,
        "injected": injected,
        "fail_weight_start": weights.get(span[0], math.nan),
        "fail_weight_end": weights.get(span[1], math.nan),
    }


# ---------------------------------------------------------------- 3


async def sec_stragglers(args: argparse.Namespace, out: Path) -> tuple[str, dict[str, Any]]:
    _, _, xte, yte = digits_data()
    slo = 0.060
    fast = ["logreg", "svc", "forest", "nb", "tree"]
    specs = [_spec("knn", delay_s=0.002, tail_s=0.040)] + [_spec(k) for k in fast]
    n = _size(args, 400, 120, 20)
    sizes = _size(args, (3, 4, 5, 6), (3, 5), (3,))
    backend = LocalBackend(oversubscribe=True)
    d = Dispatcher()
    rows, res = [], {}
    try:
        await _deploy(backend, specs, batch=4)
        for s in specs:
            d.add_model(s.name, batching=FixedBatching(4))
        d.attach(backend)
        loop = asyncio.get_running_loop()
        for k in sizes:
            models = ["knn", *fast[: k - 1]]
            out_k = {}
            for mode in ("deadline", "wait-all"):
                lat, ok, contributed = [], 0, 0
                sel = SelectionService(f"s{k}", Exp4(models), None)
                for i in range(n):
                    x = xte[i % len(xte)]
                    t0 = loop.time()

                    async def call(m: str, v: Any, t0: float = t0) -> Any:
                        return await d.submit(m, v, deadline=t0 + slo, arrival=t0)

                    dl = t0 + slo - 0.008 if mode == "deadline" else None  # 8 ms to answer
                    p = await sel.predict(x, deadline=dl, call=call, query_id=str(i))
                    lat.append(loop.time() - t0)
                    ok += p.output == int(yte[i % len(yte)])
                    # immediate feedback: Exp4 learns which models to trust (ties included)
                    sel.feedback(int(yte[i % len(yte)]), query_id=str(i))
                    contributed += p.contributed
                out_k[mode] = {
                    "p99_ms": float(np.percentile(lat, 99) * 1e3),
                    "accuracy": ok / n,
                    "contributed": contributed / n,
                }
                await asyncio.sleep(0.3)  # let the straggler's queue drain between runs
            res[k] = out_k
            dd, wa = out_k["deadline"], out_k["wait-all"]
            rows.append(
                (
                    k,
                    dd["p99_ms"],
                    wa["p99_ms"],
                    dd["accuracy"],
                    wa["accuracy"],
                    (wa["accuracy"] - dd["accuracy"]) * 100,
                    dd["contributed"],
                )
            )
    finally:
        await d.close()
        await backend.close()
    text = _table(
        f"3. Stragglers: k-NN sleeps Exp(40 ms) per batch; SLO {slo * 1e3:.0f} ms; {n} queries each",
        (
            "models",
            "P99 ms (deadline)",
            "P99 ms (wait all)",
            "acc (deadline)",
            "acc (wait all)",
            "drop (points)",
            "models answered",
        ),
        rows,
    )
    return text, {"stragglers": res}


# ---------------------------------------------------------------- 4


async def _profile_variants(trees: dict[str, int], args: argparse.Namespace) -> Profiles:
    _, _, xte, _ = digits_data()
    xs = list(distort(xte, "noise:5", args.seed)[:64])
    backend = LocalBackend(oversubscribe=True)
    table: dict[str, dict[str, dict[int, float]]] = {}
    reps = _size(args, 30, 8, 3)
    try:
        for v, n in trees.items():
            for t in (1, 2) if n >= 100 and not getattr(args, "smoke", False) else (1,):
                spec = _spec(f"{v}-t{t}", "forest", trees=n, n_jobs=t)
                await backend.deploy(spec, ModelConfig("cpu", 8, 1))
                h = backend.replicas(spec.name)[0]
                row = {}
                for b in (1, 2, 4, 8):
                    for _ in range(3):
                        await h.predict_batch(xs[:b])
                    lat = []
                    for r in range(reps):
                        t0 = time.perf_counter()
                        await h.predict_batch(xs[r % 8 : r % 8 + b])
                        lat.append(time.perf_counter() - t0)
                    row[b] = max(float(np.median(lat)), row.get(b // 2, 0.0))
                table.setdefault(v, {})[thread_hardware(t)] = row
                await backend.remove(spec.name)
    finally:
        await backend.close()
    return Profiles.from_latencies(table)


async def sec_switching(args: argparse.Namespace, out: Path) -> tuple[str, dict[str, Any]]:
    _, _, xte, yte = digits_data()
    noisy = distort(xte, "noise:5", args.seed)
    trees = {"f300": 300, "f100": 100, "f30": 30, "f10": 10}
    if getattr(args, "smoke", False):  # the same four names, forests a tenth the size
        trees = {v: max(1, n // 10) for v, n in trees.items()}
    specs = [_spec(v, "forest", trees=n) for v, n in trees.items()]
    preds = (await served_predictions(specs, {"noisy": noisy}))["noisy"]
    acc = {v: float(np.mean(preds[v] == yte)) for v in trees}
    profiles = await _profile_variants(trees, args)
    variants = [Variant(v, acc[v]) for v in trees]
    rows: list[tuple[Any, ...]] = []
    res: dict[str, Any] = {"accuracy": acc, "profiles": profiles.to_dict()}
    for name in ("conv", "code"):
        path = TRACES / f"azure_llm_2023_{name}.csv"
        if not path.exists():
            rows.append((name, "trace missing", str(path), "", ""))
            continue
        raw = load_csv_trace(path)
        if args.quick:
            raw = raw[: len(raw) // _size(args, 1, 3, 30)]
        base = SwitchingConfig(
            deadline_s=0.05,
            core_budget=2,
            sim_queries=_size(args, 3000, 1500, 200),
            rates_qps=tuple(float(r) for r in np.geomspace(5, 3000, _size(args, 48, 48, 12))),
        )
        cvs = _size(args, (1.0, 1.5, 2.0), (1.0, 1.5, 2.0), (1.0,))
        windows = _size(args, (32, 64, 128), (32, 64, 128), (32,))
        tables = {
            cv: build_switching_table(
                variants,
                profiles,
                SwitchingConfig(**{**base.to_dict(), "rates_qps": base.rates_qps, "cv": cv}),
            )
            for cv in cvs
        }
        top = max(
            (o for o in tables[1.0].options if o.variant == "f300"),
            key=lambda o: o.replicas * profiles.throughput("f300", o.hardware, 1),
        )
        cap = top.replicas * profiles.throughput("f300", top.hardware, 1)
        factor = 1.5 * cap / peak_rate(raw, 10.0)
        trace = rescale_to_rate(raw, mean_rate(raw) * factor)
        interval = 1.0 / factor  # one second of the original trace, as in the paper
        cut = trace[0] + 0.25 * (trace[-1] - trace[0])
        tune, test = trace[trace < cut], trace[trace >= cut]
        best = None
        for cv, table in tables.items():
            for window in windows:
                cfg = SwitchingConfig(
                    **{
                        **base.to_dict(),
                        "rates_qps": base.rates_qps,
                        "cv": cv,
                        "rate_window": window,
                    }
                )
                r = switching_replay(
                    tune, table, cfg, profiles, interval_s=interval, warm_replicas=2
                )
                if best is None or r["controller"]["effective_accuracy"] > best[0]:
                    best = (r["controller"]["effective_accuracy"], cv, window, cfg)
        assert best is not None
        _, cv, window, cfg = best
        r = switching_replay(test, tables[cv], cfg, profiles, interval_s=interval, warm_replicas=2)
        c = r["controller"]
        best_fixed = max(v["effective_accuracy"] for v in r["fixed"].values())
        rows.append(
            (
                name,
                f"controller (cv {cv:g}, window {window})",
                c["effective_accuracy"],
                c["meet"],
                c["switches"],
            )
        )
        for k, v in sorted(r["fixed"].items(), key=lambda kv: -kv[1]["effective_accuracy"]):
            rows.append((name, k, v["effective_accuracy"], v["meet"], ""))
        res[name] = {
            "controller": c,
            "fixed": {
                k: {kk: vv for kk, vv in v.items() if kk != "option"} for k, v in r["fixed"].items()
            },
            "best_fixed": best_fixed,
            "cv": cv,
            "window": window,
            "rescale": factor,
            "test_queries": int(test.size),
        }
        if name == "conv":
            _plot_switching(out / "switching_conv.png", test, r["decisions"])
    text = _table(
        "4. Model switching (simulated replay, last 75% of each trace; deadline 50 ms, 2 cores;\n"
        "   one task queue, warm spares hold 2 replicas; meet tables from the estimator)\n"
        f"   variant accuracy on noisy digits: {', '.join(f'{k} {v:.3f}' for k, v in acc.items())}",
        ("trace", "policy", "effective acc", "deadline met", "switches"),
        rows,
    )
    text += (
        "\n   traces: Azure LLM inference 2023 (Patel et al., Splitwise, ISCA 2024; CC-BY 4.0, "
        "Azure Public Dataset)"
    )
    return text, {"switching": res}


def _plot_switching(path: Path, trace: np.ndarray, decisions: list[Any]) -> None:
    order = {"f300": 3, "f100": 2, "f30": 1, "f10": 0}

    def draw(ax: Any) -> None:
        t = trace - trace[0]
        bins = np.linspace(0, t[-1], 200)
        cnt, _ = np.histogram(t, bins)
        ax.plot(bins[1:], cnt / np.diff(bins), lw=0.8, label="arrival rate (q/s)")
        ax2 = ax.twinx()
        ts = [d[0] - trace[0] for d in decisions] + [t[-1]]
        vs = [order.get(d[1]["variant"], -1) for d in decisions]
        ax2.step(ts[:-1], vs, where="post", color="C3", label="variant")
        ax2.set_yticks(list(order.values()), list(order))
        ax.set_xlabel("s (rescaled trace)")
        ax.legend(loc="upper left", fontsize=7)

    _plot(path, draw)


# ---------------------------------------------------------------- 5


async def sec_personal(args: argparse.Namespace, out: Path) -> tuple[str, dict[str, Any]]:
    _, _, xte, yte = digits_data()
    users = {"plain": None, "mirrored": "flip", "inverted": "invert", "shifted": "shift:2"}
    specs = [_spec(f"lr-{u}", "logreg", train_distort=d) for u, d in users.items()]
    inputs = {u: distort(xte, d, args.seed) if d else xte for u, d in users.items()}
    preds = await served_predictions(specs, inputs)
    r = personalized(
        preds,
        dict.fromkeys(users, yte),
        n_queries=_size(args, 12000, 3000, 500),
        seed=args.seed,
    )
    rows = [(k, v) for k, v in sorted(r["error"].items(), key=lambda kv: kv[1])]
    per = [(u, d["exp4-per-user"], d["exp4-global"]) for u, d in r["per_user"].items()]
    text = (
        _table(
            "5. Personalized selection: 4 users (input distortions), 4 models (each trained on one)",
            ("policy / model", "error"),
            rows,
        )
        + "\n"
        + _table("   per user", ("user", "per-user Exp4", "global Exp4"), per)
    )
    return text, {"personal": r}


# ---------------------------------------------------------------- 6


def rafiki_members(seed: int = 0, mlp_iter: int = 1000) -> dict[tuple[int, ...], float]:
    """Majority-vote accuracy of every subset of three random-subspace digits classifiers
    (``mlp_iter``: the MLP's training iterations at most)."""
    import itertools
    import warnings

    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.svm import SVC

    xtr, ytr, xte, yte = digits_data(seed)
    perm = np.random.default_rng(seed).permutation(64)
    subs = [perm[i * 20 : (i + 1) * 20] for i in range(3)]
    ms = [
        LogisticRegression(max_iter=2000),
        MLPClassifier((64,), max_iter=mlp_iter, random_state=seed),
        SVC(),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        P = [
            m.fit(xtr[:, s] / 16, ytr).predict(xte[:, s] / 16)
            for m, s in zip(ms, subs, strict=True)
        ]
    acc1 = [float(np.mean(p == yte)) for p in P]
    out = {}
    for r in (1, 2, 3):
        for sub in itertools.combinations(range(3), r):
            right = 0
            for i in range(len(yte)):
                votes: dict[int, int] = {}
                for m in sub:
                    votes[int(P[m][i])] = votes.get(int(P[m][i]), 0) + 1
                top = max(votes.values())
                tied = [lab for lab, c in votes.items() if c == top]
                # a tie goes to the most accurate member among those voting for a tied label
                m = max((m for m in sub if int(P[m][i]) in tied), key=lambda m: acc1[m])
                right += int(P[m][i]) == yte[i]
            out[sub] = right / len(yte)
    return out


RAFIKI_LAT = [
    {16: 0.07, 32: 0.12, 48: 0.17, 64: 0.23},
    {16: 0.11, 32: 0.19, 48: 0.27, 64: 0.37},
    {16: 0.15, 32: 0.26, 48: 0.37, 64: 0.50},
]


def sec_rafiki(args: argparse.Namespace, out: Path) -> tuple[str, dict[str, Any]]:
    # --smoke: the MLP trained 100 iterations, not to convergence (~7 s of the section's ~30)
    acc = rafiki_members(args.seed, _size(args, 1000, 1000, 100))
    cfg = RafikiConfig((16, 32, 48, 64), tau_s=1.0)
    period = _size(args, 500.0, 500.0, 100.0)
    r_l = min(64 / lat[64] for lat in RAFIKI_LAT)  # all models synchronously
    r_u = sum(64 / lat[64] for lat in RAFIKI_LAT)  # one model per batch
    rows, res = [], {}
    for name, r_ref in (("r_l", r_l), ("r_u", r_u)):

        def env(seed: int, phase: bool = False, r_ref: float = r_ref) -> EnsembleEnv:
            start = float(np.random.default_rng(seed + 7).uniform(0, period)) if phase else 0.0
            arr = sine_arrivals(r_ref, 1.0, period, np.random.default_rng(seed), start_s=start)
            return EnsembleEnv(RAFIKI_LAT, acc, cfg, arr)

        test, val = env(args.seed), env(args.seed + 1)
        agent = RafikiAgent(
            test.state_dim, len(test.actions), seed=args.seed, n_envs=16 if name == "r_u" else 8
        )
        t0 = time.perf_counter()
        log = agent.train(
            lambda i, env=env: env(1000 + i, True),
            updates=args.rafiki_updates,
            validate=val,
            validate_every=min(25, args.rafiki_updates),
        )
        train_s = time.perf_counter() - t0
        runs = {
            "RL": agent.run(test, greedy=True),
            "sync": run_baseline(test, "sync"),
            "async": run_baseline(test, "async"),
        }
        res[name] = {"r_ref": r_ref, "train_s": train_s, "best_update": log.best_update}
        for pol, st in runs.items():
            rate = np.array([sine_rate(r_ref, t, period) for t, *_ in st.timeline])
            m = np.array([k for *_, k in st.timeline], dtype=float)
            # low / high: the lowest and the top third of the sine's range (the median split
            # put most of the rising and falling flanks into both)
            span = (rate.max() - rate.min()) / 3 if m.size else 0.0
            hi = float(m[rate >= rate.max() - span].mean()) if m.size else 0.0
            lo = float(m[rate <= rate.min() + span].mean()) if m.size else 0.0
            s = st.summary()
            res[name][pol] = {**s, "models_high_rate": hi, "models_low_rate": lo}
            rows.append(
                (
                    name,
                    f"{r_ref:.0f}",
                    pol,
                    s["accuracy"],
                    s["overdue_fraction"],
                    lo,
                    hi,
                    s["reward"],
                )
            )
        if name == "r_l":
            _plot_rafiki(out / "rafiki_rl.png", runs, r_ref, period)
    text = _table(
        "6. Rafiki (simulation): subset accuracies "
        + ", ".join(f"{''.join(str(i) for i in k)}={v:.3f}" for k, v in acc.items())
        + f"; {args.rafiki_updates} updates",
        (
            "rate",
            "r_ref",
            "policy",
            "accuracy",
            "overdue",
            "models/batch low",
            "models/batch high",
            "reward (Eq. 7)",
        ),
        rows,
    )
    return text, {"rafiki": res}


def _plot_rafiki(path: Path, runs: dict[str, Any], r_ref: float, period: float) -> None:
    def draw(ax: Any) -> None:
        ts = np.linspace(0, period, 200)
        ax.plot(ts, [sine_rate(r_ref, t, period) for t in ts], color="0.6", label="rate (q/s)")
        ax2 = ax.twinx()
        for pol, st in runs.items():
            tl = np.array([(t, k) for t, *_, k in st.timeline])
            bins = np.linspace(0, period, 51)
            idx = np.digitize(tl[:, 0], bins)
            ax2.plot(
                bins[:-1],
                [tl[idx == i, 1].mean() if (idx == i).any() else np.nan for i in range(1, 51)],
                label=pol,
            )
        ax2.set_ylabel("models per batch")
        ax.set_xlabel("s")
        ax2.legend(fontsize=7)

    _plot(path, draw)


# ---------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    texts, data = [], {}
    for sec in args.sections:
        t0 = time.perf_counter()
        if sec == "failure":
            t, d = await sec_failure(args, out)
        elif sec == "confidence":
            continue  # reported with "failure" (same served predictions)
        elif sec == "stragglers":
            t, d = await sec_stragglers(args, out)
        elif sec == "switching":
            t, d = await sec_switching(args, out)
        elif sec == "personal":
            t, d = await sec_personal(args, out)
        else:
            t, d = sec_rafiki(args, out)
        texts.append(f"{t}\n   ({time.perf_counter() - t0:.0f} s)")
        data.update(d)
        print(texts[-1] + "\n", flush=True)
    return "\n\n".join(texts), data


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller streams and training (CI-sized)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="every section, tiny: short streams, small forests, 10 Rafiki updates (seconds)",
    )
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {SECTIONS}")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the query streams, noise and learners (default %(default)s)",
    )
    p.add_argument(
        "--rafiki-updates",
        type=int,
        default=None,
        help="training updates of the Rafiki agent (default 500; 150 with --quick)",
    )
    p.add_argument(
        "--live-queries",
        type=int,
        default=None,
        help="length of the live failure run; the failure spans its 2nd quarter "
        "(default 1000; 200 with --quick)",
    )
    p.add_argument(
        "--out", default="out/selection", help="folder for the plots (default %(default)s)"
    )
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    args.sections = [s for s in args.sections.split(",") if s]
    bad = sorted(set(args.sections) - set(SECTIONS))
    if bad:
        p.error(f"unknown sections {bad}; choose from {SECTIONS}")
    args.quick |= args.smoke
    if args.rafiki_updates is None:
        args.rafiki_updates = _size(args, 500, 150, 10)
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    _, data = asyncio.run(run(args))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1, default=str))
    print(
        "command: .venv/bin/python benchmarks/selection.py "
        + " ".join(shlex.quote(a) for a in argv)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
