"""Open a store from one spec: a SQLite file path, or a ``postgresql://`` DSN.

The spec may come from the command line (``--store``) or the environment (``MEMGATE_STORE``,
read by the CLI only). A DSN's password never leaves this package unmasked: every message
that names a DSN names :func:`~engine.store.dsn.mask_dsn` of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import InvalidInput
from engine.store.base import StoreSettings
from engine.store.dsn import is_dsn, mask_dsn

__all__ = ["is_dsn", "mask_dsn", "open_store"]


def open_store(
    spec: str | Path,
    settings: StoreSettings = StoreSettings(),  # noqa: B008 - frozen, so sharing is safe
    **options: Any,
) -> Any:
    """The store ``spec`` names: a :class:`~engine.store.postgres.PostgresStore` for a
    ``postgresql://`` DSN (needs the ``postgres`` extra), else a
    :class:`~engine.store.sqlite.SQLiteStore` on that file (its directory is created).
    ``options`` go to the store's constructor (``clock=``, PostgreSQL's ``pg=``)."""
    if isinstance(spec, str) and not spec.strip():
        raise InvalidInput("the store spec is empty: give a SQLite path or a postgresql:// DSN")
    if is_dsn(spec):
        try:
            from engine.store.postgres import PostgresStore
        except ImportError as exc:
            raise InvalidInput(
                "a postgresql:// store needs the `postgres` extra: "
                "pip install 'memgate[postgres]' (psycopg and psycopg-pool)"
            ) from exc
        return PostgresStore(str(spec).strip(), settings, **options)
    from engine.store.sqlite import SQLiteStore

    path = Path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteStore(path, settings, **options)
