"""Readers of backfill input files: JSON Lines (plain or gzip), CSV / TSV and Parquet.

A reader turns a file into :class:`Record` objects, in file order, each with the *line* that
names it in messages and in the audit file: the physical line of a JSON Lines row, the first
line of a CSV record (the header is line 1), the 1-based row number of a Parquet row. Lines only
grow, so a checkpoint is one number: ``start_after=N`` skips every record at or before line N
without parsing it.

A row that cannot be read (invalid UTF-8, bad JSON, not an object, wrong field count) is a
record with ``error`` set and no values: the caller decides whether that skips the row or fails
the job. Nothing here knows about facts or the gate; pyarrow is imported only for Parquet.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, cast

from engine.errors import InvalidInput

__all__ = [
    "FORMATS",
    "HEAD_BYTES",
    "Format",
    "Record",
    "columns",
    "count_rows",
    "detect_format",
    "fingerprint",
    "parse_json_line",
    "read_records",
]

Format = Literal["jsonl", "csv", "tsv", "parquet"]
FORMATS: tuple[str, ...] = ("jsonl", "csv", "tsv", "parquet")

HEAD_BYTES = 64 * 1024
"""How much of the input's start names a job (see :func:`fingerprint`)."""

_PARQUET_EXTRA = "pip install 'memgate[parquet]'"
_CHUNK = 1 << 20
_GZ_COUNT_MAX = 32 << 20
"""Compressed .gz inputs up to this size are pre-counted (a fraction of a second); larger ones
run without a total."""


@dataclass(frozen=True, slots=True)
class Record:
    """One row of the input: its values, or why it could not be read."""

    line: int
    values: dict[str, Any] | None
    error: str | None = None


