"""The one table from ``engine.errors`` classes to gRPC status codes, and to HTTP statuses.

The interceptor (``engine.server.interceptor``) applies it to every call, whichever door it came
through: the gRPC status for gRPC, the ``http`` column for the HTTP/JSON door
(``engine.server.http``); the client (``engine.client``) reads it backwards to raise the same
classes. The ``http`` column is the standard gRPC-to-HTTP mapping (Google's ``google.rpc.Code``
documentation, grpc-gateway's ``HTTPStatusFromCode``) for each row's code. A class not in the
table takes its nearest ancestor's row; an exception that is not a
:class:`~engine.errors.MemgateError` becomes INTERNAL with the request id only.

``public`` says whether the exception's message goes to the client. Messages of model and
storage failures can hold paths and driver errors, so those callers get a fixed sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from engine.errors import (
    Conflict,
    DeadlineExceeded,
    InvalidInput,
    MemgateError,
    ModelError,
    NamespaceBusy,
    NotFound,
    Overloaded,
    PermissionDenied,
    StorageError,
    StorageFull,
    Unauthenticated,
    Unavailable,
)

__all__ = ["STATUS_TABLE", "Rule", "error_class", "rule_for"]


@dataclass(frozen=True)
class Rule:
    code: grpc.StatusCode
    http: int
    """The HTTP status of the same error on the HTTP/JSON door."""
    public: bool = True
    """Send ``str(exc)`` to the client; otherwise send ``message``."""
    message: str = ""


# Order matters only for reading the table backwards: the first class listed for a code is the
# one the client raises for it.
STATUS_TABLE: dict[type[MemgateError], Rule] = {
    InvalidInput: Rule(grpc.StatusCode.INVALID_ARGUMENT, 400),
    NotFound: Rule(grpc.StatusCode.NOT_FOUND, 404),
    Conflict: Rule(grpc.StatusCode.FAILED_PRECONDITION, 400),
    Unauthenticated: Rule(grpc.StatusCode.UNAUTHENTICATED, 401),
    PermissionDenied: Rule(grpc.StatusCode.PERMISSION_DENIED, 403),
    Overloaded: Rule(grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    DeadlineExceeded: Rule(grpc.StatusCode.DEADLINE_EXCEEDED, 504),
    Unavailable: Rule(grpc.StatusCode.UNAVAILABLE, 503),
    NamespaceBusy: Rule(grpc.StatusCode.UNAVAILABLE, 503),
    StorageFull: Rule(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        429,
        False,
        "the disk holding the store is full; this server stopped accepting writes",
    ),
    StorageError: Rule(
        grpc.StatusCode.UNAVAILABLE,
        503,
        False,
        "the store failed; this server stopped accepting writes",
    ),
    ModelError: Rule(grpc.StatusCode.INTERNAL, 500, False, "internal error"),
    MemgateError: Rule(grpc.StatusCode.INTERNAL, 500, False, "internal error"),
}

_INTERNAL = Rule(grpc.StatusCode.INTERNAL, 500, False, "internal error")


def rule_for(exc: BaseException) -> Rule:
    """The row for ``exc``: its class's, else its nearest listed ancestor's, else INTERNAL."""
    for cls in type(exc).__mro__:
        rule = STATUS_TABLE.get(cls)
        if rule is not None:
            return rule
    return _INTERNAL


def error_class(code: grpc.StatusCode) -> type[MemgateError]:
    """The error class a client raises for ``code`` (``MemgateError`` for unlisted codes)."""
    for cls, rule in STATUS_TABLE.items():
        if rule.code == code and rule.public:
            return cls
    return MemgateError
