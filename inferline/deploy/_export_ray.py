"""``inferline export --to ray-serve``: a Ray Serve config file (``serve deploy FILE``).

One application (the plan's pipeline, its code at ``import_path``) with a deployment per
model, named after the model (the deployments in the application's code must carry these
names: the config overrides options of deployments it names). Per deployment:

- ``num_replicas``: the planned replicas;
- ``max_ongoing_requests``: the planned batch size, so a replica holds one batch at a time and
  the next forms from the requests waiting at the caller once it is free, as the plan assumed
  (inferline's queue keeps one batch in flight per replica); Ray asks for at least the batch
  size, else a batch never fills;
- ``ray_actor_options``: one CPU, and one GPU for a model planned on GPU hardware;
- ``user_config``: ``max_batch_size`` and ``batch_wait_timeout_s``. ``@serve.batch`` takes
  both in code, not in the config, so the deployment applies them in its ``reconfigure``
  (``self.handler.set_max_batch_size(...)``, ``set_batch_wait_timeout_s(...)``; see
  ``docs/export.md``), which Ray calls with ``user_config`` at start and on every change.

Written as YAML (``.yaml``/``.yml``, with a header comment) or JSON (``.json``). The YAML is
emitted here (a small, fixed shape: no YAML library needed): every string is a JSON string,
which YAML reads the same, and every float keeps its decimal point (PyYAML, which Ray uses,
reads ``1e-05`` as a string).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferline.core import DEFAULT_CATALOG, HardwareCatalog, Plan, ValidationError
from inferline.deploy._export_common import ExportResult, exported_models, header_lines, is_gpu

__all__ = ["DEFAULT_IMPORT_PATH", "export_ray_serve", "serve_config", "to_yaml"]

DEFAULT_IMPORT_PATH = "app:app"
# Ray Serve's rule: module:attribute (one colon), or module.attribute
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*|\.[A-Za-z_]\w*)$")


def serve_config(
    plan: Plan,
    *,
    import_path: str = DEFAULT_IMPORT_PATH,
    catalog: HardwareCatalog = DEFAULT_CATALOG,
) -> dict[str, Any]:
    """The plan as a ``ServeDeploySchema`` document (``applications[].deployments[]``)."""
    if not _IMPORT_PATH.match(import_path) or import_path.count(":") > 1:
        raise ValidationError(
            "--import-path", "MODULE:APP, the import path of the bound application", import_path
        )
    models, _ = exported_models(plan)
    deployments = []
    for name, cfg in models.items():
        actor: dict[str, Any] = {"num_cpus": 1}
        if is_gpu(name, cfg, catalog):
            actor["num_gpus"] = 1
        deployments.append(
            {
                "name": name,
                "num_replicas": cfg.replicas,
                "max_ongoing_requests": cfg.max_batch_size,
                "ray_actor_options": actor,
                "user_config": {
                    "max_batch_size": cfg.max_batch_size,
                    "batch_wait_timeout_s": cfg.batch_wait_s,
                },
            }
        )
    app = {"name": plan.pipeline, "route_prefix": "/", "import_path": import_path}
    return {"applications": [{**app, "deployments": deployments}]}


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        text = f"{v:.9f}".rstrip("0")  # never an exponent; nanoseconds are plenty
        return text + "0" if text.endswith(".") else text
    if isinstance(v, str):
        return json.dumps(v)
    raise ValidationError("ray-serve config", "strings, numbers and booleans", v)


def _emit(v: Any, indent: int) -> list[str]:
    pad = "  " * indent
    out: list[str] = []
    if isinstance(v, dict):
        for k, x in v.items():
            if isinstance(x, (dict, list)) and x:
                out.append(f"{pad}{k}:")
                out += _emit(x, indent + 1)
            elif isinstance(x, (dict, list)):
                out.append(f"{pad}{k}: {'{}' if isinstance(x, dict) else '[]'}")
            else:
                out.append(f"{pad}{k}: {_scalar(x)}")
    elif isinstance(v, list):
        for x in v:
            if isinstance(x, dict) and x:
                sub = _emit(x, indent + 1)  # "- " takes the place of one indent level
                out.append(f"{pad}- {sub[0].lstrip()}")
                out += sub[1:]
            else:
                out.append(f"{pad}- {_scalar(x)}")
    return out


def to_yaml(doc: dict[str, Any], comments: Sequence[str] = ()) -> str:
    """``doc`` (dicts, lists, strings, numbers) as block YAML, after ``comments``."""
    return "".join(f"# {c}\n" for c in comments) + "\n".join(_emit(doc, 0)) + "\n"


def export_ray_serve(
    plan: Plan,
    out: Path,
    *,
    import_path: str = DEFAULT_IMPORT_PATH,
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    origin: str | None = None,
) -> ExportResult:
    """Write the Serve config to ``out`` (YAML, or JSON for a ``.json`` name)."""
    suffix = out.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise ValidationError("--to ray-serve FILE", "a .yaml, .yml or .json file", str(out))
    doc = serve_config(plan, import_path=import_path, catalog=catalog)
    _, notes = exported_models(plan)
    notes.append(
        "each deployment applies user_config's max_batch_size and batch_wait_timeout_s to its "
        "@serve.batch method in reconfigure() (docs/export.md)"
    )
    if import_path == DEFAULT_IMPORT_PATH:
        notes.append(f"import_path is {DEFAULT_IMPORT_PATH!r}: pass --import-path MODULE:APP")
    if suffix == ".json":
        out.write_text(json.dumps(doc, indent=2) + "\n")
    else:
        comments = [
            *header_lines(plan, "ray-serve", origin),
            "Planned: num_replicas, max_ongoing_requests (= the batch size: one batch per "
            "replica), ray_actor_options,",
            "user_config (max_batch_size, batch_wait_timeout_s: applied to @serve.batch by the "
            "deployment's reconfigure()).",
        ]
        out.write_text(to_yaml(doc, comments))
    return ExportResult("ray-serve", (out,), tuple(notes))
