"""Model-Switching in ``inferline serve`` (``--switching model-switching --switching-config F``).

The switching file (format ``inferline.switching/1``) names one app, the stage its pipeline
calls, the deployment models that are variants of that stage with their measured accuracy, and
the profiles the effective-accuracy table is estimated from::

    {"format": "inferline.switching/1", "app": "digits", "stage": "f300",
     "variants": [{"name": "f300", "accuracy": 0.91}, {"name": "f10", "accuracy": 0.80}],
     "profiles": "profiles.json", "core_budget": 2, "held_out": "held_out.npz"}

``held_out`` (optional, relative to the file): a held-out set (``.npz`` with arrays ``x`` and
``y``, or JSON ``{"inputs", "labels"}``) that each variant answers through the server at start;
the measured accuracy replaces the declared one (which stays the fallback without a set).
``rebuild_s`` (default 10, 0: off), ``rebuild_window_s`` (default: the drift loop's window),
``rebuild_min_batches`` and ``rebuild_threshold``: the table is rebuilt from live service times
and the measured arrival rate (``TableKeeper``); ``GET /admin/switching`` shows it.
``rebuild_unobserved`` (default ``"common"``): a variant without enough live batches (a warm
spare) is scaled by the observed variants' common factor (a load slows all CPU variants
alike); ``"keep"``: it keeps its own last factor.
``queue`` (default ``"shared"``): the variants share the stage's one EDF queue and the variant
is chosen when a batch is cut (``Dispatcher.share``), so at a switch the queued queries go to
the new variant; ``"per_variant"``: each variant its own queue (queries queued at a switch
finish on the old variant).

At start the server builds the table (``build_switching_table``, off the event loop), keeps
every variant deployed (the active one with the chosen replicas x threads split, the others
warm), routes the stage to the active variant and runs ``LiveSwitcher``'s controller loop on
the arrivals of the app. Queries answer as the app's pipeline does; the switch events are
logged, exported to ``/metrics`` (``inferline_switching_switches_total``,
``inferline_switching_active{app,variant}``) and listed by ``LiveSwitcher.events``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from inferline.core import NotFoundError, ValidationError, load_json, load_profiles
from inferline.deploy._drift import drift_monitor
from inferline.deploy._drift_policy import DriftConfig
from inferline.deploy._switching import LiveSwitcher
from inferline.deploy._switching_table import TableKeeper, load_held_out, score_held_out
from inferline.selection import (
    SwitchingConfig,
    TableRebuildConfig,
    TableRebuildPolicy,
    Variant,
    build_switching_table,
)

__all__ = ["FORMAT", "ServeSwitching", "launch_switching", "load_switching"]

log = logging.getLogger(__name__)

FORMAT = "inferline.switching/1"
QUEUES = ("shared", "per_variant")  # the stage's one queue, or one queue per variant


@dataclass(frozen=True)
class ServeSwitching:
    """What ``--switching-config`` holds (see the module docstring). ``deadline_s`` defaults
    to the app's SLO; ``profiles`` is a path (relative to the file) of a profiles JSON whose
    hardware names are ``cpu`` / ``cpu-tT`` (T threads)."""

    app: str
    stage: str
    variants: tuple[Variant, ...]
    profiles: str
    core_budget: int = 1
    deadline_s: float | None = None
    rate_window: int = 32
    cv: float = 1.0
    rule: str = "effective"
    interval_s: float = 0.25
    min_dwell_s: float = 1.0
    warm_replicas: int = 1
    max_batch_size: int = 1
    sim_queries: int = 2000
    held_out: str | None = None
    rebuild_s: float = 10.0
    rebuild_window_s: float | None = None
    rebuild_min_batches: int = 10
    rebuild_threshold: float = 0.1
    rebuild_unobserved: str = "common"
    queue: str = "shared"

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValidationError("switching.variants", "at least one variant", [])
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValidationError("switching.variants", "distinct variant names", names)
        if self.stage not in names:
            raise ValidationError("switching.stage", f"one of the variants {names}", self.stage)
        if self.interval_s <= 0:
            raise ValidationError("switching.interval_s", "a number > 0", self.interval_s)
        if self.min_dwell_s < 0:
            raise ValidationError("switching.min_dwell_s", "a number >= 0", self.min_dwell_s)
        if self.queue not in QUEUES:
            raise ValidationError("switching.queue", f"one of {list(QUEUES)}", self.queue)
        # the controller's own checks (core budget, rule, window, deadline) with field names
        self.controller_config(self.deadline_s or 1.0)
        self.rebuild_config()

    def rebuild_config(self, drift_window_s: float | None = None) -> TableRebuildConfig:
        """The live table's settings; the window defaults to the drift loop's."""
        window = self.rebuild_window_s or drift_window_s or DriftConfig().window_s
        return TableRebuildConfig(
            self.rebuild_s,
            window,
            self.rebuild_min_batches,
            self.rebuild_threshold,
            self.rebuild_unobserved,
        )

    def controller_config(self, slo_s: float) -> SwitchingConfig:
        try:
            return SwitchingConfig(
                deadline_s=self.deadline_s or slo_s,
                core_budget=self.core_budget,
                rate_window=self.rate_window,
                cv=self.cv,
                sim_queries=self.sim_queries,
                rule=self.rule,
                max_batch_size=self.max_batch_size,
            )
        except ValidationError as e:
            raise ValidationError(f"switching.{e.field}", e.expected, e.got) from None

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["variants"] = [{"name": v.name, "accuracy": v.accuracy} for v in self.variants]
        return {"format": FORMAT, **d}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ServeSwitching:
        if not isinstance(d, Mapping):
            raise ValidationError("switching", "a JSON object", type(d).__name__)
        d = dict(d)
        fmt = d.pop("format", FORMAT)
        if fmt != FORMAT:
            raise ValidationError("switching.format", repr(FORMAT), fmt)
        known = {f.name for f in fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise ValidationError("switching", f"only the fields {sorted(known)}", extra)
        for k in ("app", "stage", "variants", "profiles"):
            if k not in d:
                raise ValidationError(f"switching.{k}", "present", None)
        raw = d["variants"]
        if not isinstance(raw, list):
            raise ValidationError("switching.variants", "a list of {name, accuracy}", raw)
        vs = []
        for i, v in enumerate(raw):
            if not isinstance(v, Mapping) or set(v) != {"name", "accuracy"}:
                raise ValidationError(f"switching.variants[{i}]", "{name, accuracy}", v)
            try:
                vs.append(Variant(str(v["name"]), float(v["accuracy"])))
            except (TypeError, ValueError):
                raise ValidationError(
                    f"switching.variants[{i}].accuracy", "a number in [0, 1]", v["accuracy"]
                ) from None
            except ValidationError as e:
                raise ValidationError(
                    f"switching.variants[{i}].accuracy", e.expected, e.got
                ) from None
        d["variants"] = tuple(vs)
        return cls(**d)


def load_switching(path: str | Path) -> ServeSwitching:
    """Read a switching file; a relative ``profiles`` path is taken from the file's folder."""
    cfg = ServeSwitching.from_dict(load_json(path))
    prof = Path(cfg.profiles)
    if not prof.is_absolute():
        prof = Path(path).resolve().parent / prof
    load_profiles(prof)  # fails here, naming the file, before anything starts
    held = cfg.held_out
    if held is not None:
        held_p = Path(held)
        held = str(held_p if held_p.is_absolute() else Path(path).resolve().parent / held_p)
        load_held_out(held)  # the same: a bad set fails before anything starts
    return ServeSwitching(**{**cfg.__dict__, "profiles": str(prof), "held_out": held})


