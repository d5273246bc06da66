"""Parsing: a memory text's subject, attribute, qualifiers and instance, read with the word tables
of :mod:`.vocab` (hand-written; the spaCy claims of :mod:`engine.gate.claims` are the general
signals). Analyses are memoised because stored memories are compared again and again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from engine.gate.keys.vocab import (
    _ADJECTIVES,
    _ATTRIBUTE_OF,
    _AUX,
    _CANONICAL_TRIGGER,
    _CHANGE_CUE,
    _CHANGE_VERBS,
    _COPULAS,
    _DETERMINERS,
    _DIRECTION_AFTER,
    _FAMILY,
    _GENERIC_HEADS,
    _IDENT,
    _IMPERATIVES,
    _INSTANCE_BLOCKERS,
    _INSTANCE_MARKERS,
    _INTRODUCERS,
    _LABEL_LIMIT,
    _NAME_MORPHOLOGY,
    _NEVER_NAMES,
    _NOT_VERB_ED,
    _NUMBER_WORDS,
    _POSSESSIVE_PRONOUNS,
    _POST_LINKS,
    _PRE_VERB,
    _PREPOSITIONS,
    _REGION_CODES,
    _RELATION_NOUNS,
    _ROLE_NOUNS,
    _SUBJECT_PRONOUNS,
    _TIME_WORDS,
    _TITLES,
    _TOKEN,
    _TRIGGERS,
    _UNIT_AFTER,
    _UNIT_NOUNS,
    _UNIT_NUMBER,
    _VALUE_PREPOSITIONS,
    _VERBS,
    _VOCABULARY,
    Family,
)

__all__ = ["AttributeKey", "infer_key"]


@dataclass(frozen=True, slots=True)
class AttributeKey:
    """What a memory is about: ``str(key)`` is ``subject/attribute[qualifiers]``.

    ``subject`` is a slug ("maya", "customer.manager", "staging_database"), or None when the text
    does not name one; ``qualifiers`` are ``family:value`` tags ("direction:return").
    """

    subject: str | None
    attribute: str
    qualifiers: frozenset[str] = frozenset()

    def __str__(self) -> str:
        text = f"{self.subject or '*'}/{self.attribute}"
        if self.qualifiers:
            text += "[" + ",".join(sorted(self.qualifiers)) + "]"
        return text


@dataclass(frozen=True, slots=True)
class _Token:
    text: str
    low: str
    poss: bool
    punct: bool


@dataclass(frozen=True, slots=True)
class _Subject:
    kind: str
    """name, role, self, pron (he/she/they: any person) or thing."""
    root: tuple[str, ...]
    path: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()
    proper: frozenset[str] = frozenset()
    """Capitalised modifiers of a thing ("leeds" in "the Leeds office")."""
    head: str = ""
    """Head noun of a thing ("office")."""

    def slug(self) -> str:
        root = "_".join(self.root) if self.root else self.kind
        return ".".join((root, *self.path))


@dataclass(frozen=True, slots=True)
class _Features:
    subject: _Subject | None
    attribute: str | None
    qualifiers: dict[str, frozenset[str]]
    instance: str | None
    ordinals: frozenset[str]
    lowercase_words: frozenset[str]
    words: frozenset[str]
    copula_value: str | None
    """First word of the value in "X is <value>" / "X: <value>" (lower-cased), if any."""
    change_cue: bool
    introduced: frozenset[str]
    """Nouns introduced with an indefinite or a count ("has a dog", "two sons")."""


def _tokenize(text: str) -> list[_Token]:
    tokens = []
    for match in _TOKEN.finditer(text):
        word = match["word"]
        if word is None:
            tokens.append(_Token(match["punct"], match["punct"], False, True))
        else:
            low = word.lower().replace("’", "'")
            tokens.append(_Token(word, low, match["poss"] is not None, False))
    return tokens


def _is_verb(tokens: list[_Token], i: int) -> bool:
    token = tokens[i]
    low = token.low
    if token.punct:
        return False
    if i and (tokens[i - 1].poss or tokens[i - 1].low in _DETERMINERS) and low not in _AUX:
        return False  # "Silverpine's invoices", "the trains": a noun after a determiner
    if low in _AUX or low in _PRE_VERB or low in _VERBS:
        return not (low in {"used"} and i + 1 < len(tokens) and tokens[i + 1].low != "to")
    if low.endswith("ed") and len(low) >= 5 and low not in _NOT_VERB_ED and "-" not in low:
        # "Checked bag", "Ruth's preferred window": a participle before a noun is an adjective.
        before = tokens[i - 1] if i else None
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        attributive = (before is None or before.poss or before.low in _DETERMINERS) and (
            after is not None
            and not after.punct
            and after.text[:1].islower()
            and after.low not in _DETERMINERS | _PREPOSITIONS | _AUX
        )
        return not attributive
    return False


def _looks_like_verb(low: str) -> bool:
    """A third-person verb after a name ("Dalia checks"), as opposed to a noun ("Best time")."""
    return low.endswith("s") and not low.endswith(("ss", "us", "is")) or low.endswith("ed")


def _is_name(tokens: list[_Token], i: int, all_lower: bool) -> bool:
    token = tokens[i]
    text, low = token.text, token.low
    if token.punct or any(ch.isdigit() for ch in text):
        return False
    # Mid-sentence a capital letter is a strong cue ("Grace's son Max"); at the start it is not.
    stoplist = _VOCABULARY if i == 0 else _NEVER_NAMES
    if low in stoplist:
        return False
    if text[:1].isupper():
        if text.isupper() and len(text) <= 4 and not token.poss:
            return False  # an acronym (IT, AP, HR), not a person or company
        if i == 0 and not token.poss and _NAME_MORPHOLOGY.search(low) and len(low) >= 6:
            return False
        return True
    # Chat-style lower-case text: "otto upgraded..." / "colette's shop".
    return (all_lower or token.poss) and i == 0 and not _NAME_MORPHOLOGY.search(low)


def _subject_region(tokens: list[_Token]) -> tuple[int, bool]:
    """Index where the subject noun phrase ends, and whether the text is a ``label: value``."""
    limit = min(len(tokens), _LABEL_LIMIT)
    for i in range(limit):
        if tokens[i].low in _AUX or tokens[i].low in {";"}:
            break
        if tokens[i].low == ":":
            return i, True
    if tokens and tokens[0].low in _IMPERATIVES:
        return 0, False  # an instruction ("Respond in French") has no subject
    for i in range(len(tokens)):
        if tokens[i].punct and tokens[i].low in {":", ";", "—", "–", "("}:
            return i, False
        if _is_verb(tokens, i):
            return i, False
    return len(tokens), False


def _skip_titles(tokens: list[_Token], i: int) -> int:
    while i < len(tokens) and (tokens[i].low in _TITLES or tokens[i].low == "."):
        i += 1
    return i


def _name_run(tokens: list[_Token], i: int, end: int, all_lower: bool) -> int:
    """End of a run of name tokens starting at ``i`` ("Sunita Joshi", "Baymark Cargo UK")."""
    j = _skip_titles(tokens, i)
    if j >= end or not _is_name(tokens, j, all_lower):
        return i
    j += 1
    while (
        j < end
        and not tokens[j - 1].poss
        and (_is_name(tokens, j, False) or tokens[j].text in _REGION_CODES)
    ):
        j += 1
    return j


def _parse_subject(tokens: list[_Token], end: int, all_lower: bool) -> tuple[_Subject | None, int]:
    """The subject at the start of the text and the index of the first token after it."""
    if not tokens:
        return None, 0
    i = 0
    first = tokens[0]
    if first.low in _SUBJECT_PRONOUNS and not first.poss:
        return _Subject(_SUBJECT_PRONOUNS[first.low], ()), 1
    kind = ""
    root: tuple[str, ...] = ()
    if first.low in _POSSESSIVE_PRONOUNS:
        kind = "self" if first.low in {"my", "our"} else "pron"
        i = 1
        # "Our support contact": the possessive pronoun owns what follows; nothing more to read.
        if i < end and tokens[i].low not in _RELATION_NOUNS:
            return None, i
    elif first.low in _DETERMINERS:
        i = 1
    if not kind:
        run = _name_run(tokens, i, end, all_lower)
        if (
            run > i
            and not tokens[run - 1].poss
            and run < end
            and tokens[run].text[:1].islower()
            and not _looks_like_verb(tokens[run].low)
        ):
            run = i  # "Best time to call Tobias", "Crash-free rate": a modifier, not a name
        if run > i:
            kind = "name"
            root = tuple(t.low for t in tokens[i:run] if t.low not in _TITLES and t.low != ".")
            i = run
        elif i < end and tokens[i].low in _ROLE_NOUNS:
            kind, root = "role", (tokens[i].low.rstrip("s"),)
            i += 1
        else:
            # A thing ("the search cluster", "staging"): the noun phrase up to its possessive.
            j = i
            while j < end and not tokens[j].poss and not tokens[j].punct:
                if tokens[j].low in _PREPOSITIONS:
                    break
                j += 1
            stop = j + 1 if j < end and tokens[j].poss else j
            phrase = [t for t in tokens[i:stop] if not _is_id(t)]
            words = tuple(t.low for t in phrase if t.low not in _TRIGGERS) or tuple(
                t.low for t in phrase
            )
            # "The Leeds office" vs "The York office": proper-noun modifiers of one head noun.
            proper = frozenset(
                t.low for t in phrase[:-1] if t.text[:1].isupper() and t is not tokens[0]
            )
            head = phrase[-1].low if phrase else ""
            thing = _Subject("thing", words, proper=proper, head=head) if words else None
            return thing, (stop if stop > j else i)
        if not tokens[i - 1].poss:
            return _Subject(
                kind, root, names=frozenset(root[:1]) if kind == "name" else frozenset()
            ), i
    # Possessive chain: "Maya's", "Maya's son's", "the customer's manager", "Ada's husband Jim".
    path: list[str] = []
    names: set[str] = set()
    while i < end:
        token = tokens[i]
        age = _FAMILY["age"].values
        if (
            token.low in {v for vs in age.values() for v in vs}
            and i + 1 < end
            and (tokens[i + 1].low in _RELATION_NOUNS)
        ):
            i += 1
            continue
        if token.low not in _RELATION_NOUNS:
            break
        path.append(token.low)
        i += 1
        while i < end and tokens[i].low == ",":
            i += 1
        run = _name_run(tokens, i, end, all_lower=False)
        if run > i:
            names.add(tokens[_skip_titles(tokens, i)].low)
            i = run
            while i < end and tokens[i].low == ",":
                i += 1
        if not tokens[i - 1].poss:
            break
    if kind == "name" and not path:
        names.add(root[0])
    return _Subject(kind, root, tuple(path), frozenset(names)), i


def _head_attribute(tokens: list[_Token], start: int, end: int) -> str | None:
    """The canonical attribute named by the noun phrase ``tokens[start:end]``."""
    words: list[str] = []
    depth = 0
    for token in tokens[start:end]:
        if token.low in {"(", ")"}:
            depth += 1 if token.low == "(" else -1
            continue
        if depth > 0:
            continue
        if token.punct or token.low in _PREPOSITIONS:
            break
        if (
            token.low in _DETERMINERS
            or token.low in _ADJECTIVES
            or token.low in _TIME_WORDS
            or token.text in _REGION_CODES
            or any(ch.isdigit() for ch in token.low)
            or token.low.startswith("#")
        ):
            continue
        words.append(token.low)
    if not words:
        return None
    head = words[-1]
    if head in _ATTRIBUTE_OF:
        return _ATTRIBUTE_OF[head]
    if head in _GENERIC_HEADS and len(words) > 1:
        previous = words[-2]
        if previous in _ATTRIBUTE_OF:
            return _ATTRIBUTE_OF[previous]
        return f"{_lemma(previous)}_{head}"
    if head in _TRIGGERS or head in _NUMBER_WORDS:
        return None  # "UK arm", "secondary": a qualifier without its attribute
    if len(words) > 1 and words[-2] not in _TRIGGERS and words[-2] not in _VOCABULARY:
        return f"{_lemma(words[-2])}_{_lemma(head)}"  # "data nodes" vs "master nodes"
    return _lemma(head)


def _lemma(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is", "ics")):
        return word[:-1]
    return word


_PREDICATE_ATTRIBUTES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(?:\w+\s+){0,2}(?:lives|living|lived|resides|based)\s+in\b"), "home_city"),
    (re.compile(r"^(?:\w+\s+){0,2}(?:moved|relocated|emigrated)\s+(?:back\s+)?to\b"), "home_city"),
    (re.compile(r"^(?:\w+\s+){0,2}lives\s+at\b"), "address"),
    (re.compile(r"\b(?:plan|tier|subscription|package|edition)\b"), "plan"),
    (re.compile(r"\b(?:seats?|licen[cs]es)\b"), "seats"),
    (re.compile(r"\ballergic\b|\ballerg(?:y|ies)\b"), "allergy"),
    (
        re.compile(
            r"^(?:\w+\s+){0,2}(?:(?:works?|working|worked)\s+(?:at|for|as|in)|employed|quit"
            r"|joined|hired|promoted|became|teaches|teaching)\b"
            r"|^is an? [\w-]+(?: [\w-]+)? (?:at|for|with)\b"
        ),
        "job",
    ),
    (re.compile(r"\bappointment\b"), "appointment"),
    (
        re.compile(
            r"^(?:\w+\s+){0,2}(?:prefers|prefer|likes|wants|would rather)\b.*\b(?:calls?|phone"
            r"|e-?mails?|texts?|sms|whatsapp|messages?|slack|teams|video|voice)\b"
        ),
        "contact_channel",
    ),
    (
        re.compile(r"^(?:\w+\s+){0,2}(?:takes|taking|prescribed|on)\b.*\b\d+\s*(?:mg|mcg|ml|iu)\b"),
        "medication",
    ),
    (re.compile(r"^(?:\w+\s+){0,2}(?:opens|closes)\b"), "opening_hours"),
    (re.compile(r"\b(?:headquartered|head office|hq)\b"), "home_city"),
    (re.compile(r"\b(?:on|to|version|release|v)\s*v?\d+\.\d+"), "version"),
)


# "renewed his driving licence", "updated her billing address": the object right after the verb.
_OBJECT_NP = re.compile(
    r"^(?:\w+\s+){1,2}?(?:his|her|their|its|my|our)\s+([\w-]+(?:\s+[\w-]+){0,3})"
)


_PRODUCT_VERSION = re.compile(
    r"\b([A-Z][\w.+-]*(?:\s+[A-Z][\w.+-]*)?|[a-z][\w.+-]*)\s+(?:from\s+)?v?(\d+(?:\.\d+)*)"
    r"(?![-/:\w])"
)


def _version_attribute(text: str) -> str | None:
    for match in _PRODUCT_VERSION.finditer(text):
        product = match[1]
        low = product.lower()
        words = low.split()
        if (
            (product.isupper() and len(product) <= 3)
            or words[-1] in _VOCABULARY
            or words[-1] in _UNIT_AFTER
        ):
            continue
        rest = text[match.end() :].lstrip().lower()
        if rest.split(" ", 1)[0].strip(".,;") in _UNIT_AFTER:
            continue
        if not (product[:1].isupper() or "." in match[2] or text.islower()):
            continue
        return re.sub(r"[^a-z0-9]+", "_", low).strip("_") + "_version"
    return None


def _qualifiers(tokens: list[_Token], region_end: int) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    n = len(tokens)
    for i, token in enumerate(tokens):
        pairs = _TRIGGERS.get(token.low)
        if not pairs or token.punct:
            continue
        trigger = _CANONICAL_TRIGGER.get(token.low, token.low)
        for family_name, value in pairs:
            family = _FAMILY[family_name]
            if _counts(tokens, i, trigger, family, region_end, n):
                found.setdefault(family_name, set()).add(value)
    # "flight back", "flight home", "flight out": a direction after its head noun.
    direction = _FAMILY["direction"]
    for k in range(len(tokens) - 1):
        if tokens[k].low in (direction.heads or ()) and tokens[k + 1].low in _DIRECTION_AFTER:
            found.setdefault("direction", set()).add(_DIRECTION_AFTER[tokens[k + 1].low])
    # Region codes in the subject mark a regional arm ("Baymark Cargo UK's headquarters").
    if any(t.text in _REGION_CODES for t in tokens[:region_end]):
        found.setdefault("scope", set()).add("local")
    # Identifiers in the subject tell instances apart ("Order #A-20417 ..." vs "Order #A-20433").
    ids = {t.low for t in tokens[:region_end] if _is_id(t)}
    ids |= {
        f"{tokens[k].low} {tokens[k + 1].low}"
        for k in range(min(region_end, len(tokens) - 1))
        if tokens[k].low in _UNIT_NOUNS and _UNIT_NUMBER.match(tokens[k + 1].text)
    }
    if ids:
        found.setdefault("id", set()).update(ids)
    return found


def _counts(
    tokens: list[_Token], i: int, trigger: str, family: Family, region_end: int, n: int
) -> bool:
    if trigger in family.loose:
        # Anywhere, except as a destination: "deployed to production" is a value, not a scope.
        return not (i and tokens[i - 1].low in {"to", "into", "from", "onto"})
    heads = family.heads
    if heads is not None and _post_modifies(tokens, i, heads):
        return True  # "mobile for work", "allowance on the return", "size L in tops"
    if i >= region_end and _in_value(tokens, i, region_end):
        return False  # "Maya is now on the support team": the qualifier is the new value
    if heads is None:
        if i < region_end:
            return True
        before = tokens[i - 1] if i else None
        after = tokens[i + 1] if i + 1 < n else None
        return bool(
            before is not None
            and (before.low in _DETERMINERS or before.poss)
            and after is not None
            and not after.punct
            and after.low not in _PREPOSITIONS | _AUX | _DETERMINERS
            and not _is_verb(tokens, i + 1)
        )
    if i < region_end and (
        trigger in heads
        or (
            (i == 0 or tokens[i - 1].poss or tokens[i - 1].low in _DETERMINERS)
            and (i + 1 == region_end or tokens[i + 1].punct or tokens[i + 1].low in _PREPOSITIONS)
        )
    ):
        return True  # "Amira's mobile changed", "Ben's eldest goes": the trigger is the head noun
    # Pre-modifier: "billing address", "return flight", "right knee", "personal mobile number".
    for j in range(i + 1, min(n, i + 4)):
        if tokens[j].punct or tokens[j].low in _PREPOSITIONS or tokens[j].low in _AUX:
            break
        if tokens[j].low in heads:
            return True
    return False


def _post_modifies(tokens: list[_Token], i: int, heads: frozenset[str]) -> bool:
    """A qualifier after its head: "mobile for work", "bags on the return", "size L in tops"."""
    if not i or tokens[i - 1].low not in _POST_LINKS:
        return False
    for j in range(i - 1, max(-1, i - 5), -1):
        if tokens[j].punct and tokens[j].low not in {"(", ","}:
            return False
        if tokens[j].low in heads:
            between = tokens[j + 1 : i]
            content = [t for t in between if t.low not in _POST_LINKS]
            linked = any(t.low in {"for", "on", "in", "of", "at"} for t in between)
            return linked and len(content) <= 1
    return False


def _in_value(tokens: list[_Token], i: int, region_end: int) -> bool:
    """Whether the noun phrase around ``tokens[i]`` is a value: after a copula or a change."""
    j = i - 1
    while j >= region_end and (
        tokens[j].low in _DETERMINERS or tokens[j].low in _POSSESSIVE_PRONOUNS or tokens[j].poss
    ):
        j -= 1
    if j < region_end or tokens[j].punct:
        return j >= 0 and tokens[j].low == ":" and j == region_end
    low = tokens[j].low
    if low in _COPULAS:
        return True  # "is the billing contact", "joined the sales team"
    if low not in _VALUE_PREPOSITIONS:
        return False
    # "is on the support team", "moved to the night shift": a preposition after a copula or a
    # change verb introduces the value; "surgery on his left knee" is a plain modifier.
    k = j - 1
    while k >= region_end and tokens[k].low in _PRE_VERB:
        k -= 1
    if k < 0:
        return False
    before = tokens[k].low
    return (
        before in _COPULAS
        or before in _CHANGE_VERBS
        or (k >= region_end and _is_verb(tokens, k))
        or (k < region_end and low in {"to", "from"})
    )


def _copula_value(tokens: list[_Token], region_end: int) -> str | None:
    i = region_end
    if i >= len(tokens) or tokens[i].low not in {"is", "are", "was", "were", ":"}:
        return None
    i += 1
    while i < len(tokens) and (
        tokens[i].low in _PRE_VERB
        or tokens[i].low in _DETERMINERS
        or tokens[i].low in _TITLES
        or tokens[i].low == "."
    ):
        i += 1
    return tokens[i].low if i < len(tokens) else None


def _is_id(token: _Token) -> bool:
    return bool(_IDENT.match(token.text))


def _instance(tokens: list[_Token]) -> str | None:
    for i, token in enumerate(tokens):
        marker = _INSTANCE_MARKERS.get(token.low)
        if marker is None or i + 1 >= len(tokens) or tokens[i + 1].punct:
            continue
        if token.low != "another" and (i == 0 or tokens[i - 1].low not in {"a", "an", "one"}):
            continue
        window = {t.low for t in tokens[max(0, i - 3) : i]}
        if window & _INSTANCE_BLOCKERS or tokens[i + 1].low in _PREPOSITIONS:
            continue
        return marker
    return None


@lru_cache(maxsize=8192)
def _analyse(text: str) -> _Features:
    tokens = _tokenize(text)
    # Discourse openers carry no subject: "Update: ...", "FYI, ...".
    while (
        tokens
        and tokens[0].low in {"update", "fyi", "btw", "note", "also", "ok", "so"}
        and (len(tokens) > 1 and tokens[1].punct)
    ):
        tokens = tokens[2:]
    all_lower = not any(ch.isupper() for ch in text)
    region_end, label = _subject_region(tokens)
    subject, after = _parse_subject(tokens, region_end, all_lower)
    if label and subject is not None and subject.kind == "thing":
        subject = None  # "Billing address: ..." names an attribute, not a subject
    attribute = _version_attribute(text)
    if attribute is None and after < region_end:
        attribute = _head_attribute(tokens, after, region_end)
    if attribute is None and subject is not None and subject.kind == "thing" and not label:
        attribute = _head_attribute(tokens, 0, region_end) if region_end else None
    if attribute is None or subject is None or subject.kind != "thing":
        predicate = " ".join(t.low for t in tokens[region_end:] if not t.punct)
        for pattern, name in _PREDICATE_ATTRIBUTES:
            if pattern.search(predicate):
                attribute = attribute or name
                break
        if attribute is None and (obj := _OBJECT_NP.search(predicate)):
            attribute = _head_attribute(_tokenize(obj[1]), 0, len(obj[1].split()))
    qualifiers = _qualifiers(tokens, region_end)
    ordinals = frozenset(
        t.low for t in tokens if t.low in _INSTANCE_MARKERS or t.low in {"first", "primary"}
    )
    lowercase = frozenset(t.low for t in tokens if t.text[:1].islower())
    words = frozenset(_lemma(t.low) for t in tokens if not t.punct) | frozenset(
        t.low for t in tokens if not t.punct
    )
    return _Features(
        words=words,
        copula_value=_copula_value(tokens, region_end),
        change_cue=bool(_CHANGE_CUE.search(text)),
        introduced=frozenset(
            _lemma(tokens[k + 1].low)
            for k in range(len(tokens) - 1)
            if tokens[k].low in _INTRODUCERS and not tokens[k + 1].punct
        ),
        subject=subject,
        attribute=attribute,
        qualifiers={k: frozenset(v) for k, v in qualifiers.items()},
        instance=_instance(tokens),
        ordinals=ordinals,
        lowercase_words=lowercase,
    )


def infer_key(text: str) -> AttributeKey | None:
    """The attribute key a memory text is about, or None when no attribute can be named.

    >>> str(infer_key("Maya's billing address is 4 Elm Row, Leeds."))
    'maya/address[address:billing]'
    """
    features = _analyse(text)
    if features.attribute is None:
        return None
    qualifiers = frozenset(
        f"{family}:{value}" for family, values in features.qualifiers.items() for value in values
    )
    subject = features.subject.slug() if features.subject is not None else None
    if features.subject is not None and features.subject.kind in {"pron", "thing"}:
        subject = None if features.subject.kind == "pron" else subject
    return AttributeKey(subject=subject, attribute=features.attribute, qualifiers=qualifiers)
