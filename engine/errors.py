"""The one exception hierarchy of memgate.

::

    MemgateError
    ├── InvalidInput              bad text, kind, namespace, threshold override, batch size
    ├── NotFound                  no such memory / review item in the caller's namespace
    ├── Conflict                  the operation does not apply to the current state
    │                             (undo of a memory that replaced nothing, resolving a
    │                             resolved review item)
    ├── PermissionDenied          a token that does not cover the namespace
    ├── Unauthenticated           no or unknown token
    ├── Overloaded                admission control refused the request
    ├── DeadlineExceeded          the request's deadline passed before it was served
    ├── ModelError                artefacts missing, tampered, or of the wrong shape
    │   └── ManifestMismatch      a file's hash, labels, or max length differ from the manifest
    ├── StorageError              the store could not persist (I/O error, failed fsync); fail-stop
    │   └── StorageFull           the disk is full; fail-stop too
    └── Unavailable               the engine is shutting down or not yet serving
        ├── StoreUnreachable      the store's database server cannot be reached (connection
        │                         lost, server restarting); retryable, never fail-stop
        └── NamespaceBusy         a namespace's write lock stayed held elsewhere (another
                                  replica, another process) past the lock timeout; retryable

Lower-level errors (sqlite3, onnxruntime, faiss) are translated into these at the module
boundary that imports them. The gRPC layer maps each class to exactly one status code in one
table (``engine.server.status``).
"""

from __future__ import annotations

__all__ = [
    "Conflict",
    "DeadlineExceeded",
    "InvalidInput",
    "ManifestMismatch",
    "MemgateError",
    "ModelError",
    "NamespaceBusy",
    "NotFound",
    "Overloaded",
    "PermissionDenied",
    "StorageError",
    "StorageFull",
    "StoreUnreachable",
    "Unauthenticated",
    "Unavailable",
]


class MemgateError(Exception):
    """Base class of every error memgate raises on purpose."""


class InvalidInput(MemgateError):
    """The request itself is wrong; retrying it unchanged cannot succeed."""


class NotFound(MemgateError):
    """No such object in the caller's namespace (foreign ids are reported the same way)."""


class Conflict(MemgateError):
    """The operation does not apply to the object's current state."""


class PermissionDenied(MemgateError):
    """The caller is authenticated but may not touch that namespace."""


class Unauthenticated(MemgateError):
    """The caller presented no token, or one that is not known."""


class Overloaded(MemgateError):
    """Admission control refused the request; retry later."""


class DeadlineExceeded(MemgateError):
    """The request's deadline passed before it could be served."""


class ModelError(MemgateError):
    """A model artefact is missing, unreadable or of the wrong shape."""


class ManifestMismatch(ModelError):
    """An artefact's files do not match its manifest (hash, labels, max length)."""


class StorageError(MemgateError):
    """The store could not persist a write (or read its file). Fail-stop: the server turns
    NOT_SERVING and refuses every later write until it is restarted; the store itself refuses
    every later call after an I/O error (it is poisoned). gRPC: UNAVAILABLE."""


class StorageFull(StorageError):
    """The disk holding the store is full. Nothing of the failed write was stored. Fail-stop
    like its parent, but every refusal says why. gRPC: RESOURCE_EXHAUSTED."""


class Unavailable(MemgateError):
    """The engine is starting, draining, or stopped after a storage failure."""


class StoreUnreachable(Unavailable):
    """The store's database server (PostgreSQL) cannot be reached: refused, lost or restarting.

    Unlike ``StorageError`` this is not fail-stop. The database itself decides what is durable;
    a call that failed this way wrote nothing the server acknowledged (a commit whose
    acknowledgement was lost is found again by its idempotency key), and the store reconnects
    by itself when the database returns. The server turns health NOT_SERVING while the store
    is unreachable and SERVING again once it answers. gRPC: UNAVAILABLE."""


class NamespaceBusy(Unavailable):
    """A write waited ``--lock-timeout`` for a namespace's lock held by another writer (another
    replica's transaction, another process on the SQLite file) and gave up. Nothing was written;
    the message names the namespace. Retryable: the holder commits, or loses its lock when its
    session ends (a frozen or partitioned replica loses it within the store's hold bound).
    gRPC: UNAVAILABLE."""
