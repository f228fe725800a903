"""``inferline export --to triton``: a ``config.pbtxt`` per model, with the plan's batch size,
instances and batcher.

The files are Triton's own ``ModelConfig`` messages (``tritonclient``'s generated
``model_config_pb2``), read and written with protobuf's text format: no hand-written parser
decides what an operator's config means. With the operator's repository (``repository``), each
model's config is read and only the planned fields change: ``max_batch_size``, the first
instance group's ``count`` and ``kind`` (other groups, its rate limiter, host policy and GPUs
kept, as the live adapter does), and ``dynamic_batching``'s ``max_queue_delay_microseconds``
and ``preferred_batch_size`` (its priority levels and queue policies kept). An ensemble of the
repository that uses an exported model is written too, its ``max_batch_size`` lowered to what
its steps now take (Triton refuses an ensemble allowing more than a step).

A planned batch wait maps onto Triton's batcher one to one: with ``preferred_batch_size`` the
planned maximum, a batch leaves when it is full or its oldest request has waited
``max_queue_delay_microseconds``, the plan's delayed batching (0: greedy).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from inferline.core import (
    DEFAULT_CATALOG,
    HardwareCatalog,
    ModelConfig,
    Plan,
    TritonBatcher,
    ValidationError,
    read_text,
)
from inferline.core.planning import plan_server_batchers
from inferline.deploy._export_common import (
    ExportResult,
    exported_models,
    header_lines,
    is_gpu,
    micros,
)

__all__ = ["export_triton", "model_config_module"]

CONFIG = "config.pbtxt"


def model_config_module() -> Any:
    """Triton's generated ``model_config_pb2``, shipped with ``tritonclient[grpc]``."""
    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as e:
        raise ValidationError(
            "--to triton",
            "the package tritonclient[grpc] installed (extra 'triton': its model_config_pb2 "
            "reads and writes config.pbtxt)",
            str(e),
        ) from None
    return model_config_pb2


def _parse(mc: Any, path: Path) -> Any:
    from google.protobuf import text_format

    msg = mc.ModelConfig()
    try:
        text_format.Parse(read_text(path), msg)
    except text_format.ParseError as e:
        raise ValidationError(
            str(path), "a Triton model configuration in text format", str(e)
        ) from None
    return msg


def _source(mc: Any, repository: Path, name: str) -> Any:
    path = repository / name / CONFIG
    if not path.is_file():
        raise ValidationError(
            f"plan.models.{name}",
            f"a model of the repository {str(repository)!r} (a file {name}/{CONFIG})",
            "no such model",
        )
    return _parse(mc, path)


def _instances(group: Any, mc: Any) -> int:
    """A group's instances: ``count`` (unset: 1), per listed GPU for ``KIND_GPU``."""
    n = max(1, int(group.count))
    if group.kind == mc.ModelInstanceGroup.KIND_GPU:
        return n * max(1, len(group.gpus))
    return n


def _set_instances(mc: Any, c: Any, where: str, replicas: int, gpu: bool) -> None:
    """``replicas`` instances in all, of the planned kind. Only the first group changes (the
    operator's other groups, e.g. a pinned GPU instance, are theirs): it gets what the others
    do not hold."""
    if not c.instance_group:
        c.instance_group.add()
    first = c.instance_group[0]
    held = sum(_instances(g, mc) for g in c.instance_group[1:])
    mine = replicas - held
    if mine < 1:
        raise ValidationError(
            f"{where}.replicas",
            f"more than {held}: the model's other instance groups hold {held} instance(s) and "
            "export sets the first group's count only",
            replicas,
        )
    kind = mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU
    if first.kind != kind:
        first.kind = kind
        del first.gpus[:]  # GPU ids mean nothing to a CPU group; a new GPU group uses them all
    per_gpu = len(first.gpus) if gpu else 0
    if per_gpu > 1 and mine % per_gpu:
        raise ValidationError(
            f"{where}.replicas",
            f"{held} + a multiple of {per_gpu}: the first instance group is KIND_GPU on "
            f"{per_gpu} GPUs and its count is per GPU",
            replicas,
        )
    first.count = mine // max(1, per_gpu)


def _set_batcher(
    c: Any, name: str, cfg: ModelConfig, notes: list[str], batcher: Any = None
) -> None:
    """The planned batch wait as Triton's dynamic batcher, unless the model schedules
    otherwise (a sequence batcher for a stateful model: replacing it would break the model).
    A plan made for Triton's batcher (``inferline plan --server triton``) gives its own
    preferred sizes, queue delay and queue timeout (REJECT, overridable per request)."""
    choice = c.WhichOneof("scheduling_choice")
    if choice in ("sequence_batching", "ensemble_scheduling"):
        notes.append(f"{name}: {choice} kept, so the planned batch wait is not applied")
        return
    if c.max_batch_size == 0:  # no batch dimension: nothing for a batcher to form
        return
    db = c.dynamic_batching
    del db.preferred_batch_size[:]
    if isinstance(batcher, TritonBatcher):
        db.max_queue_delay_microseconds = batcher.max_queue_delay_microseconds
        db.preferred_batch_size.extend(batcher.preferred_batch_size or (c.max_batch_size,))
        if batcher.default_timeout_microseconds > 0:
            q = db.default_queue_policy
            q.timeout_action = q.REJECT
            q.default_timeout_microseconds = batcher.default_timeout_microseconds
            q.allow_timeout_override = True
        return
    db.max_queue_delay_microseconds = micros(cfg)
    db.preferred_batch_size.append(c.max_batch_size)


