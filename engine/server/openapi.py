"""The OpenAPI 3.1 document of the HTTP/JSON door, generated from the message descriptors.

Every RPC of ``memgate.v1.Memgate`` is ``POST /v1/<Rpc>``; its request and response bodies are
the JSON mapping of its messages (``engine.server.jsonmap``), so the schemas below are read off
the same descriptors the door parses with, and a field added to ``protos/`` shows up with no
edit. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    ServiceDescriptor,
)

__all__ = ["ERROR_SCHEMA", "openapi", "route_of"]

NDJSON = "application/x-ndjson"

_SCALARS: dict[int, dict[str, Any]] = {
    FieldDescriptor.TYPE_DOUBLE: {"type": "number", "format": "double"},
    FieldDescriptor.TYPE_FLOAT: {"type": "number", "format": "float"},
    FieldDescriptor.TYPE_INT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SINT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_UINT32: {"type": "integer", "format": "int64", "minimum": 0},
    FieldDescriptor.TYPE_FIXED32: {"type": "integer", "format": "int64", "minimum": 0},
    # The JSON mapping writes 64-bit integers as strings and reads both.
    FieldDescriptor.TYPE_INT64: {"type": ["string", "integer"], "format": "int64"},
    FieldDescriptor.TYPE_SINT64: {"type": ["string", "integer"], "format": "int64"},
    FieldDescriptor.TYPE_SFIXED64: {"type": ["string", "integer"], "format": "int64"},
    FieldDescriptor.TYPE_UINT64: {"type": ["string", "integer"], "format": "uint64"},
    FieldDescriptor.TYPE_FIXED64: {"type": ["string", "integer"], "format": "uint64"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BYTES: {
        "type": "string",
        "description": "UTF-8 text as a plain JSON string (bytes in the proto only so that "
        "gRPC can answer invalid UTF-8 itself)",
    },
}

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["code", "message", "request_id"],
    "properties": {
        "code": {
            "type": "string",
            "description": "the gRPC status name (INVALID_ARGUMENT, NOT_FOUND, ...)",
        },
        "message": {"type": "string"},
        "request_id": {"type": "string", "description": "also in the x-request-id header"},
    },
}


def route_of(rpc: str) -> str:
    return f"/v1/{rpc}"


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated) if hasattr(field, "is_repeated") else field.label == 3


def _field_schema(field: FieldDescriptor, schemas: dict[str, Any]) -> dict[str, Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        one: dict[str, Any] = {"$ref": _ref(field.message_type, schemas)}
    elif field.type == FieldDescriptor.TYPE_ENUM:
        one = {"$ref": _enum_ref(field.enum_type, schemas)}
    else:
        one = dict(_SCALARS[field.type])
    return {"type": "array", "items": one} if _is_repeated(field) else one


def _enum_ref(enum: EnumDescriptor, schemas: dict[str, Any]) -> str:
    if enum.full_name not in schemas:
        schemas[enum.full_name] = {
            "description": "an enum: its value name, or its number",
            "oneOf": [
                {"type": "string", "enum": [v.name for v in enum.values]},
                {"type": "integer", "format": "int32"},
            ],
        }
    return f"#/components/schemas/{enum.full_name}"


def _ref(message: Descriptor, schemas: dict[str, Any]) -> str:
    if message.full_name not in schemas:
        schemas[message.full_name] = {}  # a placeholder: a message may refer to itself
        schemas[message.full_name] = {
            "type": "object",
            "additionalProperties": False,
            "properties": {f.name: _field_schema(f, schemas) for f in message.fields},
        }
    return f"#/components/schemas/{message.full_name}"


def _error_responses() -> dict[str, Any]:
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    described = {
        "400": "INVALID_ARGUMENT (bad JSON, unknown field, bad text) or FAILED_PRECONDITION",
        "401": "UNAUTHENTICATED: no bearer token, or an unknown one",
        "403": "PERMISSION_DENIED: the token is not bound to the namespace",
        "404": "NOT_FOUND: no such memory or review item in that namespace",
        "429": "RESOURCE_EXHAUSTED: admission control refused the request; retry with backoff",
        "500": "INTERNAL: the message carries the request id and no internals",
        "503": "UNAVAILABLE: draining, starting, or stopped after a storage failure",
        "504": "DEADLINE_EXCEEDED: the x-timeout-s deadline passed",
    }
    return {code: {"description": text, "content": body} for code, text in described.items()}


def openapi(
    service: ServiceDescriptor, *, version: str, mcp_path: str | None = None
) -> dict[str, Any]:
    """The document for ``service`` (``POST /v1/<Rpc>`` per method, ``GET /healthz``)."""
    schemas: dict[str, Any] = {"Error": ERROR_SCHEMA}
    paths: dict[str, Any] = {}
    headers = [
        {
            "name": "x-request-id",
            "in": "header",
            "required": False,
            "description": "1-64 of A-Z a-z 0-9 . _ : -; echoed in the response (else a fresh one)",
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,64}$"},
        },
        {
            "name": "x-timeout-s",
            "in": "header",
            "required": False,
            "description": "the call's deadline in seconds (as a gRPC deadline)",
            "schema": {"type": "number", "exclusiveMinimum": 0},
        },
    ]
    for method in service.methods:
        request = {"$ref": _ref(method.input_type, schemas)}
        response = {"$ref": _ref(method.output_type, schemas)}
        if method.client_streaming or method.server_streaming:
            content_in = {NDJSON: {"schema": request}}
            content_out = {NDJSON: {"schema": response}}
            note = (
                " Streams: one JSON message per line in, one per line out, in order. An error "
                'after the first line out ends the stream with a line {"error": Error}.'
            )
        else:
            content_in = {"application/json": {"schema": request}}
            content_out = {"application/json": {"schema": response}}
            note = ""
        paths[route_of(method.name)] = {
            "post": {
                "operationId": method.name,
                "summary": f"memgate.v1.Memgate/{method.name}.{note}",
                "parameters": headers,
                "requestBody": {"required": True, "content": content_in},
                "responses": {"200": {"description": "OK", "content": content_out}}
                | _error_responses(),
            }
        }
    paths["/healthz"] = {
        "get": {
            "operationId": "Health",
            "summary": "SERVING (200) or NOT_SERVING (503); never needs a token",
            "responses": {
                "200": {"description": "serving"},
                "503": {"description": "not serving"},
            },
        }
    }
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "memgate",
            "version": version,
            "description": "The write gate for AI memory over HTTP/JSON: the same service as "
            f"gRPC {service.full_name}, bodies in the protobuf JSON mapping of its messages.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }
    if mcp_path is not None:
        doc["info"]["description"] += f" MCP (streamable HTTP) is served at {mcp_path}."
    return doc
