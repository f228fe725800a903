"""``ray://`` URLs -> the address ``ray.init`` takes (pure: no Ray here)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from inferline.core import ValidationError

__all__ = ["parse_address"]


def parse_address(url: str) -> str:
    """The address ``ray.init`` takes for ``url``: ``ray://HOST:PORT`` -> ``HOST:PORT`` (the
    GCS address ``ray start --head`` prints); ``ray://auto`` (or ``ray://``) -> the
    ``RAY_ADDRESS`` environment variable, else ``auto`` (the cluster started on this machine).
    """
    parts = urlsplit(url)
    if parts.scheme.lower() != "ray":
        raise ValidationError("backend url", "'ray://HOST:PORT' or 'ray://auto'", url)
    netloc = parts.netloc
    if netloc in ("", "auto"):
        address = os.environ.get("RAY_ADDRESS", "").strip() or "auto"
        where = "RAY_ADDRESS"
    else:
        address, where = netloc, "backend url"
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None:
            raise ValidationError(where, "'ray://HOST:PORT' (the cluster's GCS address)", url)
    if "://" in address:
        raise ValidationError(
            where,
            "a GCS address HOST:PORT (Ray Client 'ray://' addresses are not supported: "
            "inferline connects as a driver on a machine of the cluster)",
            address,
        )
    return address
