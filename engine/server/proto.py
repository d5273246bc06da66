"""The generated stubs, imported in one place and checked against their ``.proto`` sources.

The stubs are generated into ``engine/server/_proto`` by ``python -m engine.server.codegen``
(``make proto``). In a source checkout a stub tree generated from other sources is refused, so
an edited contract cannot be served by stale code.
"""

from __future__ import annotations

from engine.server.codegen import PROTO_DIR, source_digest

try:
    from engine.server import _proto
    from engine.server._proto.memgate.v1 import memgate_pb2 as pb
    from engine.server._proto.memgate.v1 import memgate_pb2_grpc as pb_grpc
except ImportError as exc:  # pragma: no cover - depends on the checkout
    raise ImportError(
        "the gRPC stubs are not generated: run `python -m engine.server.codegen` (make proto)"
    ) from exc

if PROTO_DIR.is_dir() and getattr(_proto, "SOURCE_SHA256", None) != source_digest():
    raise ImportError(
        "the gRPC stubs in engine/server/_proto are stale (protos/ changed): "
        "run `python -m engine.server.codegen` (make proto)"
    )

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Memgate"].full_name

__all__ = ["SERVICE_NAME", "pb", "pb_grpc"]
