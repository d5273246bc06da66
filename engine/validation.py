"""Checks of request fields that every entry point shares (pure: no I/O, no heavy imports).

One namespace rule serves every RPC, the gate and the command line, so a namespace that one
call accepts is one that every other call accepts too (before, Write accepted ``"ns\\n"``
through a ``^...$`` pattern that Get then refused, leaving memories nobody could forget).
"""

from __future__ import annotations

import re

from engine.errors import InvalidInput

__all__ = ["MAX_NAMESPACE_CHARS", "NAMESPACE_RULE", "check_namespace", "is_namespace"]

MAX_NAMESPACE_CHARS = 128
"""Longest namespace, in characters."""

NAMESPACE_RULE = (
    f"namespace must be 1-{MAX_NAMESPACE_CHARS} characters of letters, digits and _ . : / @ -, "
    "starting with a letter or digit"
)
"""The rule in words, as every refusal states it."""

# fullmatch and ASCII classes: no trailing newline (``$`` allows one), no Unicode digits.
_NAMESPACE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.:/@-]{{0,{MAX_NAMESPACE_CHARS - 1}}}")


def is_namespace(value: object) -> bool:
    """True when ``value`` is a valid namespace."""
    return isinstance(value, str) and _NAMESPACE.fullmatch(value) is not None


def check_namespace(value: object) -> str:
    """``value`` when it is a valid namespace, else :class:`~engine.errors.InvalidInput`."""
    if not is_namespace(value):
        raise InvalidInput(NAMESPACE_RULE)
    assert isinstance(value, str)
    return value
