"""``inferline export``: a plan written as a serving system's own files, for operators who
deploy from git rather than through ``inferline deploy``.

One writer per target (``_export_triton``, ``_export_tfserving``, ``_export_ray``); each builds
and checks everything before it writes, so a refused plan leaves the output as it was. The
writers' modules load here only when used: Triton's needs ``tritonclient``.
"""

from __future__ import annotations

import os
from pathlib import Path

from inferline.core import DEFAULT_CATALOG, HardwareCatalog, Plan, ValidationError
from inferline.deploy._export_common import ExportResult

__all__ = ["EXPORT_TARGETS", "ExportResult", "export_plan"]

# target -> what its output path is
EXPORT_TARGETS = {"triton": "folder", "tfserving": "folder", "ray-serve": "file"}


def export_plan(
    plan: Plan,
    target: str,
    out: str | os.PathLike[str],
    *,
    repository: str | os.PathLike[str] | None = None,
    copy_models: bool = False,
    catalog: HardwareCatalog = DEFAULT_CATALOG,
    base_path: str = "/models",
    import_path: str | None = None,
    origin: str | None = None,
) -> ExportResult:
    """Write ``plan`` for ``target`` (one of ``EXPORT_TARGETS``) at ``out``.

    ``repository``: the operator's files the planned fields go into: Triton's model repository
    (a folder), or TF Serving's model config file; not for Ray Serve, whose config holds no
    field but the planned ones. ``copy_models`` (Triton): copy each model's files too.
    ``base_path`` (TF Serving without ``repository``): the folder holding the models.
    ``import_path`` (Ray Serve): the application's ``MODULE:APP``. ``origin``: the plan's file,
    named in each file's header.
    """
    if target not in EXPORT_TARGETS:
        raise ValidationError("--to", f"one of {', '.join(EXPORT_TARGETS)}", target)
    src = Path(repository) if repository is not None else None
    if copy_models and target != "triton":
        raise ValidationError("--copy-models", "--to triton (model folders)", target)
    if target == "triton":
        from inferline.deploy._export_triton import export_triton

        if src is not None and not src.is_dir():
            raise ValidationError("--repository", "a Triton model repository folder", str(src))
        return export_triton(
            plan,
            Path(out),
            repository=src,
            copy_models=copy_models,
            catalog=catalog,
            origin=origin,
        )
    if target == "tfserving":
        from inferline.deploy._export_tfserving import export_tfserving

        return export_tfserving(
            plan, Path(out), source=src, base_path=base_path, catalog=catalog, origin=origin
        )
    from inferline.deploy._export_ray import DEFAULT_IMPORT_PATH, export_ray_serve

    if src is not None:
        raise ValidationError(
            "--repository", "none for ray-serve (its config holds only planned fields)", str(src)
        )
    return export_ray_serve(
        plan,
        Path(out),
        import_path=import_path or DEFAULT_IMPORT_PATH,
        catalog=catalog,
        origin=origin,
    )
