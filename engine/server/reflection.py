"""gRPC server reflection, both versions: ``grpc.reflection.v1`` and ``grpc.reflection.v1alpha``.

grpcio-reflection (1.85) ships only the v1alpha service, so a client that asks for v1 (newer
grpcurl, grpc-js tooling, Postman) gets UNIMPLEMENTED. The two protocols are the same file
under two package names: same messages, same field numbers, so the same bytes on the wire.
This module therefore

* registers a v1 copy of the v1alpha file descriptor in the default pool (package and type
  references renamed), so that v1 can describe itself like any other listed service;
* serves ``grpc.reflection.v1.ServerReflection/ServerReflectionInfo`` with the library's own
  v1alpha servicer, whose messages parse and serialise v1 requests and responses unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

__all__ = ["V1_SERVICE_NAME", "V1ALPHA_SERVICE_NAME", "enable_reflection"]

V1ALPHA_SERVICE_NAME: str = reflection.SERVICE_NAME
V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"
_ALPHA = "grpc.reflection.v1alpha"
_V1 = "grpc.reflection.v1"


def _register_v1_descriptor() -> None:
    """Add the v1 reflection file to the default pool (once; a no-op if something else did)."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = _V1_FILE
    proto.package = _V1
    for message in proto.message_type:
        for fld in message.field:
            if fld.HasField("type_name"):  # scalars have none; assigning "" would set one
                fld.type_name = fld.type_name.replace(f".{_ALPHA}.", f".{_V1}.")
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(f".{_ALPHA}.", f".{_V1}.")
            method.output_type = method.output_type.replace(f".{_ALPHA}.", f".{_V1}.")
    pool.Add(proto)


def enable_reflection(server: Any, services: Sequence[str]) -> tuple[str, ...]:
    """Serve reflection v1 and v1alpha on ``server`` (a ``grpc.aio.Server``) for ``services``
    plus both reflection services; returns the names listed."""
    _register_v1_descriptor()
    names = (*services, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(
        V1_SERVICE_NAME,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))
    return names
