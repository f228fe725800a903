"""``inferline export --to tfserving``: TF Serving's model config file and its batching
parameters, per model.

Written into ``DIR``:

- ``models.config``: the ``ModelServerConfig`` (``--model_config_file``). From the operator's
  own file (``source``), every entry is kept with its own text (version policies, labels,
  logging: the adapter's ``parse_text`` / ``format_text``, which the live adapter sends on
  every reload), and entries of models the plan does not configure stay too: TF Serving
  unloads a model missing from the list. Without it, one entry per model under ``base_path``.
- ``<model>/batching_params.pbtxt``: the model's ``BatchingParameters``, read by
  ``--enable_per_model_batching_parameters`` from the model's SavedModel folder (each version
  folder under its base path; copy it there). ``max_batch_size`` and ``batch_timeout_micros``
  are the plan's; ``num_batch_threads`` is its replicas (batches of the model that run at
  once); ``max_enqueued_batches`` bounds the queue at the batches the replicas finish within
  the SLO, when the plan has the tuner's throughput figures (a request queued behind more
  would miss the SLO anyway: TF Serving refuses it at once instead). ``allowed_batch_sizes``
  is left out: it pads every batch up to the next allowed size, a cost the plan's profiles did
  not measure.
- ``batching_parameters.txt``: the server's ``--batching_parameters_file``. With per-model
  parameters TF Serving takes only the batch thread pool from it, shared by every model: one
  thread per planned replica of all the models.

``BatchingParameters`` is not among the generated modules ``tensorflow-serving-api`` ships, so
its few wrapper fields (``max_batch_size { value: 8 }``) are written here; the tests parse them
with protobuf against the message's declared fields.
"""

from __future__ import annotations

import math
from pathlib import Path

from inferline.adapters.tfserving import ServedModel, batching_text, format_text, parse_text
from inferline.core import (
    DEFAULT_CATALOG,
    HardwareCatalog,
    ModelConfig,
    Plan,
    TFServingBatcher,
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

__all__ = [
    "BATCHING_PARAMS",
    "MODEL_CONFIG",
    "SERVER_BATCHING",
    "export_tfserving",
    "max_enqueued_batches",
]

MODEL_CONFIG = "models.config"
BATCHING_PARAMS = "batching_params.pbtxt"  # the name TF Serving looks for in a SavedModel
SERVER_BATCHING = "batching_parameters.txt"


def max_enqueued_batches(plan: Plan, name: str, cfg: ModelConfig) -> int | None:
    """Batches the model's replicas finish within the SLO, from the tuner's single-replica
    throughput at the planned batch (None without it: TF Serving's default then applies)."""
    t = plan.tuner
    if t is None:
        return None
    stage = name
    if plan.variants is not None:  # tuner figures are by stage; a variant serves its stage
        stage = next((s for s, v in plan.variants.choice.items() if v == name), name)
    tm = t.models.get(stage)
    if tm is None:
        return None
    per_s = tm.throughput_qps / cfg.max_batch_size * cfg.replicas
    return max(cfg.replicas, math.ceil(plan.slo_s * per_s))


def _wrapped(field: str, value: int) -> str:
    return f"{field} {{ value: {int(value)} }}\n"


def _model_batching(plan: Plan, name: str, cfg: ModelConfig, head: str) -> str:
    b = plan_server_batchers(plan).get(name)
    if isinstance(b, TFServingBatcher):  # a plan made for TF Serving's batcher: its settings
        return batching_text(b, head)  # the text `attach --steer` writes too
    text = head + (
        _wrapped("max_batch_size", cfg.max_batch_size)
        + _wrapped("batch_timeout_micros", micros(cfg))
        + _wrapped("num_batch_threads", cfg.replicas)
    )
    queue = max_enqueued_batches(plan, name, cfg)
    if queue is not None:
        text += _wrapped("max_enqueued_batches", queue)
    return text


def _entries(
    models: dict[str, ModelConfig], source: Path | None, base_path: str
) -> list[ServedModel]:
    if source is None:
        root = base_path.rstrip("/")
        return [ServedModel(m, f"{root}/{m}") for m in models]
    try:
        entries = parse_text(read_text(source))
    except ValidationError as e:
        raise ValidationError(f"{source}: {e.field}", e.expected, e.got) from None
    known = {e.name for e in entries}
    for m in models:
        if m not in known:
            raise ValidationError(
                f"plan.models.{m}", f"a model of {str(source)!r} {sorted(known)!r}", "none"
            )
    return entries


def _comment(lines: list[str]) -> str:
    return "".join(f"# {ln}\n" for ln in lines)


def export_tfserving(
    plan: Plan,
    out: Path,
    *,
    source: Path | None = None,
    base_path: str = "/models",
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    origin: str | None = None,
) -> ExportResult:
    """Write ``out/models.config``, ``out/batching_parameters.txt`` and
    ``out/<model>/batching_params.pbtxt``; everything is checked before the first write."""
    models, notes = exported_models(plan)
    gpus = sorted(m for m, c in models.items() if is_gpu(m, c, catalog))
    entries = _entries(models, source, base_path)
    head = header_lines(plan, "tfserving", origin)
    run = (
        "Serve with: tensorflow_model_server --model_config_file=models.config "
        "--enable_batching --enable_per_model_batching_parameters "
        "--batching_parameters_file=batching_parameters.txt"
    )
    kept = f"Entries as in {source}." if source is not None else f"Models under {base_path}."
    files = {
        out / MODEL_CONFIG: _comment([*head, kept, run]) + format_text(entries),
        out / SERVER_BATCHING: _comment(
            [*head, "The batch thread pool all models share: one thread per planned replica."]
        )
        + _wrapped("num_batch_threads", sum(c.replicas for c in models.values())),
    }
    for name, cfg in models.items():
        model_head = [
            *head,
            f"Copy into each version folder of {name} (TF Serving reads it from the SavedModel).",
            "num_batch_threads: the planned replicas; the server takes its pool from "
            f"{SERVER_BATCHING}.",
        ]
        files[out / name / BATCHING_PARAMS] = _model_batching(plan, name, cfg, _comment(model_head))
    planned = plan_server_batchers(plan)
    for name in (
        m for m in models if m not in planned and max_enqueued_batches(plan, m, models[m]) is None
    ):
        notes.append(f"{name}: no tuner throughput in the plan: max_enqueued_batches left out")
    if gpus:
        notes.append(f"{', '.join(gpus)}: planned on GPUs: serve with a GPU build of TF Serving")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return ExportResult("tfserving", tuple(files), tuple(notes))
