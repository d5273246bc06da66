"""The one namespace rule (engine.validation): pure, no models."""

from __future__ import annotations

import pytest

from engine.errors import InvalidInput
from engine.validation import MAX_NAMESPACE_CHARS, check_namespace, is_namespace

GOOD = ["a", "acme/alice", "A0_.:/@-z", "9lives", "x" * MAX_NAMESPACE_CHARS]
BAD = [
    "",
    "nltest\n",  # `$` in a `^...$` pattern lets a trailing newline through
    "x" * MAX_NAMESPACE_CHARS + "\n",
    "x" * (MAX_NAMESPACE_CHARS + 1),
    "acme corp",
    "-lead",
    "/lead",
    "tab\tin",
    "caf\u00e9",
    "\u0661\u0662",  # Arabic-Indic digits: \d would take them, the rule does not
    "nul\x00",
    None,
    42,
]


@pytest.mark.parametrize("value", GOOD)
def test_valid_namespaces_pass(value: str) -> None:
    assert is_namespace(value) and check_namespace(value) == value


@pytest.mark.parametrize("value", BAD, ids=repr)
def test_invalid_namespaces_are_refused(value: object) -> None:
    assert not is_namespace(value)
    with pytest.raises(InvalidInput, match="namespace must be 1-128 characters"):
        check_namespace(value)