def _planned(
    mc: Any,
    c: Any,
    name: str,
    cfg: ModelConfig,
    gpu: bool,
    from_repo: bool,
    notes: list[str],
    batcher: Any = None,
) -> None:
    where = f"plan.models.{name}"
    if from_repo and c.max_batch_size == 0 and cfg.max_batch_size > 1:
        raise ValidationError(
            f"{where}.max_batch_size",
            f"1: the repository's {name}/{CONFIG} has max_batch_size 0 (the model takes no "
            "batch dimension)",
            cfg.max_batch_size,
        )
    if not from_repo or c.max_batch_size > 0:
        c.max_batch_size = cfg.max_batch_size
    _set_instances(mc, c, where, cfg.replicas, gpu)
    _set_batcher(c, name, cfg, notes, batcher)


def _ensembles(
    mc: Any, repository: Path, configs: dict[str, Any], notes: list[str]
) -> dict[str, Any]:
    """The repository's ensembles that use an exported model, each allowing no larger a batch
    than its exported steps now take."""
    out: dict[str, Any] = {}
    for path in sorted(repository.glob(f"*/{CONFIG}")):
        name = path.parent.name
        if name in configs or "ensemble" not in path.read_text(errors="replace"):
            continue
        c = _parse(mc, path)
        steps = [s.model_name for s in c.ensemble_scheduling.step]
        if c.platform != "ensemble" or not set(steps) & set(configs):
            continue
        missing = sorted(set(steps) - set(configs))
        if missing:
            notes.append(f"{name}: also uses {missing}, not in the plan: copy their configs")
        sizes = [configs[s].max_batch_size for s in steps if s in configs]
        if c.max_batch_size > 0 and any(sizes):
            c.max_batch_size = min([c.max_batch_size, *(b for b in sizes if b > 0)])
        out[name] = c
    return out


def _header(plan: Plan, origin: str | None, source: Path | None) -> str:
    lines = header_lines(plan, "triton", origin)
    lines.append(
        "Planned: max_batch_size, instance_group (first group: count, kind), dynamic_batching "
        "(max_queue_delay_microseconds, preferred_batch_size)."
    )
    if source is not None:
        lines.append(f"Every other field is as in {source} (its comments are not carried over).")
    else:
        lines += [
            "Planned fields only: a plan does not know the model's backend, inputs or outputs.",
            "Add them, or export with --repository SRC to start from the model's own config.",
        ]
    lines.append(
        "KIND_GPU without gpus: Triton starts count instances on each visible GPU; list gpus "
        "for a server with several."
    )
    return "".join(f"# {ln}\n" for ln in lines)


def _copy_model(src: Path, dst: Path) -> None:
    """The model's files (versions, weights), not its config: the exported one replaces it."""
    shutil.copytree(
        src, dst, dirs_exist_ok=True, ignore=lambda d, names: [CONFIG] if d == str(src) else []
    )


def export_triton(
    plan: Plan,
    out: Path,
    *,
    repository: Path | None = None,
    copy_models: bool = False,
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    origin: str | None = None,
) -> ExportResult:
    """Write ``out/<model>/config.pbtxt`` for each exported model (and ensemble). Every
    config is built and checked before the first file is written, so a refused plan leaves
    ``out`` as it was."""
    from google.protobuf import text_format

    if copy_models and repository is None:
        raise ValidationError("--copy-models", "--repository SRC to copy the models from", None)
    mc = model_config_module()
    models, notes = exported_models(plan)
    batchers = plan_server_batchers(plan)
    configs: dict[str, Any] = {}
    for name, cfg in models.items():
        c = _source(mc, repository, name) if repository is not None else mc.ModelConfig(name=name)
        gpu = is_gpu(name, cfg, catalog)
        _planned(mc, c, name, cfg, gpu, repository is not None, notes, batchers.get(name))
        configs[name] = c
    ensembles = _ensembles(mc, repository, configs, notes) if repository is not None else {}
    written = []
    for name, c in {**configs, **ensembles}.items():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        src = repository / name / CONFIG if repository is not None else None
        if copy_models and repository is not None:
            _copy_model(repository / name, d)
        body = text_format.MessageToString(c, as_utf8=True)
        (d / CONFIG).write_text(_header(plan, origin, src) + body)
        written.append(d / CONFIG)
    if repository is None:
        notes.append("planned fields only: add each model's backend, inputs and outputs")
    return ExportResult("triton", tuple(written), tuple(notes))
