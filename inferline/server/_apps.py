"""The app registry: ``App`` (a handler, an SLO, a default output) and the apps by name."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from inferline.core import NotFoundError, ValidationError
from inferline.server._decode import InputSpec

__all__ = ["ON_PREDICTED_LATE", "App", "AppRegistry", "Handler", "check_on_predicted_late"]

Handler = Callable[[Any, float], Awaitable[Any]]

_NO_DEFAULT = object()


@dataclass
class App:
    """An application: a handler ``async (input, slo_s) -> output``, an SLO and a default.

    ``respond_by_slo``: answer with the default output as soon as the SLO has passed (Clipper's
    behaviour), instead of waiting for the late prediction. Benchmarks leave it off so they
    measure the real latency. ``max_wait_s`` bounds any query even then.

    ``on_predicted_late``: what a query refused by the queue's admission (``PredictedLate``:
    predicted to finish after its deadline) gets: ``"refuse"`` (the default; HTTP 429 with
    ``Retry-After``) or ``"default"`` (the default output, explained ``predicted_late``).
    """

    name: str
    handler: Handler
    slo_s: float
    default_output: Any = _NO_DEFAULT
    input_spec: InputSpec | None = None
    respond_by_slo: bool = False
    max_wait_s: float = 30.0
    max_batch_inputs: int = 256
    description: str = ""
    models: tuple[str, ...] = ()
    on_predicted_late: str = "refuse"

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValidationError("app name", "a non-empty name without '/'", self.name)
        if not self.slo_s > 0:
            raise ValidationError(f"apps.{self.name}.slo_s", "a number > 0", self.slo_s)
        check_on_predicted_late(self.on_predicted_late, self.has_default, self.name)

    @property
    def has_default(self) -> bool:
        return self.default_output is not _NO_DEFAULT

    @classmethod
    def from_pipeline(
        cls,
        name: str,
        pipeline: Callable[..., Awaitable[Any]],
        dispatcher: Any,
        slo_s: float,
        *,
        cache: Any = None,
        **kw: Any,
    ) -> App:
        """An app whose handler runs ``pipeline(x, ctx)`` through the queue's pipeline driver."""
        from inferline.queueing import PipelineRunner

        runner = PipelineRunner(dispatcher, pipeline, slo_s=slo_s, cache=cache)

        async def handler(x: Any, slo: float) -> Any:
            return await runner.run(x, slo_s=slo)

        return cls(name, handler, slo_s, **kw)


ON_PREDICTED_LATE = ("refuse", "default")


def check_on_predicted_late(value: object, has_default: bool, app: str) -> str:
    """``on_predicted_late`` checked: one of ``ON_PREDICTED_LATE``; ``"default"`` only with a
    default output. ``ValidationError`` names the field."""
    field = f"apps.{app}.on_predicted_late"
    if value not in ON_PREDICTED_LATE:
        raise ValidationError(field, f"one of {list(ON_PREDICTED_LATE)}", value)
    if value == "default" and not has_default:
        raise ValidationError(field, "'refuse' for an app without a default_output", value)
    return str(value)


class AppRegistry:
    """The apps of a service by name; ``apps`` is the live dict (routes list and look it up)."""

    def __init__(self) -> None:
        self.apps: dict[str, App] = {}

    def add(self, app: App) -> None:
        if app.name in self.apps:
            raise ValidationError("apps", "unique app names", app.name)
        self.apps[app.name] = app

    def get(self, name: str) -> App:
        try:
            return self.apps[name]
        except KeyError:
            raise NotFoundError("app", name, sorted(self.apps)) from None
