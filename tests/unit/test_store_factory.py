"""open_store's spec parsing and DSN masking, and the client's replica targets (pure)."""

from __future__ import annotations

import pytest

from engine.errors import InvalidInput
from engine.store import is_dsn, mask_dsn


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgres://u:p%40ss@h/db?sslmode=require", "postgres://u:***@h/db?sslmode=require"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgresql://h/db?password=pw&x=1", "postgresql://h/db?password=***&x=1"),
        ("host=h dbname=d password=pw user=u", "host=h dbname=d password=*** user=u"),
        ("host=h password='a b' dbname=d", "host=h password=*** dbname=d"),
    ],
)
def test_passwords_are_masked(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked


@pytest.mark.parametrize(
    ("spec", "dsn"),
    [
        ("postgresql://u:pw@h/db", True),
        ("postgres://h/db", True),
        ("host=h dbname=d", True),
        ("memgate-data/memgate.db", False),
        ("/tmp/x.db", False),
    ],
)
def test_a_spec_is_a_dsn_or_a_path(spec: str, dsn: bool) -> None:
    assert is_dsn(spec) is dsn


def test_client_targets() -> None:
    from engine.client import _targets

    assert _targets("127.0.0.1:1") == ("127.0.0.1:1", False)
    assert _targets("127.0.0.1:1,127.0.0.1:2") == ("ipv4:127.0.0.1:1,127.0.0.1:2", True)
    assert _targets(["127.0.0.1:1", "127.0.0.1:2"]) == ("ipv4:127.0.0.1:1,127.0.0.1:2", True)
    assert _targets("ipv4:127.0.0.1:1,127.0.0.1:2") == ("ipv4:127.0.0.1:1,127.0.0.1:2", True)
    with pytest.raises(InvalidInput):
        _targets([])
