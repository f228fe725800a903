"""A third-party inferline backend (``echo://``): replicas are asyncio workers in this process
that compute ``tanh(scale * x)`` and take ``base_s + per_item_s * batch`` seconds per batch
(half that on the plugin's own hardware kind ``echo-accel``). It imports only inferline's
public API (``inferline.core``, ``inferline.adapters.hookimpl``)."""

from .backend import EchoBackend

__all__ = ["EchoBackend"]