async def launch_switching(
    service: Any, backend: Any, dispatcher: Any, specs: Mapping[str, Any], cfg: ServeSwitching
) -> LiveSwitcher:
    """Start switching ``cfg.app`` of a started service (models deployed, apps added)."""
    if cfg.app not in service.apps:
        raise NotFoundError("app", cfg.app, sorted(service.apps))
    missing = [v.name for v in cfg.variants if v.name not in specs]
    if missing:
        raise ValidationError(
            "switching.variants", f"models of the deployment {sorted(specs)}", missing
        )
    slo = service.app(cfg.app).slo_s
    config = cfg.controller_config(slo)
    profiles = load_profiles(cfg.profiles)
    variants, source = await _accuracies(cfg, backend, dispatcher)
    table = await asyncio.to_thread(build_switching_table, variants, profiles, config)
    if cfg.queue == "shared":  # after the held-out scoring: that one asks each variant
        try:
            dispatcher.share(cfg.stage, [v.name for v in cfg.variants])
        except ValidationError as e:
            raise ValidationError(
                "switching.queue", f"'shared' needs {e.field}: {e.expected}", e.got
            ) from None
    sw = LiveSwitcher(
        backend,
        dispatcher,
        {v.name: specs[v.name] for v in cfg.variants},
        table,
        config,
        stage=cfg.stage,
        warm_replicas=cfg.warm_replicas,
        interval_s=cfg.interval_s,
        min_dwell_s=cfg.min_dwell_s,
    )
    await sw.adopt()
    sw.attach(service, cfg.app)
    _keep_table(service, dispatcher, sw, cfg, profiles, variants, source)
    log.info(
        "model switching on app %r (stage %r, %s queue): variants %s, %d options, "
        "deadline %.0f ms, starts on %s",
        cfg.app,
        cfg.stage,
        "one shared" if cfg.queue == "shared" else "per-variant",
        {v.name: f"{v.accuracy:.4f} ({source[v.name]})" for v in variants},
        len(table.options),
        config.deadline_s * 1e3,
        sw.active,
    )
    return sw


