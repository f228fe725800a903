"""The minimal plugin host: entry points, disabling, schemes, hardware kinds."""

from __future__ import annotations

import os
from typing import Any

import pytest

from inferline.adapters import DISABLED_ENV, PluginHost, hookimpl
from inferline.adapters.local import LocalBackend
from inferline.core import DEFAULT_CATALOG, Hardware, NotFoundError, ValidationError

BUILTINS = ["local", "ray", "tfserving", "triton"]  # the built-in adapters' entry points


class FakeBackendPlugin:
    """A fake third-party plugin: its 'backend' is only a marker object (no server exists)."""

    def __init__(self, scheme: str = "fake") -> None:
        self.scheme = scheme
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @hookimpl
    def inferline_backend_schemes(self) -> dict[str, Any]:
        def factory(url: str, options: dict[str, Any]) -> Any:
            self.calls.append((url, options))
            return ("fake-backend", url)

        return {self.scheme: factory}

    @hookimpl
    def inferline_hardware_kinds(self) -> dict[str, Hardware]:
        return {"gpu-a100": Hardware("gpu", 4.1)}


def test_entry_point_registers_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISABLED_ENV, raising=False)
    host = PluginHost()
    assert host.schemes() == []
    first = host.load_entrypoints()
    assert set(BUILTINS) <= set(first)  # other subsystems may register more (selection)
    assert host.load_entrypoints() == []  # repeatable: nothing registered twice
    assert "local" in host.schemes() and host.plugin_names() == first
    b = host.backend_for("local://?oversubscribe=1&cores=" + str(min(os.sched_getaffinity(0))))
    assert isinstance(b, LocalBackend) and b.oversubscribe and b.inventory()["cpu"] == 1
    b2 = host.backend_for("LOCAL://", gpus=["3"], gpu_kind="gpu-k80")
    assert isinstance(b2, LocalBackend) and b2.inventory()["gpu-k80"] == 1
    with pytest.raises(ValidationError, match="bogus"):
        host.backend_for("local://?bogus=1")


def test_disabled_plugins_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DISABLED_ENV, "other, local, triton, tfserving, ray")
    host = PluginHost.default()
    assert host.schemes() == [] and "local" not in host.plugin_names()
    with pytest.raises(NotFoundError) as ei:
        host.backend_for("local://")
    assert ei.value.kind == "backend scheme" and ei.value.name == "local"
    assert host.register(FakeBackendPlugin(), "other") is None  # blocked by name too
    assert host.schemes() == []


def test_disabling_after_loading_unregisters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISABLED_ENV, raising=False)
    host = PluginHost.default()
    assert "local" in host.schemes()
    monkeypatch.setenv(DISABLED_ENV, "local")
    host.load_entrypoints()
    assert "local" not in host.schemes() and "triton" in host.schemes()


def test_unknown_scheme_and_bad_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISABLED_ENV, raising=False)
    host = PluginHost.default()
    with pytest.raises(NotFoundError, match=r"unknown backend scheme 'nosuch' \(known: \['local'"):
        host.backend_for("nosuch://localhost:8001")
    with pytest.raises(ValidationError, match="backend url"):
        host.backend_for("localhost:8001")


def test_registered_plugin_backends_and_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISABLED_ENV, raising=False)
    host = PluginHost.default()
    plugin = FakeBackendPlugin()
    assert host.register(plugin, "fakeplugin") == "fakeplugin"
    assert {"fake", "local"} <= set(host.schemes())
    assert host.backend_for("fake://h:1", retries=2) == ("fake-backend", "fake://h:1")
    assert plugin.calls == [("fake://h:1", {"retries": 2})]
    cat = host.hardware_catalog()
    assert cat["gpu-a100"].cost_per_hour == 4.1 and "cpu" in cat
    assert set(DEFAULT_CATALOG.names()) < set(cat.names())
    host.register(FakeBackendPlugin("local"), "clash")
    with pytest.raises(ValidationError, match="both offer it"):
        host.schemes()
    host.unregister("clash")
    assert {"fake", "local"} <= set(host.schemes())
    with pytest.raises(NotFoundError):
        host.unregister("clash")
