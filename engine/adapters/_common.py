"""Pure helpers shared by the adapters: the namespace mapping and the missing-extra check."""

from __future__ import annotations

import re

from engine.errors import InvalidInput

__all__ = ["decode_labels", "encode_labels", "missing_extra"]

# Characters a memgate namespace allows besides the separator "/" and the escape ".".
_PLAIN = re.compile(r"[A-Za-z0-9_:@-]")
_ESCAPE = re.compile(r"\.([0-9A-F]{2})")
_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_:@-]{0,63}$")
_MAX_NAMESPACE = 128


def missing_extra(extra: str, package: str, then: str = "") -> ImportError:
    """The error for an adapter whose framework is not installed: it names the extra (and
    ``then``, a further install step where the extra cannot carry the package itself)."""
    return ImportError(
        f"the {extra} adapter needs the {package!r} package: pip install 'memgate[{extra}]'"
        + (f" && {then}" if then else "")
    )


def _escape(label: str) -> str:
    return "".join(
        ch if _PLAIN.fullmatch(ch) else "".join(f".{b:02X}" for b in ch.encode("utf-8"))
        for ch in label
    )


def _unescape(part: str) -> str:
    out = bytearray()
    i = 0
    while i < len(part):
        if part[i] == ".":
            if not _ESCAPE.match(part, i):
                raise InvalidInput(f"bad escape in namespace part {part!r}")
            out.append(int(part[i + 1 : i + 3], 16))
            i += 3
        else:
            out.extend(part[i].encode("ascii"))
            i += 1
    return out.decode("utf-8")


def encode_labels(prefix: str, labels: tuple[str, ...]) -> str:
    """``prefix/label/label...`` with every label character outside ``[A-Za-z0-9_:@-]`` written
    as ``.XX`` (its UTF-8 bytes in upper-case hex). LangGraph labels never contain ``.``, and
    the mapping is reversible (:func:`decode_labels`); the result obeys memgate's namespace rule
    (1-128 characters of letters, digits and ``_ . : / @ -``, starting with a letter or digit)."""
    if not _PREFIX.match(prefix):
        raise InvalidInput(
            f"namespace prefix {prefix!r} must be 1-64 letters, digits or _ : @ -, "
            "starting with a letter or digit"
        )
    if not labels:
        raise InvalidInput("a namespace needs at least one label")
    if any(not isinstance(label, str) or not label for label in labels):
        raise InvalidInput(f"namespace labels must be non-empty strings: {labels!r}")
    name = "/".join((prefix, *(_escape(label) for label in labels)))
    if len(name) > _MAX_NAMESPACE:
        raise InvalidInput(
            f"namespace {labels!r} maps to {len(name)} characters ({name!r}); memgate allows "
            f"{_MAX_NAMESPACE}: use shorter labels or a shorter prefix"
        )
    return name


def decode_labels(prefix: str, name: str) -> tuple[str, ...]:
    """The inverse of :func:`encode_labels`."""
    head, _, rest = name.partition("/")
    if head != prefix or not rest:
        raise InvalidInput(f"namespace {name!r} was not made under prefix {prefix!r}")
    return tuple(_unescape(part) for part in rest.split("/"))
