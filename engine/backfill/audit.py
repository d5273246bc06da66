"""The audit file of a backfill: one JSON line per input row, in input order.

A decided row::

    {"line": 17, "id": "r17", "namespace": "acme/alice", "kind": "semantic", "action": "replace",
     "target": "mem_…", "memory_id": "mem_…", "review_id": null, "rule": "contradiction",
     "policy": "strict", "similarity": 0.83, "contradiction": 0.97, "replayed": false}

``similarity`` / ``contradiction`` are the target's (null without a target, or when the target's
scores are not known: a replayed fact keeps the first run's action and ids, not its scores).
``replayed``: the store had already applied this row (a restart after a kill) and returned the
first result. A bad row has ``"action": "error"`` and ``error`` (the reason) instead.

:class:`Tally` counts decisions; it is rebuilt from the audit file when a job resumes, so the
final summary covers the whole job, not only the last run.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from engine.types import Decision

__all__ = [
    "AUDIT_ACTIONS",
    "AuditLog",
    "Tally",
    "decision_record",
    "error_record",
    "read_records",
]

AUDIT_ACTIONS: tuple[str, ...] = ("add", "replace", "skip", "review", "error")


def decision_record(line: int, row_id: str | None, d: Decision) -> dict[str, Any]:
    scores = d.scores()
    return {
        "line": line,
        "id": row_id,
        "namespace": d.fact.namespace,
        "kind": d.fact.kind,
        "action": d.action,
        "target": d.target_id,
        "memory_id": d.memory_id,
        "review_id": d.review_id,
        "rule": d.rule,
        "policy": d.policy,
        "similarity": scores["similarity"],
        "contradiction": scores["contradiction"],
        "replayed": d.replayed,
    }


def error_record(line: int, row_id: str | None, error: str, policy: str) -> dict[str, Any]:
    return {"line": line, "id": row_id, "action": "error", "policy": policy, "error": error}


class AuditLog:
    """Append-only JSON Lines with an explicit durable point (:meth:`sync`).

    ``truncate_to``: on resume, cut what a killed run wrote after its last checkpoint, so no row
    is audited twice. Returns via :attr:`short` whether the file was shorter than that (it was
    removed or cut by hand: the rows before are then missing from it)."""

    def __init__(self, path: Path, *, truncate_to: int | None = None) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._f: IO[bytes] = os.fdopen(fd, "r+b")
        size = self._f.seek(0, os.SEEK_END)
        self.short = False
        if truncate_to is not None:
            if size > truncate_to:
                self._f.truncate(truncate_to)
                self._f.seek(truncate_to)
            elif size < truncate_to:
                self.short = True
        elif size:
            self._f.truncate(0)
            self._f.seek(0)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")

    def sync(self, durable: bool = True) -> int:
        """Flush (and fsync when ``durable``); the byte offset everything before is written up
        to. A flushed line survives the death of this process; an fsynced one a power cut."""
        self._f.flush()
        if durable:
            os.fsync(self._f.fileno())
        return self._f.tell()

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            self._f.close()

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: Path, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The audit records in the first ``limit`` bytes of ``path`` (all of it: None)."""
    seen = 0
    with open(path, "rb") as f:
        for raw in f:
            seen += len(raw)
            if limit is not None and seen > limit:
                return
            if raw.strip():
                yield json.loads(raw)


@dataclass
class Tally:
    """Decisions so far: per action, per (policy, kind, action), facts per namespace."""

    actions: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    namespaces: Counter[str] = field(default_factory=Counter)
    replayed: int = 0
    rows: int = 0

    def add(self, record: dict[str, Any]) -> None:
        action = record["action"]
        self.rows += 1
        self.actions[action] += 1
        policy = record.get("policy") or "-"
        kind = record.get("kind") or ("(bad row)" if action == "error" else "-")
        self.by_kind[(policy, kind, action)] += 1
        if record.get("namespace"):
            self.namespaces[record["namespace"]] += 1
        if record.get("replayed"):
            self.replayed += 1

    @classmethod
    def from_audit(cls, path: Path, limit: int) -> Tally:
        tally = cls()
        for record in read_records(path, limit):
            tally.add(record)
        return tally

    def postfix(self) -> str:
        """``add=.. replace=.. skip=.. review=.. error=..`` for the progress bar."""
        return " ".join(f"{a}={self.actions.get(a, 0):,}" for a in AUDIT_ACTIONS)