async def _accuracies(
    cfg: ServeSwitching, backend: Any, dispatcher: Any
) -> tuple[tuple[Variant, ...], dict[str, str]]:
    """The variants with accuracy measured on the held-out set (when the file names one), and
    where each accuracy came from ("measured on N held-out queries" or "declared")."""
    if cfg.held_out is None:
        return cfg.variants, {v.name: "declared" for v in cfg.variants}
    xs, ys = load_held_out(cfg.held_out)
    acc = await score_held_out(dispatcher, backend, [v.name for v in cfg.variants], xs, ys)
    log.info(
        "model switching: accuracy on %d held-out queries %s (declared %s)",
        len(ys),
        {v: round(a, 4) for v, a in acc.items()},
        {v.name: v.accuracy for v in cfg.variants},
    )
    measured = tuple(Variant(v.name, acc[v.name]) for v in cfg.variants)
    return measured, {v.name: f"measured on {len(ys)} held-out queries" for v in measured}


def _keep_table(
    service: Any,
    dispatcher: Any,
    sw: LiveSwitcher,
    cfg: ServeSwitching,
    profiles: Any,
    variants: tuple[Variant, ...],
    source: dict[str, str],
) -> TableKeeper:
    """Start rebuilding ``sw``'s table from live timings (``rebuild_s`` 0: shown, not rebuilt)."""

    def window_s() -> float:
        mon = drift_monitor(service)  # the drift loop starts after this: read it each time
        return cfg.rebuild_config(mon.config.window_s if mon is not None else None).window_s

    policy = TableRebuildPolicy(cfg.rebuild_config(), profiles)
    keeper = TableKeeper(
        sw, policy, variants, source, app=cfg.app, window_s=window_s, clock=dispatcher.clock
    )
    keeper.launch(service, dispatcher, max(0.25, min(cfg.rebuild_s / 4, 2.0)))
    return keeper
