"""Pure row codecs shared by the stores: JSON of facts, results and score records, float32
embedding bytes, argument checks. No I/O; each store imports its database driver itself."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.errors import InvalidInput, StorageError
from engine.store.base import WriteResult
from engine.types import Event, Fact, Memory, ReviewItem

_MEMORY_COLUMNS = (
    "id, namespace, kind, text, key, metadata, source, created_at, status, supersedes, "
    "superseded_by, scores, inferred_key, expires_at, inactive_since"
)
_REVIEW_COLUMNS = "id, namespace, fact, target_id, scores, status, created_at, resolved_memory_id"
_MAX_LIMIT = 10_000
_RESOLVED_STATUS: dict[str, str] = {
    "accept": "accepted",
    "keep_both": "kept_both",
    "reject": "rejected",
}
# Keys of a score record that hold (normalised) text of the fact: erased by forget.
_TEXT_SCORE_KEYS = ("hypothesis",)


def _json_default(value: Any) -> Any:
    # numpy scalars reach score records (np.float32 similarities); store them as plain numbers.
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(
            value, allow_nan=False, sort_keys=True, separators=(",", ":"), default=_json_default
        )
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} must be JSON-serialisable: {exc}") from None


def _loads_dict(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    value = json.loads(text)
    return value if isinstance(value, dict) else {}


def _blob(vec: np.ndarray | None) -> bytes | None:
    if vec is None:
        return None
    return np.ascontiguousarray(vec, dtype="<f4").tobytes()


def _vector(blob: bytes | None) -> np.ndarray | None:
    if blob is None:
        return None
    return np.frombuffer(blob, dtype="<f4").astype(np.float32)


def _memory(row: Sequence[Any]) -> Memory:
    return Memory(
        id=row[0],
        namespace=row[1],
        kind=row[2],
        text=row[3],
        key=row[4],
        metadata=_loads_dict(row[5]),
        source=row[6],
        created_at=row[7],
        status=row[8],
        supersedes=row[9],
        superseded_by=row[10],
        scores=_loads_dict(row[11]),
        inferred_key=row[12],
        expires_at=row[13],
        inactive_since=row[14],
    )


def _event(row: Sequence[Any]) -> Event:
    """An event from its row: ``seq, namespace, type, memory_id, target_id, policy, scores,
    created_at`` (the order of :class:`~engine.types.Event`'s fields)."""
    seq, namespace, type_, memory_id, target_id, policy, scores, created_at = row
    return Event(
        seq, namespace, type_, memory_id, target_id, policy, _loads_dict(scores), created_at
    )


def _fact_json(fact: Fact) -> str:
    return _dumps(
        {
            "namespace": fact.namespace,
            "text": fact.text,
            "kind": fact.kind,
            "key": fact.key,
            "metadata": fact.metadata,
            "source": fact.source,
            "idempotency_key": fact.idempotency_key,
            "expires_at": fact.expires_at,
            "ttl_s": fact.ttl_s,
        },
        "metadata",
    )


def _fact(text: str) -> Fact:
    d = json.loads(text)
    return Fact(
        namespace=d["namespace"],
        text=d["text"],
        kind=d["kind"],
        key=d.get("key"),
        metadata=d.get("metadata") or {},
        source=d.get("source"),
        idempotency_key=d.get("idempotency_key"),
        expires_at=d.get("expires_at"),
        ttl_s=d.get("ttl_s"),
    )


def _review(row: Sequence[Any]) -> ReviewItem:
    return ReviewItem(
        id=row[0],
        namespace=row[1],
        fact=_fact(row[2]),
        target_id=row[3],
        scores=_loads_dict(row[4]),
        status=row[5],
        created_at=row[6],
        resolved_memory_id=row[7],
    )


def _result_json(result: WriteResult) -> str:
    return _dumps(
        {
            "action": result.action,
            "memory_id": result.memory_id,
            "target_id": result.target_id,
            "review_id": result.review_id,
            "rowid": result.rowid,
            "superseded_rowid": result.superseded_rowid,
        },
        "result",
    )


def _result(text: str) -> WriteResult:
    d = json.loads(text)
    return WriteResult(
        action=d["action"],
        memory_id=d.get("memory_id"),
        target_id=d.get("target_id"),
        review_id=d.get("review_id"),
        rowid=d.get("rowid"),
        superseded_rowid=d.get("superseded_rowid"),
        replayed=True,
    )


def _check_namespace(namespace: str) -> None:
    if not isinstance(namespace, str) or not namespace:
        raise InvalidInput("namespace must be a non-empty string")


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= _MAX_LIMIT:
        raise InvalidInput(f"limit must be in [1, {_MAX_LIMIT}], got {limit}")


def _wanted(rowids: Sequence[int] | np.ndarray) -> list[int]:
    """The distinct non-negative rowids (negatives are FAISS padding), sorted."""
    return sorted({int(r) for r in np.asarray(rowids).tolist() if int(r) >= 0})


def _stack(namespace: str, rows: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(rowids int64 [n], vectors float32 [n, d])`` from ``(rowid, embedding blob)`` rows."""
    if not rows:
        return np.empty(0, dtype=np.int64), np.empty((0, 0), dtype=np.float32)
    nbytes = len(rows[0][1])
    if nbytes % 4 or any(len(blob) != nbytes for _, blob in rows):
        raise StorageError(f"namespace {namespace!r} holds embeddings of mixed dimensions")
    rowids = np.fromiter((r for r, _ in rows), dtype=np.int64, count=len(rows))
    flat = np.frombuffer(b"".join(blob for _, blob in rows), dtype="<f4")
    return rowids, flat.astype(np.float32).reshape(len(rows), nbytes // 4)


def _scrub(scores: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in scores.items() if k not in _TEXT_SCORE_KEYS}
