"""Where the plugin host and backends are made: the two functions every part of inferline
that needs one goes through (the composition root ``_build``, ``Deployment.open_backend``,
the CLI's verbs). Kept apart from ``_build`` so that the deployment format can open its own
backend without importing the root (``measure`` profiles through ``dep.open_backend()``:
it sits below ``deploy`` and builds nothing itself)."""

from __future__ import annotations

import json
from typing import Any

from inferline.core import ValidationError

__all__ = ["fleet_urls", "open_backend", "plugin_host"]


def plugin_host() -> Any:
    """The plugin host of this process: built-in adapters plus the installed plugins (entry
    point group ``inferline``). Entry points call this once and pass the host down."""
    from inferline.adapters import PluginHost

    return PluginHost.default()


def open_backend(host: Any, url: Any, **options: Any) -> Any:
    """The backend ``url`` names (``local://``, ``triton://``, ``tfserving://``, ``ray://``
    or a plugin's scheme), through ``host``'s adapters.

    A list of URLs (or its JSON text, ``'["local://?cores=0", "triton+grpc://h:8001"]'``) is
    a fleet: each member is built here the ordinary way (with ``options``) and
    ``FleetBackend`` spreads every model's replicas over them (docs/fleets.md)."""
    urls = fleet_urls(url)
    if urls is None:
        from inferline.adapters.fleet import parse_dns_source

        source = parse_dns_source(url)
        if source is not None:  # ?resolve=dns: a fleet of the name's addresses, refreshed
            return _dns_fleet(host, source, options)
    members = _open_members(host, [url] if urls is None else urls, options)
    if urls is None:
        return members[0]
    from inferline.adapters.fleet import fleet_of

    return fleet_of(members)


def _dns_fleet(host: Any, source: Any, options: dict[str, Any]) -> Any:
    """A fleet whose members are ``source``'s addresses now, and later those its refresh
    finds (built by the same ``backend_for``): docs/fleets.md, "Kubernetes"."""
    from inferline.adapters.fleet import fleet_of, resolve_dns_now

    try:
        addresses = resolve_dns_now(source.host, source.port)
    except OSError as e:
        raise ValidationError(f"{source.url}: host", "a name that resolves", str(e)) from None
    urls = [source.member_url(a) for a in addresses]
    if not urls:
        raise ValidationError(f"{source.url}: host", "a name that resolves to an address", [])
    members = _open_members(host, urls, options)
    return fleet_of(
        members,
        source=source,
        addresses=addresses,
        urls=urls,
        open_member=lambda u: _open_members(host, [u], options)[0],
    )


def _open_members(host: Any, urls: list[Any], options: dict[str, Any]) -> list[Any]:
    members: list[Any] = []
    try:
        for u in urls:
            members.append(host.backend_for(u, **options))
    except BaseException:
        for m in members:  # nothing is running yet; close what was opened all the same
            _close_quietly(m)
        raise
    return members


def fleet_urls(url: Any) -> list[str] | None:
    """The member URLs when ``url`` is a list (or a JSON list's text), else None."""
    if isinstance(url, str):
        if not url.lstrip().startswith("["):
            return None
        try:
            url = json.loads(url)
        except json.JSONDecodeError:
            raise ValidationError("backend", "a JSON list of backend URLs", url) from None
    if not isinstance(url, list | tuple):
        return None
    if not url:
        raise ValidationError("backend", "a non-empty list of backend URLs", url)
    for i, u in enumerate(url):
        if not isinstance(u, str) or "://" not in u:
            raise ValidationError(f"backend[{i}]", "a backend URL such as 'local://'", u)
        if u in url[:i]:  # drain names a member by its URL
            raise ValidationError(f"backend[{i}]", "a URL not listed before", u)
    return list(url)


def _close_quietly(backend: Any) -> None:
    close_now = getattr(backend, "close_now", None)
    if callable(close_now):
        close_now()
