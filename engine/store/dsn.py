"""Telling a PostgreSQL DSN from a SQLite path, and masking a DSN's password (pure).

Its own module so that the factory and the PostgreSQL store both import it without importing
each other.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["is_dsn", "mask_dsn"]

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