def detect_format(path: Path, explicit: str | None = None) -> tuple[Format, bool]:
    """(format, gzip) from ``explicit`` or the file name (``.jsonl``, ``.ndjson``, ``.csv``,
    ``.tsv``, ``.parquet``, ``.pq``, each optionally ``.gz`` except Parquet)."""
    name = path.name.lower()
    gz = name.endswith(".gz")
    if gz:
        name = name[:-3]
    fmt: str | None = explicit
    if fmt is None:
        suffix = name.rsplit(".", 1)[-1] if "." in name else ""
        fmt = {
            "jsonl": "jsonl",
            "ndjson": "jsonl",
            "json": "jsonl",
            "csv": "csv",
            "tsv": "tsv",
            "parquet": "parquet",
            "pq": "parquet",
        }.get(suffix)
        if fmt is None:
            raise InvalidInput(
                f"cannot tell the format of {path.name}: name it .jsonl, .csv, .tsv or .parquet "
                "(optionally .gz), or pass --format"
            )
    if fmt not in FORMATS:
        raise InvalidInput(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "parquet" and gz:
        raise InvalidInput("Parquet compresses its own pages: a .parquet.gz file is not supported")
    return fmt, gz  # type: ignore[return-value]


def fingerprint(path: Path) -> str:
    """A job's name: SHA-256 of the file's first 64 KiB (raw bytes, before any decompression),
    16 hex characters. The same file names the same job wherever it lives; appending rows to
    it keeps the name."""
    with open(path, "rb") as f:
        head = f.read(HEAD_BYTES)
    return hashlib.sha256(head).hexdigest()[:16]


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidInput(f"reading Parquet needs pyarrow: {_PARQUET_EXTRA}") from None
    return pq


def _open_binary(path: Path, gz: bool) -> IO[bytes]:
    return cast(IO[bytes], gzip.open(path, "rb") if gz else open(path, "rb"))  # noqa: SIM115


def count_rows(path: Path, fmt: Format, gz: bool) -> int | None:
    """Rows in the file, for the progress bar: lines (less the CSV header), or the Parquet row
    count from its footer. None when counting would cost real time (a large .gz file).

    Blank lines and CSV records spanning several lines make this an upper bound of the records;
    progress is measured in the same lines, so the bar still ends at 100%."""
    if fmt == "parquet":
        return int(_pyarrow_parquet().ParquetFile(str(path)).metadata.num_rows)
    if gz and os.path.getsize(path) > _GZ_COUNT_MAX:
        return None
    lines = 0
    last = b"\n"
    with _open_binary(path, gz) as f:
        while chunk := f.read(_CHUNK):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    if last != b"\n":
        lines += 1
    return max(0, lines - 1) if fmt in ("csv", "tsv") else lines


def columns(path: Path, fmt: Format, gz: bool) -> list[str] | None:
    """The column names of a CSV/TSV header or Parquet schema; None for JSON Lines."""
    if fmt == "parquet":
        return list(_pyarrow_parquet().ParquetFile(str(path)).schema_arrow.names)
    if fmt in ("csv", "tsv"):
        with _open_text(path, gz) as f:
            header = next(csv.reader(f, delimiter="\t" if fmt == "tsv" else ","), None)
        return [] if header is None else header
    return None


def read_records(
    path: Path, fmt: Format, gz: bool, *, start_after: int = 0, fields: frozenset[str] = frozenset()
) -> Iterator[Record]:
    """The file's records in order, skipping those at or before line ``start_after``.

    ``fields``: the columns the caller maps (Parquet reads only those that exist)."""
    if fmt == "jsonl":
        return _jsonl(path, gz, start_after)
    if fmt in ("csv", "tsv"):
        return _csv(path, gz, start_after, "\t" if fmt == "tsv" else ",")
    return _parquet(path, start_after, fields)


# -- JSON Lines -------------------------------------------------------------------------------
def _jsonl(path: Path, gz: bool, start_after: int) -> Iterator[Record]:
    with _open_binary(path, gz) as f:
        for line, raw in enumerate(f, 1):
            if line <= start_after:
                continue  # resumed: no decoding, no parsing
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield Record(line, None, f"invalid UTF-8 (byte {exc.start} of the line)")
                continue
            yield parse_json_line(line, text)


def parse_json_line(line: int, text: str) -> Record:
    """One JSON Lines row (not blank) -> its record, or the reason it cannot be read."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return Record(line, None, f"bad JSON: {exc}")
    if not isinstance(value, dict):
        return Record(line, None, f"a row must be a JSON object, got {_type(value)}")
    return Record(line, value)


# -- CSV / TSV --------------------------------------------------------------------------------
def _open_text(path: Path, gz: bool) -> IO[str]:
    # surrogateescape: an invalid byte becomes a lone surrogate that is reported per row,
    # instead of a decode error that would end the whole file.
    return io.TextIOWrapper(
        _open_binary(path, gz), encoding="utf-8", errors="surrogateescape", newline=""
    )


def _csv(path: Path, gz: bool, start_after: int, delimiter: str) -> Iterator[Record]:
    with _open_text(path, gz) as f:
        reader = csv.reader(f, delimiter=delimiter, strict=True)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise InvalidInput(f"{path.name}: the CSV header cannot be read: {exc}") from None
        width = len(header)
        end = reader.line_num
        while True:
            start = end + 1
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                end = reader.line_num
                if start > start_after:
                    yield Record(start, None, f"bad CSV: {exc}")
                continue
            end = reader.line_num
            if start <= start_after or not cells:
                continue
            if len(cells) != width:
                yield Record(start, None, f"{len(cells)} fields; the header has {width}")
                continue
            bad = next((h for h, c in zip(header, cells, strict=True) if _has_surrogate(c)), None)
            if bad is not None:
                yield Record(start, None, f"invalid UTF-8 in column {bad!r}")
                continue
            yield Record(start, dict(zip(header, cells, strict=True)))


def _has_surrogate(cell: str) -> bool:
    if cell.isascii():
        return False
    try:
        cell.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# -- Parquet ----------------------------------------------------------------------------------
def _parquet(path: Path, start_after: int, fields: frozenset[str]) -> Iterator[Record]:
    pq = _pyarrow_parquet()
    pf = pq.ParquetFile(str(path))
    names = pf.schema_arrow.names
    wanted = [n for n in names if n in fields] if fields else names
    meta = pf.metadata
    first = 0  # row number (0-based) of the first row of each group
    groups: list[int] = []
    for g in range(meta.num_row_groups):
        rows = meta.row_group(g).num_rows
        if first + rows > start_after:
            groups.append(g)
        else:
            first += rows
    if not groups:
        return
    row = first
    for batch in pf.iter_batches(batch_size=4096, row_groups=groups, columns=wanted):
        for values in batch.to_pylist():
            row += 1
            if row <= start_after:
                continue
            yield Record(row, values)


def _type(value: Any) -> str:
    return {list: "an array", str: "a string", int: "a number", float: "a number"}.get(
        type(value), "null" if value is None else type(value).__name__
    )
