"""Facts from JSON Lines (one {"namespace", "text", "kind"?, "key"?, ...} per line), for CLIs."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

from engine.errors import InvalidInput
from engine.types import Fact

__all__ = ["read_facts"]


def read_facts(path: str) -> Iterator[Fact]:
    """Yield one :class:`Fact` per non-empty line of ``path`` (``-`` = standard input)."""
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    try:
        for n, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                yield Fact(
                    namespace=row["namespace"],
                    text=row["text"],
                    kind=row.get("kind", "semantic"),
                    key=row.get("key"),
                    metadata=row.get("metadata") or {},
                    source=row.get("source"),
                    idempotency_key=row.get("idempotency_key"),
                    expires_at=_seconds(row.get("expires_at"), "expires_at"),
                    ttl_s=_seconds(row.get("ttl_s"), "ttl_s"),
                )
            except KeyError as exc:
                raise InvalidInput(f"{path}:{n}: missing field {exc}") from None
            except (ValueError, AttributeError) as exc:
                raise InvalidInput(f"{path}:{n}: not a JSON object ({exc})") from None
    finally:
        if stream is not sys.stdin:
            stream.close()


def _seconds(value: object, what: str) -> float | None:
    """An optional number of seconds from a JSON line (the gate range-checks it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number")
    return float(value)
