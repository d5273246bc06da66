"""The gRPC service: ``memgate serve``.

Layering: ``server`` -> ``gate`` -> ``runtime`` / ``index`` / ``store``. Only this package (and
``engine.client``) imports ``grpc``. The batching queue (``engine.server.queue``) and admission
permits (``engine.server.admission``) are pure and import without grpc or the stubs, so names
here are loaded lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Limits", "MemgateServer", "QueueSettings", "ServerSettings", "ServerThread", "serve"]

if TYPE_CHECKING:
    from engine.server.convert import Limits
    from engine.server.queue import QueueSettings
    from engine.server.server import MemgateServer, ServerSettings, ServerThread, serve

_WHERE = {
    "Limits": "engine.server.convert",
    "QueueSettings": "engine.server.queue",
    "MemgateServer": "engine.server.server",
    "ServerSettings": "engine.server.server",
    "ServerThread": "engine.server.server",
    "serve": "engine.server.server",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'engine.server' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
