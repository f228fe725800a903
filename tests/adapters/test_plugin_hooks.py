"""The full hook set: selection policies, observers, hook validation, broken entry points."""

from __future__ import annotations

import random
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from inferline.adapters import DISABLED_ENV, HOOK_NAMES, PluginHost, hookimpl
from inferline.core import ModelConfig, NotFoundError, ValidationError


class RoundRobin:
    """A tiny selection policy a plugin might ship."""

    def __init__(self, models: list[str], rng: random.Random | None = None, start: int = 0) -> None:
        self.models = list(models)
        self.start = start
        self.rng = rng

    def init(self) -> int:
        return self.start

    def select(self, state: int, x: Any) -> list[str]:
        return [self.models[state % len(self.models)]]


class PolicyPlugin:
    @hookimpl
    def inferline_selection_policies(self) -> dict[str, Any]:
        return {"round-robin": RoundRobin}


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    @hookimpl
    def inferline_on_config_change(self, model: str, old: Any, new: Any, reason: str) -> None:
        self.events.append(("config", (model, old, new, reason)))

    @hookimpl
    def inferline_on_scaling_decision(self, model: str, replicas_after: int) -> None:
        # takes only some of the arguments: pluggy passes those by name
        self.events.append(("scale", (model, replicas_after)))


class Broken:
    @hookimpl
    def inferline_on_scaling_decision(self, model: str) -> None:
        raise RuntimeError("observer bug")


def test_selection_policies_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISABLED_ENV, raising=False)
    host = PluginHost()
    host.register(PolicyPlugin(), "policies")
    assert list(host.selection_policies()) == ["round-robin"]
    p = host.selection_policy("round-robin", ["a", "b"], rng=random.Random(1), start=1)
    assert isinstance(p, RoundRobin) and p.select(p.init(), None) == ["b"]
    with pytest.raises(NotFoundError, match="selection policy 'exp9'"):
        host.selection_policy("exp9", ["a"])

    class Clash:
        @hookimpl
        def inferline_selection_policies(self) -> dict[str, Any]:
            return {"round-robin": dict}

    host.register(Clash(), "clash")
    with pytest.raises(ValidationError, match="both offer it"):
        host.selection_policies()


def test_observers_get_their_arguments_and_errors_are_contained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    host = PluginHost()
    rec = Recorder()
    host.register(rec, "recorder")
    host.register(Broken(), "broken")
    old, new = ModelConfig("cpu", 4, 1), ModelConfig("cpu", 4, 3)
    assert host.notify_config("m", old, new, backend="local://", reason="plan applied") == 1
    # the broken observer raises; it is logged and the others still run
    assert host.notify_scaling("m", 1, 3, time_s=12.5, reason="envelope") == 1
    observe = host.scaling_observer("autoscale")
    assert observe("m", 3, 2, reason="idle") == 1
    assert rec.events == [
        ("config", ("m", old, new, "plan applied")),
        ("scale", ("m", 3)),
        ("scale", ("m", 2)),
    ]
    assert "observer bug" in caplog.text


def test_unknown_hook_name_is_refused() -> None:
    class Typo:
        @hookimpl
        def inferline_backend_scheme(self) -> dict[str, Any]:  # missing "s"
            return {}

    host = PluginHost()
    with pytest.raises(ValidationError, match="inferline_backend_scheme"):
        host.register(Typo(), "typo")
    assert "typo" not in host.plugin_names()


def test_hook_names_match_the_specs() -> None:
    from inferline.adapters import hookspecs

    specs = sorted(n for n in dir(hookspecs) if n.startswith("inferline_"))
    assert specs == sorted(HOOK_NAMES)


def _write_dist(root: Path, name: str, module_src: str, eps: str) -> None:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(module_src))
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(eps))


def test_broken_entry_point_is_recorded_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DISABLED_ENV, raising=False)
    _write_dist(
        tmp_path,
        "il_broken_plugin",
        "raise ImportError('needs a library that is not installed')\n",
        "[inferline]\nbrokenthing = il_broken_plugin\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    host = PluginHost()
    added = host.load_entrypoints()
    assert "local" in added and "brokenthing" not in added
    assert "needs a library" in host.failed()["brokenthing"]
    assert host.describe()["brokenthing"]["error"]
    with pytest.raises(NotFoundError, match="failed to load"):
        host.backend_for("brokenthing://x")
    sys.modules.pop("il_broken_plugin", None)
