"""Open a store from one spec: a SQLite file path, or a ``postgresql://`` DSN.

The spec may come from the command line (``--store``) or the environment (``MEMGATE_STORE``,
read by the CLI only). A DSN's password never leaves this package unmasked: every message
that names a DSN names :func:`mask_dsn` of it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from engine.errors import InvalidInput
from engine.store.base import StoreSettings

__all__ = ["is_dsn", "mask_dsn", "open_store"]

_SCHEMES = ("postgresql://", "postgres://")
# user:password@ in a URL; password=... in a key/value DSN or a URL's query string.
_URL_PASSWORD = re.compile(r"(?P<head>://[^:/@?#]*:)(?P<pw>[^@/?#]*)(?P<tail>@)")
_KV_PASSWORD = re.compile(r"(?P<head>(?:^|[\s?&])password\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|[^\s&]*)")


def is_dsn(spec: str | Path) -> bool:
    """Whether ``spec`` names a PostgreSQL database (else it is a SQLite file path)."""
    text = str(spec).strip()
    return text.startswith(_SCHEMES) or (
        "=" in text and ("dbname=" in text or "host=" in text) and not Path(text).exists()
    )


def mask_dsn(dsn: str) -> str:
    """``dsn`` with its password, if any, replaced by ``***`` (URL and key/value forms)."""
    out = _URL_PASSWORD.sub(lambda m: m["head"] + "***" + m["tail"], dsn)
    return _KV_PASSWORD.sub(lambda m: m["head"] + "***", out)


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
