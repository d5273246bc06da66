"""The gRPC service: ``memgate serve``.

Layering: ``server`` -> ``core`` -> ``gate`` -> ``runtime`` / ``index`` / ``store``. Only this
package (and ``engine.client``) imports ``grpc``; the batching core (``engine.core``) is
transport-free. Names here are loaded lazily, so importing the package loads no stubs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Limits", "MemgateServer", "QueueSettings", "ServerSettings", "ServerThread", "serve"]

if TYPE_CHECKING:
    from engine.core.queue import QueueSettings
    from engine.server.convert import Limits
    from engine.server.server import MemgateServer, ServerSettings, ServerThread, serve

_WHERE = {
    "Limits": "engine.server.convert",
    "QueueSettings": "engine.core.queue",
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
