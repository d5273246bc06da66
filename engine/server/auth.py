"""API tokens bound to namespace prefixes.

A request carries ``authorization: Bearer <token>``. Each known token is bound to namespace
prefixes (``{"tok-acme": ["acme/"], "tok-admin": [""]}``); a request may touch a namespace only
when it starts with one of its token's prefixes. No token, or an unknown one: ``Unauthenticated``.
A namespace outside the prefixes: ``PermissionDenied``. With no token table, auth is off and
every namespace is open (the server logs a warning at start).

Tokens are kept only as SHA-256 digests, so a lookup does not compare secrets byte by byte.
Reading the tokens file is the CLI's job; this module parses its text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from engine.errors import InvalidInput, PermissionDenied, Unauthenticated
from engine.validation import check_namespace

__all__ = ["Auth", "Principal", "parse_tokens"]

_SCHEME = "bearer "


@dataclass(frozen=True)
class Principal:
    """Who is calling: the namespace prefixes its token covers (None: everything, auth off)."""

    prefixes: tuple[str, ...] | None
    name: str = "anonymous"
    """A short, non-secret label for logs (the digest's first 8 hex characters)."""

    def authorize(self, namespace: str) -> None:
        """Refuse a malformed namespace (INVALID_ARGUMENT, whatever the token), then one outside
        the token's prefixes."""
        check_namespace(namespace)
        self.permits(namespace)

    def permits(self, namespace: str) -> None:
        """Refuse a namespace outside the token's prefixes; ``namespace`` is one that the
        namespace rule already passed (a fact the engine checked)."""
        if self.prefixes is None:
            return
        if not any(namespace.startswith(p) for p in self.prefixes):
            raise PermissionDenied("this token is not allowed to use that namespace")


OPEN = Principal(None)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_tokens(text: str) -> dict[str, tuple[str, ...]]:
    """Parse a tokens file: a JSON object ``{token: [namespace prefix, ...]}``."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise InvalidInput("tokens file is not valid JSON") from None
    if not isinstance(raw, dict) or not raw:
        raise InvalidInput("tokens file must be a non-empty JSON object {token: [prefix, ...]}")
    out: dict[str, tuple[str, ...]] = {}
    for token, prefixes in raw.items():
        if not isinstance(token, str) or len(token) < 16:
            raise InvalidInput("every token must be a string of at least 16 characters")
        if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
            raise InvalidInput("every token must map to a list of namespace prefixes")
        out[token] = tuple(prefixes)
    return out


class Auth:
    """Resolves request metadata to a :class:`Principal`."""

    def __init__(self, tokens: Mapping[str, Sequence[str]] | None = None) -> None:
        self._table: dict[str, Principal] | None = None
        if tokens is not None:
            self._table = {
                _digest(tok): Principal(tuple(prefixes), _digest(tok)[:8])
                for tok, prefixes in tokens.items()
            }

    @property
    def enabled(self) -> bool:
        return self._table is not None

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Principal:
        if self._table is None:
            return OPEN
        header = next((v for k, v in metadata if k == "authorization"), None)
        if isinstance(header, bytes):
            header = header.decode("utf-8", "replace")
        if not header or not header.lower().startswith(_SCHEME):
            raise Unauthenticated("missing `authorization: Bearer <token>` metadata")
        principal = self._table.get(_digest(header[len(_SCHEME) :].strip()))
        if principal is None:
            raise Unauthenticated("unknown token")
        return principal
