"""Comparison: how a new fact relates to a stored memory (same attribute, sibling, or unknown),
from the analyses of :mod:`.parse`; explicit keys given by API clients always win.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.gate.keys.parse import (
    _analyse,
    _Features,
    _Subject,
    infer_key,
)
from engine.gate.keys.vocab import (
    _FAMILY_ORDER,
)

__all__ = ["Relation", "compare_keys"]


@dataclass(frozen=True, slots=True)
class Relation:
    """How a new fact relates to a stored memory, judged from their text (or explicit keys)."""

    key_match: bool
    """Same subject and attribute: an update of the old memory by the new fact is plausible."""
    key_conflict: bool
    """Siblings (different subject, contrasting qualifier, another instance): never replace."""
    reason: str
    """Short machine-readable reason: ``qualifier:return!=outbound``, ``subject:leo!=clara``..."""


def _prefix_compatible(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    shorter, longer = (a, b) if len(a) <= len(b) else (b, a)
    return longer[: len(shorter)] == shorter


def _compare_subjects(
    new: _Subject | None, old: _Subject | None, new_f: _Features, old_f: _Features
) -> str:
    """``same``, ``different`` or ``unknown``."""
    verdict = _compare_subject_shapes(new, old)
    if verdict != "different" or new is None or old is None:
        return verdict
    # "Cormac is our new IT lead" vs "Stonebridge's IT lead is Cormac Dunne": the old memory names
    # the new subject as a value, so the two may well be about one fact.
    if new.kind == "name" and not new.path and new.root[0] == old_f.copula_value:
        return "unknown"
    # "Redfern's owner is Felix" vs "Redfern has a new owner, Kit" (who holds the role changed), or
    # "Piers's dog is a lagotto" vs "Piers has a dog" (the other text introduces the relation).
    for a, b_f in ((new, old_f), (old, new_f)):
        other = old if a is new else new
        if (
            a.path
            and not other.path
            and ((a.path[-1] in b_f.words and b_f.change_cue) or a.path[-1] in b_f.introduced)
        ):
            return "unknown"
    return verdict


def _compare_subject_shapes(new: _Subject | None, old: _Subject | None) -> str:
    if new is None or old is None or "thing" in (new.kind, old.kind):
        if new is not None and old is not None and new.kind == old.kind == "thing":
            if _prefix_compatible(new.root, old.root):
                return "same"
            if (
                new.head == old.head
                and new.proper
                and old.proper
                and new.proper.isdisjoint(old.proper)
            ):
                return "different"
        return "unknown"
    if new.kind == old.kind == "name" and not (new.path or old.path):
        return "same" if _prefix_compatible(new.root, old.root) else "different"
    if new.names and old.names:
        return "same" if new.names & old.names else "different"
    if new.kind == "pron" or old.kind == "pron":
        if not new.root or not old.root or _prefix_compatible(new.root, old.root):
            return "same" if new.path == old.path else "different"
        return "unknown"
    if new.kind != old.kind:
        return "unknown"
    if not _prefix_compatible(new.root, old.root):
        # Two different named people (or companies): siblings. Two roles may be one person.
        return "different" if new.kind == "name" and not (new.path or old.path) else "unknown"
    if new.path == old.path:
        return "same"
    if (new.names and not old.path) or (old.names and not new.path):
        return "unknown"
    return "different"


def _demote_common_names(subject: _Subject | None, other: _Features) -> _Subject | None:
    """A capitalised sentence opener that the other text writes in lower case is a common noun."""
    if subject is None or subject.kind != "name" or subject.path:
        return subject
    if subject.root and subject.root[0] in other.lowercase_words:
        return None
    return subject


def _slug(key: str) -> str:
    return re.sub(r"[^a-z0-9/.]+", "_", key.strip().lower()).strip("_")


# "Route 9 ...", "Bay 4 ...", "Line 12 ...": a numbered thing as the sentence's subject. Two
# texts about different numbers of the same kind are about different things (siblings).
_NUMBERED_SUBJECT = re.compile(
    r"^\s*(?:[^,]{0,30},\s*)?(?:(?:the|our|their|his|her)\s+)?(?:[A-Z][\w'-]*\s+){0,2}?"
    r"(?P<kind>[A-Z][a-z]+)\s+(?:no\.?\s*|#)?(?P<num>\d[\w-]*)\b"
)


def _numbered_subjects(new_text: str, old_text: str) -> str | None:
    a, b = _NUMBERED_SUBJECT.match(new_text), _NUMBERED_SUBJECT.match(old_text)
    if a is None or b is None or a["kind"].lower() != b["kind"].lower():
        return None
    if a["num"].lower() == b["num"].lower():
        return None
    return f"instance:{a['kind'].lower()} {a['num']}!={b['num']}"


def compare_keys(
    new_text: str, old_text: str, new_key: str | None = None, old_key: str | None = None
) -> Relation:
    """How the new fact relates to the stored memory: same attribute, sibling, or unknown.

    >>> compare_keys(
    ...     "The return flight now leaves at 18:05.", "The outbound flight leaves at 07:10."
    ... )
    Relation(key_match=False, key_conflict=True, reason='qualifier:return!=outbound')
    """
    if new_key and old_key:
        a, b = _slug(new_key), _slug(old_key)
        if a == b:
            return Relation(True, False, "explicit:equal")
        return Relation(False, True, f"explicit:{a}!={b}")
    new, old = _analyse(new_text), _analyse(old_text)

    new_subject = _demote_common_names(new.subject, old)
    old_subject = _demote_common_names(old.subject, new)
    subjects = _compare_subjects(new_subject, old_subject, new, old)
    if subjects == "different":
        assert new_subject is not None and old_subject is not None
        return Relation(False, True, f"subject:{new_subject.slug()}!={old_subject.slug()}")
    if new.instance is not None and new.instance not in old.ordinals:
        return Relation(False, True, f"instance:{new.instance}")
    for family_name in _FAMILY_ORDER:
        a_values = new.qualifiers.get(family_name)
        b_values = old.qualifiers.get(family_name)
        if a_values and b_values and not a_values & b_values:
            a_text, b_text = "+".join(sorted(a_values)), "+".join(sorted(b_values))
            return Relation(False, True, f"qualifier:{a_text}!={b_text}")
    numbered = _numbered_subjects(new_text, old_text)
    if numbered is not None:
        return Relation(False, True, numbered)

    explicit = new_key or old_key
    if explicit:
        other = infer_key(old_text if new_key else new_text)
        wanted = _slug(explicit)
        if other is not None and wanted in {other.attribute, str(other).split("[")[0]}:
            return Relation(True, False, f"explicit:{wanted}")
        return Relation(False, False, f"explicit:{wanted}?")
    if new.attribute is None or old.attribute is None:
        return Relation(False, False, "attribute:unknown")
    if subjects == "unknown" and new_subject is not None and old_subject is not None:
        return Relation(False, False, f"subject:{new_subject.slug()}?{old_subject.slug()}")
    if new.attribute != old.attribute:
        return Relation(False, False, f"attribute:{new.attribute}!={old.attribute}")
    return Relation(True, False, f"attribute:{new.attribute}")
