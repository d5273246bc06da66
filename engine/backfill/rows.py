"""From a :class:`~engine.backfill.readers.Record` to a validated :class:`~engine.types.Fact`.

Every row is checked here, before it joins a gate batch, with the gate's own rules
(:func:`engine.gate.gate.validate_fact`) plus what the gate assumes of its callers (metadata is
a JSON object of bounded size), so one bad row never fails the batch it would have joined.

Each fact gets an idempotency key, so a batch sent again after a crash is a *replay* that the
store answers with the first result and stores nothing twice:

* ``bf:id:<id>`` when the row has an id (``--map id=...``): a record id, global to its
  namespace. The same id in the same namespace is stored once, across files and jobs;
* ``bf:<job>:<line>`` otherwise, where ``<job>`` names the input by its first 64 KiB
  (:func:`engine.backfill.readers.fingerprint`).

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any, cast

from engine.errors import InvalidInput
from engine.gate.gate import GateSettings, validate_fact
from engine.types import Fact, Kind

__all__ = ["FieldMap", "Row", "idempotency_key", "parse_map", "to_row"]

_MAX_KEY = 256


@dataclass(frozen=True)
class FieldMap:
    """Which input column feeds each fact field. ``None``: the field is not read."""

    namespace: str | None = "namespace"
    text: str | None = "text"
    kind: str | None = "kind"
    key: str | None = "key"
    metadata: str | None = "metadata"
    id: str | None = "id"
    source: str | None = "source"

    def columns(self) -> frozenset[str]:
        return frozenset(c for c in (getattr(self, f.name) for f in fields(self)) if c)

    def describe(self) -> dict[str, str | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def parse_map(spec: str | None) -> FieldMap:
    """``namespace=ns_col,text=body,key=`` -> a :class:`FieldMap` (an empty column: not read).

    Fields not named keep their default column (the field's own name)."""
    if not spec:
        return FieldMap()
    known = {f.name for f in fields(FieldMap)}
    changes: dict[str, str | None] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, column = part.partition("=")
        name, column = name.strip(), column.strip()
        if not sep or name not in known:
            raise InvalidInput(
                f"--map takes field=column pairs; fields: {', '.join(sorted(known))} (got {part!r})"
            )
        if name in changes:
            raise InvalidInput(f"--map names {name!r} twice")
        changes[name] = column or None
    fmap = FieldMap(**changes)
    if fmap.text is None:
        raise InvalidInput("--map: text cannot be switched off")
    return fmap


@dataclass(frozen=True, slots=True)
class Row:
    """A record after validation: a fact ready for the gate, or the reason it is not."""

    line: int
    fact: Fact | None
    row_id: str | None = None
    error: str | None = None


def idempotency_key(job: str, line: int, row_id: str | None) -> str:
    if row_id is None:
        return f"bf:{job}:{line}"
    key = f"bf:id:{row_id}"
    if len(key) > _MAX_KEY:
        key = "bf:idh:" + hashlib.sha256(row_id.encode("utf-8", "surrogatepass")).hexdigest()
    return key


def to_row(
    line: int,
    values: dict[str, Any],
    fmap: FieldMap,
    *,
    job: str,
    source: str,
    settings: GateSettings,
    default_namespace: str | None = None,
) -> Row:
    """Map and validate one record's values. ``source``: the fact's source when no column
    gives one (``backfill:<file>:<line>`` names the row it came from)."""
    row_id: str | None = None
    try:
        row_id = _opt_str(values, fmap.id, "id")
        namespace = _opt_str(values, fmap.namespace, "namespace") or default_namespace
        if namespace is None:
            raise InvalidInput(_missing("namespace", fmap.namespace))
        text = _opt_str(values, fmap.text, "text")
        if text is None:
            raise InvalidInput(_missing("text", fmap.text))
        kind = _opt_str(values, fmap.kind, "kind") or "semantic"
        key = _opt_str(values, fmap.key, "key")
        fact = Fact(
            namespace=namespace,
            text=text,
            kind=cast(Kind, kind),  # checked by validate_fact
            key=key,
            metadata=_metadata(values.get(fmap.metadata) if fmap.metadata else None, settings),
            source=_opt_str(values, fmap.source, "source") or f"{source}:{line}",
            idempotency_key=idempotency_key(job, line, row_id),
        )
        validate_fact(fact, settings)
    except InvalidInput as exc:
        return Row(line, None, row_id, str(exc))
    return Row(line, fact, row_id)


def _missing(field: str, column: str | None) -> str:
    if column is None or column == field:
        return f"missing {field}"
    return f"missing {field} (column {column!r})"


def _opt_str(values: dict[str, Any], column: str | None, field: str) -> str | None:
    """A string field: absent, null and "" are None; numbers become text; bytes must be UTF-8."""
    if column is None:
        return None
    value = values.get(column)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"{field} is not valid UTF-8") from None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise InvalidInput(f"{field} must be a string, got {type(value).__name__}")


def _metadata(value: Any, settings: GateSettings) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput("metadata is not valid UTF-8") from None
    if isinstance(value, str):  # CSV cells and Parquet string columns hold JSON text
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidInput("metadata is not valid JSON") from None
    if (
        isinstance(value, list)
        and value
        and all(isinstance(p, tuple) and len(p) == 2 for p in value)
    ):
        value = dict(value)  # a Parquet map column
    if not isinstance(value, dict):
        raise InvalidInput(f"metadata must be a JSON object, got {type(value).__name__}")
    try:
        size = len(json.dumps(value).encode("utf-8"))
    except (TypeError, ValueError):
        raise InvalidInput("metadata holds values that are not JSON") from None
    if size > settings.max_metadata_bytes:
        raise InvalidInput(
            f"metadata has {size} bytes of JSON; the limit is {settings.max_metadata_bytes}"
        )
    return value
