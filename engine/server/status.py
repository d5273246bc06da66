"""The one table from ``engine.errors`` classes to gRPC status codes.

The interceptor (``engine.server.interceptor``) is its only server-side user; the client
(``engine.client``) reads it backwards to raise the same classes. A class not in the table takes
its nearest ancestor's row; an exception that is not a :class:`~engine.errors.MemgateError`
becomes INTERNAL with the request id only.

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
    public: bool = True
    """Send ``str(exc)`` to the client; otherwise send ``message``."""
    message: str = ""


# Order matters only for reading the table backwards: the first class listed for a code is the
# one the client raises for it.
STATUS_TABLE: dict[type[MemgateError], Rule] = {
    InvalidInput: Rule(grpc.StatusCode.INVALID_ARGUMENT),
    NotFound: Rule(grpc.StatusCode.NOT_FOUND),
    Conflict: Rule(grpc.StatusCode.FAILED_PRECONDITION),
    Unauthenticated: Rule(grpc.StatusCode.UNAUTHENTICATED),
    PermissionDenied: Rule(grpc.StatusCode.PERMISSION_DENIED),
    Overloaded: Rule(grpc.StatusCode.RESOURCE_EXHAUSTED),
    DeadlineExceeded: Rule(grpc.StatusCode.DEADLINE_EXCEEDED),
    Unavailable: Rule(grpc.StatusCode.UNAVAILABLE),
    NamespaceBusy: Rule(grpc.StatusCode.UNAVAILABLE),
    StorageFull: Rule(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        False,
        "the disk holding the store is full; this server stopped accepting writes",
    ),
    StorageError: Rule(
        grpc.StatusCode.UNAVAILABLE, False, "the store failed; this server stopped accepting writes"
    ),
    ModelError: Rule(grpc.StatusCode.INTERNAL, False, "internal error"),
    MemgateError: Rule(grpc.StatusCode.INTERNAL, False, "internal error"),
}

_INTERNAL = Rule(grpc.StatusCode.INTERNAL, False, "internal error")


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
