"""The shared store core's pure parts: the dialect objects and how a Session sends statements
(a recording connection stands in for the driver; the queries themselves run on real SQLite
and PostgreSQL in tests/integration/test_store.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from typing import Any

import pytest

from engine.errors import InvalidInput
from engine.store import _sql
from engine.store._sql import Dialect, Session
from engine.store.sqlite import DIALECT as SQLITE


class _Recorder:
    """Records each ``execute`` and answers one row per call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, sql: str, params: Any = ()) -> list[tuple[int]]:
        self.calls.append((sql, tuple(params)))
        return [(len(self.calls),)]


def _postgres() -> Dialect:
    pytest.importorskip("psycopg")
    from engine.store.postgres import DIALECT

    return DIALECT


def _dialects() -> list[Dialect]:
    if importlib.util.find_spec("psycopg") is None:
        return [SQLITE]
    return [SQLITE, _postgres()]


def test_sqlite_sends_statements_unchanged_postgres_in_its_placeholders() -> None:
    sql = "SELECT a FROM t WHERE b = ? AND c = ?"
    assert SQLITE.sql(sql) is sql
    assert _postgres().sql(sql) == "SELECT a FROM t WHERE b = %s AND c = %s"


@pytest.mark.parametrize("dialect", _dialects(), ids=lambda d: d.name)
def test_dialect_statements_take_the_parameters_the_core_binds(dialect: Dialect) -> None:
    # The core binds 7 values to an event and 1 to the seq query; a literal % or ? would be
    # mangled by the placeholder rewrite, so none may appear.
    assert dialect.event_sql.count("?") == 7
    assert dialect.seq_sql.count("?") == 1
    assert "?" not in dialect.namespaces_sql
    for text in (dialect.event_sql, dialect.seq_sql, dialect.namespaces_sql):
        assert "%" not in text


def test_core_statements_hold_no_literal_percent_and_count_their_parameters() -> None:
    statements = {
        name: value
        for name, value in vars(_sql).items()
        if name.isupper() and name.startswith("_") and isinstance(value, str)
    }
    assert {"_INSERT_MEMORY", "_INSERT_REVIEW", "_HISTORY", "_CHANGED"} <= set(statements)
    for name, text in statements.items():
        assert "%" not in text, name
    # What the core binds to each (see SQLStore._insert_memory, _apply, history, changes_since).
    assert statements["_INSERT_MEMORY"].count("?") == 13
    assert statements["_INSERT_REVIEW"].count("?") == 9
    assert statements["_HISTORY"].count("?") == 5
    assert statements["_CHANGED"].count("?") == 6


def test_rows_in_chunks_ids_for_sqlite() -> None:
    conn = _Recorder()
    values = list(range(1201))
    rows = list(Session(conn, SQLITE).rows_in("SELECT x FROM t WHERE ns = ? AND id", "n", values))
    assert rows == [(1,), (2,), (3,)]
    sizes = [len(params) - 1 for _, params in conn.calls]
    assert sizes == [500, 500, 201]
    for sql, params in conn.calls:
        assert params[0] == "n"
        marks = re.search(r"IN \(([?,]*)\)$", sql)
        assert marks is not None and marks.group(1).count("?") == len(params) - 1
    assert [v for _, params in conn.calls for v in params[1:]] == values


def test_rows_in_binds_one_array_for_postgres() -> None:
    conn = _Recorder()
    session = Session(conn, _postgres())
    list(session.rows_in("SELECT x FROM t WHERE ns = ? AND id", "n", [3, 1], " ORDER BY x"))
    assert conn.calls == [
        ("SELECT x FROM t WHERE ns = %s AND id = ANY(%s) ORDER BY x", ("n", [3, 1]))
    ]


def test_empty_id_lists() -> None:
    # SQLite runs no statement for no ids; PostgreSQL binds an empty array (one statement).
    conn = _Recorder()
    assert list(Session(conn, SQLITE).rows_in("SELECT x FROM t WHERE ns = ? AND id", "n", [])) == []
    assert conn.calls == []
    list(Session(conn, _postgres()).rows_in("SELECT x FROM t WHERE ns = ? AND id", "n", []))
    assert conn.calls == [("SELECT x FROM t WHERE ns = %s AND id = ANY(%s)", ("n", []))]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"placeholder": ":name"}, "placeholder"),
        ({"max_in": 0}, "max_in"),
        ({"max_in": 40_000}, "max_in"),
        ({"event_sql": " "}, "event_sql"),
        ({"review_order": ""}, "review_order"),
    ],
)
def test_a_bad_dialect_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        dataclasses.replace(SQLITE, **change)


def test_backends_differ_where_their_databases_do() -> None:
    pg = _postgres()
    assert (SQLITE.max_in, pg.max_in) == (500, None)
    assert (SQLITE.returning, pg.returning) == (False, True)
    # A failed SQLite store refuses every call, even an empty one; PostgreSQL answers those
    # without a pool connection.
    assert (SQLITE.skip_empty, pg.skip_empty) == (False, True)
    # SQLite numbers events by AUTOINCREMENT; PostgreSQL bumps a per-namespace counter.
    assert "seq" not in SQLITE.event_sql and "INSERT INTO namespaces" in pg.event_sql


def test_the_core_exports_what_it_names_and_both_backends_build_on_it() -> None:
    assert sorted(_sql.__all__) == ["Dialect", "SQLStore", "Session"]
    assert all(hasattr(_sql, name) for name in _sql.__all__)
    from engine.store.sqlite import SQLiteStore

    assert issubclass(SQLiteStore, _sql.SQLStore) and SQLiteStore.dialect is SQLITE
    pytest.importorskip("psycopg")
    from engine.store.postgres import DIALECT, PostgresStore

    assert issubclass(PostgresStore, _sql.SQLStore) and PostgresStore.dialect is DIALECT
