"""What the three ``inferline export`` writers share: the models a plan exports, their hardware
kind, the batch wait in microseconds, the header every written file starts with, and the
result (files written, notes for the operator)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inferline.core import DEFAULT_CATALOG, HardwareCatalog, ModelConfig, Plan, ValidationError
from inferline.deploy._planned import planned_models

__all__ = [
    "ExportResult",
    "exported_models",
    "header_lines",
    "is_gpu",
    "micros",
]


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote (every file, in the order written) and what the operator should
    know about it (fields a plan cannot fill, models left out), one line each."""

    target: str
    written: tuple[Path, ...]
    notes: tuple[str, ...] = ()


def exported_models(plan: Plan) -> tuple[dict[str, ModelConfig], list[str]]:
    """The plan's configurations by the model that serves them (a variant stage by its chosen
    variant, as ``inferline deploy`` loads them), and a note per model left out: an idle
    variant (0 replicas) is not served, and no serving system here takes 0 instances (Ray
    Serve refuses ``num_replicas: 0``, Triton would start one)."""
    models: dict[str, ModelConfig] = {}
    notes = []
    for name, cfg in planned_models(plan).items():
        if cfg.replicas < 1:
            notes.append(f"{name}: 0 replicas in the plan (an idle variant): not exported")
        else:
            models[name] = cfg
    if not models:
        raise ValidationError("plan.models", "a model with at least one replica", "none")
    return models, notes


def is_gpu(name: str, cfg: ModelConfig, catalog: HardwareCatalog = DEFAULT_CATALOG) -> bool:
    """Whether the model's planned hardware is a GPU kind. The catalog decides: a plan's
    hardware names are the catalog's, and guessing from a name would export a GPU plan onto
    CPUs without a word."""
    if cfg.hardware not in catalog:
        raise ValidationError(
            f"models.{name}.hardware",
            f"a hardware kind of the catalog {catalog.names()!r} (--hardware adds kinds)",
            cfg.hardware,
        )
    return catalog[cfg.hardware].kind == "gpu"


def micros(cfg: ModelConfig) -> int:
    """The planned batch wait in whole microseconds (Triton's and TF Serving's unit)."""
    return round(cfg.batch_wait_ms * 1000)


def header_lines(plan: Plan, target: str, origin: str | None) -> list[str]:
    """The first lines of every written file (without the comment marker): where it came from,
    so a reviewer of the git diff knows which plan to re-export from."""
    src = f" {origin}" if origin else " a plan"
    return [
        f"Written by `inferline export --to {target}` from{src}: pipeline {plan.pipeline!r}, "
        f"SLO {plan.slo_s * 1e3:g} ms at P{plan.percentile:g}, strategy {plan.strategy!r}.",
        "Re-export after re-planning rather than editing the planned fields by hand.",
    ]
