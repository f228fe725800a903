"""The stage's one queue for the live tuner's variant switches (``variant_queue``).

With ``variant_queue: "shared"`` (the default) every variant stage of a plan made with
variants gets one EDF queue across its variants (``Dispatcher.share``, as Model-Switching
runs it: the variant is chosen when a batch is cut), so at a tuner switch the queries already
queued go to the new variant's replicas once the stage is routed to them; the old variant's
replicas finish the batch they have in flight and take no other. ``"per_variant"``: one queue
per variant, as before (queries queued at a switch finish on the old variant).

A stage whose variants cannot share a queue (different expiry settings, admission control on)
keeps one queue per variant, with a logged warning naming the field: the tuner's switching is
on by default, and a deployment with admission control must keep starting as it did.
"""

from __future__ import annotations

import logging
from typing import Any

from inferline.core import NotFoundError, Plan, ValidationError

__all__: list[str] = []  # private to the package

log = logging.getLogger(__name__)

VARIANT_QUEUES = ("shared", "per_variant")  # the stage's one queue, or one queue per variant


def check_variant_queue(value: Any, where: str = "variant_queue") -> str:
    """``value`` if it is one of ``VARIANT_QUEUES``; else a ``ValidationError`` naming ``where``."""
    if not isinstance(value, str) or value not in VARIANT_QUEUES:
        raise ValidationError(where, f"one of {list(VARIANT_QUEUES)}", value)
    return value


def share_variant_stages(dispatcher: Any, plan: Plan) -> dict[str, str]:
    """Give each variant stage of ``plan`` one queue across its variants; returns, by stage,
    ``"shared"`` or why it keeps one queue per variant. Stages already sharing (a re-plan)
    stay as they are; a stage with one variant has nothing to share."""
    if plan.variants is None:
        return {}
    already = dispatcher.shared
    out: dict[str, str] = {}
    for stage, models in plan.variants.stage_models().items():
        if stage in already:
            out[stage] = "shared"
            continue
        if len(models) < 2:
            continue
        try:
            dispatcher.share(stage, list(models))
        except ValidationError as e:
            out[stage] = f"{e.field}: expected {e.expected}, got {e.got!r}"
        except NotFoundError as e:
            out[stage] = str(e)
        else:
            out[stage] = "shared"
            log.info("tuner: stage %r has one queue across its variants %s", stage, list(models))
            continue
        log.warning(
            "tuner: stage %r keeps one queue per variant (variant_queue 'shared' needs %s); "
            "queries queued at a switch finish on the old variant",
            stage,
            out[stage],
        )
    return out
