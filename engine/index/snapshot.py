"""Index snapshots on disk: one verified file per namespace, written atomically.

A snapshot spares a restart the work of rebuilding a large namespace (reading every embedding
and, above ``exact_max``, training IVF). It is a *cache*: the store stays the source of truth,
so a snapshot is never trusted. :func:`decode` checks every byte before the payload reaches
FAISS, and the :class:`~engine.index.IndexManager` reconciles what it loads against the store's
active rowids; any doubt and the file is quarantined and the namespace rebuilt from the store.

File ``<dir>/<sha256(namespace)>.idx``::

    magic        8 bytes   b"MGIDX\\r\\n\\x1a" (catches text-mode and truncated transfers)
    header_len   u32 LE    length of the header, at most 64 KiB
    header       JSON      format, namespace, seq, count, dim, kind, built_n,
                           payload_bytes, payload_sha256
    payload      bytes     faiss.serialize_index of the namespace's index
    trailer      32 bytes  sha256 of everything above (so the header is covered too)

``seq`` is the store's newest event of the namespace when the snapshot was taken (read
*before* the index was serialised, so the snapshot holds at least that state). Writes go to a
unique temporary file in the same directory, are fsynced, renamed over the target and the
directory is fsynced: after a kill -9 at any moment the target is the old file or the new
one, and a leftover temporary file is removed by :func:`clean_temporary`.

Pure of FAISS: this module frames and checks bytes; ``engine.index.namespace`` turns the
payload into an index.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from engine import fsutil
from engine.fsutil import fsync_dir

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "CorruptSnapshot",
    "SnapshotHeader",
    "SnapshotSource",
    "clean_temporary",
    "decode",
    "encode",
    "fsync_dir",
    "namespace_digest",
    "quarantine",
    "read_snapshot",
    "snapshot_path",
    "write_atomic",
]

FORMAT_VERSION = 1
MAGIC = b"MGIDX\r\n\x1a"
SUFFIX = ".idx"
BAD_SUFFIX = ".bad"
TMP_SUFFIX = ".tmp"
_LEN = struct.Struct("<I")
_MAX_HEADER = 64 << 10
_DIGEST = 32
_KINDS = ("exact", "ivf")
_FIELDS = frozenset(
    {
        "format",
        "namespace",
        "seq",
        "count",
        "dim",
        "kind",
        "built_n",
        "payload_bytes",
        "payload_sha256",
    }
)


class CorruptSnapshot(Exception):  # noqa: N818 - a state, like the stdlib's ``Empty``
    """A snapshot failed verification. Never leaves ``engine.index``: the manager quarantines
    the file and rebuilds the namespace from the store."""


@runtime_checkable
class SnapshotSource(Protocol):
    """What the index needs from the store to reconcile a snapshot (``SQLiteStore`` has it)."""

    def namespaces(self) -> list[str]:
        """Every namespace that holds a memory (names a rejected file's namespace)."""
        ...

    def namespace_seq(self, namespace: str) -> int:
        """The namespace's newest event sequence number; 0 when it has none."""
        ...

    def active_rowids(self, namespace: str) -> np.ndarray:
        """int64 rowids of the namespace's active memories that have an embedding, sorted."""
        ...

    def active_embeddings(
        self, namespace: str, rowids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(rowids int64 [n], vectors float32 [n, d])`` of the active memories among
        ``rowids``, by rowid."""
        ...


@dataclass(frozen=True)
class SnapshotHeader:
    """What a snapshot says about itself; every field is checked by :func:`decode`."""

    namespace: str
    seq: int
    """The store's newest event of the namespace when the snapshot was taken."""
    count: int
    """Vectors in the payload."""
    dim: int
    kind: str
    """``exact`` or ``ivf``."""
    built_n: int
    """Vectors the index was built (trained) with; drives ``needs_rebuild``."""
    payload_bytes: int = 0
    payload_sha256: str = ""
    format: int = FORMAT_VERSION


def namespace_digest(namespace: str) -> str:
    """The file stem of a namespace's snapshot: hex sha256 of its UTF-8 bytes."""
    return hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()


def snapshot_path(directory: Path, namespace: str) -> Path:
    return Path(directory) / (namespace_digest(namespace) + SUFFIX)


def encode(header: SnapshotHeader, payload: bytes | np.ndarray) -> bytes:
    """The file's bytes; ``payload_bytes`` and ``payload_sha256`` are filled in here."""
    view = np.ascontiguousarray(np.frombuffer(payload, dtype=np.uint8)).data
    fields = {
        "format": FORMAT_VERSION,
        "namespace": header.namespace,
        "seq": int(header.seq),
        "count": int(header.count),
        "dim": int(header.dim),
        "kind": header.kind,
        "built_n": int(header.built_n),
        "payload_bytes": len(view),
        "payload_sha256": hashlib.sha256(view).hexdigest(),
    }
    head = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("ascii")
    if len(head) > _MAX_HEADER:
        raise ValueError("snapshot header too long (namespace name?)")
    body = b"".join((MAGIC, _LEN.pack(len(head)), head, view))
    return body + hashlib.sha256(body).digest()


def _int(fields: dict[str, Any], name: str, low: int, high: int) -> int:
    value = fields.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CorruptSnapshot(f"header field {name} out of range")
    return value


def decode(
    data: bytes | memoryview, *, namespace: str | None, dim: int
) -> tuple[SnapshotHeader, memoryview]:
    """Check a snapshot's bytes; return its header and payload. ``CorruptSnapshot`` on any
    mismatch: magic, lengths, either hash, format version, fields, a namespace other than
    ``namespace`` (None: any), a dimension other than ``dim``."""
    view = memoryview(data).cast("B")
    fixed = len(MAGIC) + _LEN.size
    if len(view) < fixed + _DIGEST:
        raise CorruptSnapshot(f"too short ({len(view)} bytes)")
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise CorruptSnapshot("bad magic")
    (head_len,) = _LEN.unpack(view[len(MAGIC) : fixed])
    if not 2 <= head_len <= _MAX_HEADER or fixed + head_len + _DIGEST > len(view):
        raise CorruptSnapshot("bad header length")
    body = view[: len(view) - _DIGEST]
    if hashlib.sha256(body).digest() != bytes(view[len(view) - _DIGEST :]):
        raise CorruptSnapshot("file checksum mismatch")
    try:
        fields = json.loads(bytes(view[fixed : fixed + head_len]).decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise CorruptSnapshot("unreadable header") from None
    if not isinstance(fields, dict) or set(fields) != _FIELDS:
        raise CorruptSnapshot("header fields missing or unknown")
    if fields["format"] != FORMAT_VERSION or isinstance(fields["format"], bool):
        raise CorruptSnapshot(f"unsupported format {fields['format']!r}")
    name = fields["namespace"]
    if not isinstance(name, str) or not name:
        raise CorruptSnapshot("bad namespace")
    if namespace is not None and name != namespace:
        raise CorruptSnapshot("snapshot of another namespace")
    if fields["kind"] not in _KINDS:
        raise CorruptSnapshot("bad index kind")
    if _int(fields, "dim", 1, 65_536) != dim:
        raise CorruptSnapshot(f"dimension {fields['dim']} instead of {dim}")
    count = _int(fields, "count", 0, 1 << 40)
    built_n = _int(fields, "built_n", 0, 1 << 40)
    seq = _int(fields, "seq", 0, 1 << 62)
    payload = body[fixed + head_len :]
    if _int(fields, "payload_bytes", 1, 1 << 50) != len(payload):
        raise CorruptSnapshot("payload length mismatch")
    digest = fields["payload_sha256"]
    if not isinstance(digest, str) or hashlib.sha256(payload).hexdigest() != digest:
        raise CorruptSnapshot("payload checksum mismatch")
    # 4 bytes per float is a floor for any index holding ``count`` vectors.
    if count * dim * 4 > len(payload):
        raise CorruptSnapshot("payload too small for its count")
    header = SnapshotHeader(
        namespace=name,
        seq=seq,
        count=count,
        dim=dim,
        kind=fields["kind"],
        built_n=built_n,
        payload_bytes=len(payload),
        payload_sha256=digest,
    )
    return header, payload


def read_snapshot(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write_atomic(path: Path, data: bytes) -> None:
    """:func:`engine.fsutil.write_atomic` with this directory's temporary suffix (which
    :func:`clean_temporary` sweeps after a crash)."""
    fsutil.write_atomic(path, data, tmp_suffix=TMP_SUFFIX)


def quarantine(path: Path) -> Path | None:
    """Move a rejected snapshot aside (``<digest>.bad``, replacing an older one) so it is never
    read again but stays for inspection; deletes it if even that fails. Returns the new path."""
    bad = path.with_suffix(BAD_SUFFIX)
    try:
        os.replace(path, bad)
    except FileNotFoundError:
        return None
    except OSError:
        path.unlink(missing_ok=True)
        return None
    fsync_dir(path.parent)
    return bad


def clean_temporary(directory: Path) -> int:
    """Remove temporary files a crashed writer left behind; returns how many."""
    removed = 0
    try:
        entries = list(Path(directory).iterdir())
    except FileNotFoundError:
        return 0
    for entry in entries:
        if entry.name.startswith(".") and entry.name.endswith(TMP_SUFFIX) and entry.is_file():
            entry.unlink(missing_ok=True)
            removed += 1
    return removed
