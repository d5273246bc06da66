"""Rewrite change events into current-state statements for the NLI hypothesis.

An NLI model reads "Maya moved to Austin last month." as compatible with "Maya lives in Denver.":
a move is an event, not a state, so nothing it says is false of the stored memory. The gate
therefore scores ``normalize(fact).hypothesis`` ("Maya is based in Austin.") instead of the raw
fact. Normalisation also reports *that* the text announces a change (``is_change``) and whether it
retracts a previous state (``negated``), which the decision policy may use as evidence.

Every rewrite lives in :data:`RULES`, one :class:`Rule` per row, tried in order; the first rule
whose pattern matches and whose rewrite accepts the match wins. Each rule carries an example (input
and expected hypothesis) that the unit tests run, so the table documents itself.

Pure: plain ``re``, no I/O, no model. Runs on every semantic fact, so patterns are compiled once and
a cheap trigger pattern short-circuits texts that contain no change cue at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RULES", "Normalized", "Rule", "normalize"]


@dataclass(frozen=True, slots=True)
class Normalized:
    """The current-state reading of one incoming fact."""

    hypothesis: str
    """Text to use as the NLI hypothesis; equal to the input when no rule rewrote it."""
    rule: str | None = None
    """Name of the rule that fired, or None."""
    old_value: str | None = None
    """The value the text says no longer holds ("PostgreSQL 14"), when it names one."""
    new_value: str | None = None
    """The value that holds now ("PostgreSQL 16"), when the text names one."""
    is_change: bool = False
    """The text announces a change of state (moved, switched, no longer, is now...)."""
    negated: bool = False
    """The text retracts a previous state (no longer, stopped, cancelled, used to...)."""


@dataclass(frozen=True, slots=True)
class _Rewrite:
    hypothesis: str
    old: str | None = None
    new: str | None = None
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Rule:
    """One rewrite: where ``pattern`` matches, ``rewrite(match, text)`` builds the hypothesis.

    ``rewrite`` may return None to decline a match (the next rule is then tried).
    """

    name: str
    cues: frozenset[str]
    """Lower-case words of which the text must contain at least one for the rule to be tried."""
    pattern: re.Pattern[str]
    rewrite: Callable[[re.Match[str], str], _Rewrite | None]
    example: tuple[str, str]
    """(input, expected hypothesis): executed by the unit tests."""


def _cues(words: str) -> frozenset[str]:
    return frozenset(words.split())


# --- shared vocabulary ---------------------------------------------------------------------------

_MONTHS = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_DAYS = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
_SEASONS = r"(?:spring|summer|autumn|fall|winter)"
_TIME_NOUN = (
    r"(?:time|night|morning|afternoon|evening|week(?:end)?|month|quarter|year|term|semester|season"
    r"|sprint|release|cycle|" + _SEASONS + r"|" + _DAYS + r"|" + _MONTHS + r")\b"
)

# Where a value stops: a trailing time adverbial, reason or new clause is not part of the value.
_VALUE_END = re.compile(
    r"\s*(?:[;(—–]|\s-\s|,\s+(?=(?-i:[a-z])|(?:I|we|he|she|they|it|you)\b)|\.(?:\s|$)|[.!?]$"
    r"|\b(?:(?:last|this|next|the following|the previous) " + _TIME_NOUN + r"|yesterday|today"
    r"|tonight|earlier|recently|since|because|as of|after"
    r"|before|when|while|once|so|and|but|which|who|due to|following|effective|starting"
    r"|over the (?:weekend|summer|holidays?)|at the (?:start|end|beginning) of"
    r"|from (?:now|today|tomorrow|next|the start|" + _MONTHS + r"\b)"
    r"|in (?:the (?:morning|afternoon|evening|spring|summer|autumn|fall|winter)|"
    + _MONTHS
    + r"\b|"
    + _SEASONS
    + r"\b|q[1-4]\b|\d{4}\b|early|late|mid)"
    r"|on (?:" + _DAYS + r"|the \d|\d|" + _MONTHS + r"\b)"
    r"|(?:a|one|two|three|few|several) (?:days?|weeks?|months?|years?) ago)\b)",
    re.IGNORECASE,
)
_CLAUSE_START = re.compile(
    r"(?:^|[;:—–]\s*|[.!?]\s+|,\s*(?:and|but|so|then)?\s*|\b(?:and|but|so|then)\s+)", re.IGNORECASE
)
_LEADING_ADVERBIAL = re.compile(
    r"^(?:(?:last|this|next|earlier|in|on|since|as of|from|after|before)\b[^,]{0,40},\s*"
    r"|(?:fyi|update|note|heads up|btw|also|so|ok|okay|quick update)\b[:,\-]?\s*)",
    re.IGNORECASE,
)
_PRONOUNS = frozenset({"he", "she", "they", "it", "we", "i", "you"})
_PLURAL_SUBJECTS = frozenset({"we", "they", "you"})
_POSSESSIVE_PRONOUN = re.compile(r"^(?:his|her|their|its)\s+", re.IGNORECASE)
_BARE_NUMBER = re.compile(r"^v?\d+(?:\.\d+)*(?:\.x)?$", re.IGNORECASE)
_NAMED_NUMBER = re.compile(r"^(?P<name>.*?\S)\s+v?\d+(?:\.\d+)*(?:\.x)?$", re.IGNORECASE)
_NOT_A_PLACE = re.compile(
    r"^(?:(?:the|a|an|his|her|their|its|our|my|next|noon|midnight|tomorrow|morning|evening"
    r"|afternoon|weekends?|weekdays?)\b|\d|" + _DAYS + r"s?\b|" + _MONTHS + r"\b)",
    re.IGNORECASE,
)
_ON_VALUE = re.compile(
    r"\b(?:plan|tier|package|edition|version|release|team|squad|rota|shift|visa|permit|contract"
    r"|subscription|licen[cs]e|programme|program|stack|platform|provider|cloud)\b"
    r"|^[a-z][\w.+-]*(?:\s+[a-z][\w.+-]*)?\s+v?\d+(?:\.\d+)*$",
    re.IGNORECASE,
)
_ON_VERBS = frozenset(
    {
        "upgraded",
        "downgraded",
        "switched",
        "migrated",
        "changed over",
        "ported",
        "moved up",
        "moved down",
        "dropped down",
        "dropped back",
        "moved back",
        "converted",
    }
)
_TRAILING_AUX = re.compile(
    r"(?:\s+(?:has|have|had|was|were|is|are|just|also|recently|finally|been|got|gets|will|would)"
    r"|['’](?:s|ve|d|re|ll)(?=\s|$))+$",
    re.IGNORECASE,
)
_PLACE = re.compile(
    r"^[A-Z][\w'’.-]*(?:\s+(?:[A-Z][\w'’.-]*|(?:de|del|da|do|upon|on|am|im|la|le|sur)\b|-)){0,4}"
    r"(?:,\s*[A-Z][\w'’.-]*(?:\s+[A-Z][\w'’.-]*){0,2})?"
)
_NEW_HOME = re.compile(
    r"^(?:an?|the|their|his|her|my|our)\s+(?:new\s+|bigger\s+|smaller\s+)?(?:flat|house|home"
    r"|apartment|place|condo|bungalow|cottage|town|city|village|suburb|neighbou?rhood)\s+"
    r"(?:in|near|outside|on the edge of)\s+(?P<place>.+)",
    re.IGNORECASE,
)
_ACCUSTOMED = re.compile(
    r"\b(?:is|are|was|were|am|be|been|being|get|gets|got|getting|become|['’]s|['’]re|['’]m)\s*$",
    re.IGNORECASE,
)
_NEEDS_PARTICLE = frozenset({"went", "put", "brought", "stepped"})
_INFINITIVE = re.compile(
    r"^(?:be|look|help|take|get|see|work|study|care|live|stay|join|start|visit|support|spend|focus"
    r"|pursue|make|do|have|go|come|try|find|keep|give|save|learn|play|meet|call|pay|buy|use)\b",
    re.IGNORECASE,
)
_TRAILING_FILLER = re.compile(r"(?:\s+(?:please|instead|as well|too|then))+\s*$", re.IGNORECASE)
_PREPOSITIONS = frozenset(
    {"in", "on", "at", "as", "with", "for", "from", "to", "by", "after", "before", "during", "last"}
)
_OWNER = re.compile(r"^(.+?)['’]s\s+\S")
_DETERMINED = re.compile(
    r"^(?:the|a|an|this|that|these|those|his|her|their|its|our|my|your|some|all|each|every)\b",
    re.IGNORECASE,
)
_STARTED_AT = re.compile(r"^(?:at|as|with|for|on)\s+(?P<where>.+)", re.IGNORECASE)
_NEW_JOB = re.compile(r"^(?:a |an |[\w'’]+['’]s )?(?:new )?(?:job|role|position)\b", re.IGNORECASE)
_JOB_ROLE = re.compile(r"\bas\s+(?:an?\s+|the\s+)?([^,;.]+?)(?=\s+at\b|[,;.]|$)", re.IGNORECASE)
_JOB_EMPLOYER = re.compile(r"\b(?:at|with|for)\s+([A-Z][^,;.]*)")
_NAME_SUBJECT = re.compile(r"^(?:[A-Z][\w.'’-]*)(?:\s+[A-Z][\w.'’-]*){0,3}$")


# --- helpers -------------------------------------------------------------------------------------


def _clean(value: str) -> str:
    """Cut a value at the first trailing adverbial or clause boundary."""
    end = _VALUE_END.search(value)
    cut = value[: end.start()] if end is not None else value
    if not cut.strip(" \t,.;:!?\"'"):
        # The whole value read as an adverbial ("next Friday"): keep it up to the first break.
        cut = re.split(r"[,;]|\.(?:\s|$)", value, maxsplit=1)[0]
    cut = _TRAILING_FILLER.sub("", cut)
    return cut.strip(" \t,.;:!?\"'")


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _sentence_subject(text: str) -> str:
    """The leading noun phrase of the text: everything before its first verb-like word."""
    body = _LEADING_ADVERBIAL.sub("", text.strip())
    match = _SUBJECT_END.search(body)
    subject = body[: match.start()] if match else ""
    return _TRAILING_AUX.sub("", subject.strip(" ,;:"))


def _clause_subject(text: str, verb_start: int) -> str:
    """The subject of the clause whose verb starts at ``verb_start``; pronouns resolved."""
    head = text[:verb_start]
    starts = list(_CLAUSE_START.finditer(head))
    clause = head[starts[-1].end() :] if starts else head
    clause = _LEADING_ADVERBIAL.sub("", clause).strip(" ,;:")
    clause = _TRAILING_AUX.sub("", clause)
    if not clause or clause.lower() in _PRONOUNS - {"we", "i", "you"}:
        leading = _sentence_subject(text)
        if leading and leading.lower() not in _PRONOUNS and leading != clause:
            return leading
    return clause


def _lower_determiner(phrase: str) -> str:
    """'The lab' -> 'the lab', for use inside a sentence."""
    return re.sub(r"^(The|Our|My)\b", lambda m: m[1].lower(), phrase)


def _owned(phrase: str, owner: str) -> str:
    """'her billing address' + 'Marta' -> "Marta's billing address"."""
    if owner and owner.lower() not in _PRONOUNS and _POSSESSIVE_PRONOUN.match(phrase):
        return _POSSESSIVE_PRONOUN.sub(f"{_lower_determiner(owner)}'s ", phrase, count=1)
    return phrase


def _be(subject: str) -> str:
    low = subject.lower()
    if low == "i":
        return "am"
    if low in _PLURAL_SUBJECTS:
        return "are"
    words = subject.split()
    last = words[-1].lower() if words else low
    if words and words[-1][:1].isupper():
        return "is"
    if last.endswith("s") and not last.endswith(("ss", "us", "is", "'s", "’s")) and " " in low:
        return "are"
    return "is"


def _do(subject: str) -> str:
    return "do" if subject.lower() in _PLURAL_SUBJECTS | {"i"} else "does"


def _complete_versions(old: str, new: str) -> tuple[str, str]:
    """'PostgreSQL 14' -> '16' becomes 'PostgreSQL 14' -> 'PostgreSQL 16' (and the reverse)."""
    if _BARE_NUMBER.match(new) and (named := _NAMED_NUMBER.match(old)):
        new = f"{named['name']} {new}"
    elif _BARE_NUMBER.match(old) and (named := _NAMED_NUMBER.match(new)):
        old = f"{named['name']} {old}"
    return old, new


def _thing(match: re.Match[str], text: str) -> tuple[str, str]:
    """(subject, thing): the object of a transitive change verb, else its subject."""
    subject = _clause_subject(text, match.start())
    obj = (match.groupdict().get("obj") or "").strip()
    if not obj:
        return subject, subject
    owner = _OWNER.match(subject)
    if owner and re.match(r"the\s", obj, re.I):
        # "Femi's landlord raised the rent": the rent is Femi's.
        return subject, re.sub(r"^the\s+", f"{owner[1]}'s ", obj, count=1, flags=re.I)
    if (
        subject
        and subject.lower() not in _PRONOUNS
        and not _DETERMINED.match(obj)
        and not obj[:1].isupper()
    ):
        # "The customer changed payment method": the payment method is the customer's.
        return subject, f"{_lower_determiner(subject)}'s {obj}"
    return subject, _owned(obj, subject)


def _prep(verb: str, new: str) -> str:
    """The preposition that turns a change verb's target into a state: 'on' a plan, 'in' a place."""
    verb = " ".join(verb.lower().split())
    if verb in _ON_VERBS or (_ON_VALUE.search(new) and not new[:1].isdigit()):
        return "on "
    if (
        verb.startswith(("moved", "relocated"))
        and new[:1].isupper()
        and not _NOT_A_PLACE.match(new)
    ):
        return "in "
    return ""


# --- rewrites ------------------------------------------------------------------------------------


def _keep_negated(match: re.Match[str], text: str) -> _Rewrite:
    return _Rewrite(text.strip(), old=_clean(match["old"]) or None, negated=True)


def _used_to(match: re.Match[str], text: str) -> _Rewrite | None:
    if _ACCUSTOMED.search(text[: match.start()]):
        return None  # "is used to working nights" (accustomed), "is used to pay rent" (passive)
    subject = _clause_subject(text, match.start())
    if not subject:
        return None
    action = _clean(match["vp"])
    rest = match["rest"]
    new = _clean(re.sub(r"^(?:now\s+)?", "", rest.strip(), flags=re.I)) if rest else None
    if action.lower().startswith("be "):
        hypothesis = f"{_cap(subject)} {_be(subject)} no longer {action[3:]}."
    elif action.lower().startswith("have "):
        hypothesis = f"{_cap(subject)} no longer {'has' if _be(subject) == 'is' else 'have'} "
        hypothesis += f"{action[5:]}."
    else:
        hypothesis = f"{_cap(subject)} {_do(subject)} not {action} anymore."
    return _Rewrite(hypothesis, old=action, new=new or None, negated=True)


def _replaced_with(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    old, new = _clean(match["old"]), _clean(match["new"])
    if not (subject and old and new):
        return None
    old = _owned(old, subject)
    return _Rewrite(f"{_cap(subject)} now uses {new}, not {old}.", old=old, new=new)


def _replaced_by(match: re.Match[str], text: str) -> _Rewrite | None:
    old = _clause_subject(text, match.start())
    new = _clean(match["new"])
    if not (old and new):
        return None
    return _Rewrite(f"{_cap(new)} is used now, not {old}.", old=old, new=new)


def _from_to(match: re.Match[str], text: str) -> _Rewrite | None:
    subject, thing = _thing(match, text)
    old, new = _clean(match["old"]), _clean(match["new"])
    if not (thing and old and new):
        return None
    old, new = _complete_versions(_owned(old, subject), _owned(new, subject))
    verb = match["verb"] + (f" {match['part']}" if match["part"] else "")
    if (
        verb.lower() in {"moved", "relocated"}
        and not match["obj"]
        and _NAME_SUBJECT.match(subject)
        and not _NOT_A_PLACE.match(new)
    ):
        return _Rewrite(f"{_cap(subject)} {_be(subject)} based in {new}, not {old}.", old, new)
    prep = _prep(verb, new)
    return _Rewrite(f"{_cap(thing)} {_be(thing)} now {prep}{new}, not {prep}{old}.", old, new)


def _swapped_for(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    old, new = _clean(match["old"]), _clean(match["new"])
    if not (subject and old and new) or subject.lower() in _PRONOUNS - {"we", "i"}:
        return None
    old = _owned(old, subject)
    has = "has" if _be(subject) == "is" else "have"
    return _Rewrite(f"{_cap(subject)} now {has} {new}, not {old}.", old=old, new=new)


def _moved_to_place(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    target = match["new"].strip()
    home = _NEW_HOME.match(target)
    place = _PLACE.match(home["place"] if home else target)
    new = _clean(place[0]) if place else ""
    if not (subject and new) or not _NAME_SUBJECT.match(subject) or _NOT_A_PLACE.match(new):
        return None
    return _Rewrite(f"{_cap(subject)} {_be(subject)} based in {new}.", new=new)


def _change_to(match: re.Match[str], text: str) -> _Rewrite | None:
    verb = match["verb"].lower()
    if verb in _NEEDS_PARTICLE and not (match["part"] or match["part2"]):
        return None  # "went to Paris", "put it to the vote": not a change of state
    if verb == "set" and re.match(r"\s*(?:an?|some)\b", match["obj"] or "", re.I):
        return None  # "set a reminder to call": a purpose clause, not a new value
    subject, thing = _thing(match, text)
    new = _clean(match["new"])
    if not (thing and new) or _INFINITIVE.match(new):
        return None
    new = _owned(new, subject)
    verb = match["verb"] + (f" {match['part']}" if match["part"] else "")
    return _Rewrite(f"{_cap(thing)} {_be(thing)} now {_prep(verb, new)}{new}.", new=new)


def _renewed_until(match: re.Match[str], text: str) -> _Rewrite | None:
    subject, thing = _thing(match, text)
    new = _clean(match["new"])
    if not (thing and new):
        return None
    return _Rewrite(f"{_cap(thing)} {_be(thing)} valid until {new}.", new=new)


def _became(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    new = _clean(match["new"])
    if not (subject and new):
        return None
    return _Rewrite(f"{_cap(subject)} {_be(subject)} now {_owned(new, subject)}.", new=new)


def _hired_role(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    role, new = _clean(match["role"]), _clean(match["new"])
    if not (subject and role and new) or subject.lower() in _PRONOUNS:
        return None
    return _Rewrite(f"{_cap(subject)}'s {role} is now {new}.", new=new)


def _made_state(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    thing = _clean(match["thing"])
    if not (subject and thing):
        return None
    owned = _owned(thing, subject)
    where = "" if owned != thing or subject.lower() in _PRONOUNS else f" at {subject}"
    return _Rewrite(f"{_cap(owned)} {_be(owned)} now {match['new']}{where}.", new=match["new"])


def _stopped_taking(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    thing = _clean(match["thing"])
    if not (subject and thing):
        return None
    return _Rewrite(
        f"{_cap(subject)} {_be(subject)} no longer on {thing}.", old=thing, negated=True
    )


def _stopped_doing(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    action = _clean(match["action"])
    if not (subject and action):
        return None
    action = _owned(action, subject)
    return _Rewrite(f"{_cap(subject)} {_be(subject)} no longer {action}.", old=action, negated=True)


def _quit_employer(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    employer = _clean(match["employer"])
    if not (subject and employer):
        return None
    if match["verb"].lower() == "left":
        hypothesis = f"{_cap(subject)} {_be(subject)} no longer at {employer}."
        return _Rewrite(hypothesis, old=employer, negated=True)
    return _Rewrite(f"{_cap(subject)} no longer works at {employer}.", old=employer, negated=True)


def _cancelled(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    thing = _clean(match["thing"])
    if not (subject and thing):
        return None
    thing = re.sub(r"^(?:his|her|their|its|our|my|the)\s+", "a ", thing, flags=re.I)
    has = "has" if _be(subject) == "is" else "have"
    return _Rewrite(f"{_cap(subject)} no longer {has} {thing}.", old=thing, negated=True)


def _opted_out(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    thing = _clean(match["thing"])
    if not (subject and thing):
        return None
    thing = _owned(thing, subject)
    return _Rewrite(
        f"{_cap(subject)} {_be(subject)} no longer subscribed to {thing}.", old=thing, negated=True
    )


def _removed_from(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    item, container = _clean(match["item"] or match["item2"]), _clean(match["container"])
    if not (item and container):
        return None
    owner = re.sub(r"(?:'s|’s)\s+.*$", "", subject) if re.search(r"['’]s\s", subject) else subject
    if re.match(r"the\s+", container, re.I) and owner and owner.lower() not in _PRONOUNS:
        container = re.sub(r"^the\s+", f"{owner}'s ", container, count=1, flags=re.I)
    container = _owned(container, owner)
    return _Rewrite(
        f"{_cap(container)} no longer {'includes' if _be(container) == 'is' else 'include'} "
        f"{item}.",
        old=item,
        negated=True,
    )


def _joined(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    new = _clean(match["new"])
    if not (subject and new) or not new[:1].isupper():
        return None
    role = _clean(match["role"]) if match["role"] else ""
    suffix = f" as {role}" if role else ""
    return _Rewrite(f"{_cap(subject)} {_be(subject)} now with {new}{suffix}.", new=new)


def _started(match: re.Match[str], text: str) -> _Rewrite | None:
    subject = _clause_subject(text, match.start())
    thing = _clean(match["thing"])
    if not (subject and thing):
        return None
    thing = _owned(thing, subject)
    if (at := _STARTED_AT.match(thing)) is not None:
        if _NOT_A_PLACE.match(at["where"]) or re.match(r"(?:last|this|next)\b", at["where"], re.I):
            return None  # "started in March": a date, not a workplace
        return _Rewrite(f"{_cap(subject)} now works {thing}.", new=at["where"])
    if thing.split()[0].lower() in _PREPOSITIONS:
        return None
    if _NEW_JOB.match(thing):
        after = text[match.end("thing") :]
        role = _JOB_ROLE.search(thing + after)
        employer = _JOB_EMPLOYER.search(thing + after)
        if not (role or employer):
            return None
        parts = [
            f"as {_clean(role[1])}" if role else "",
            f"at {_clean(employer[1])}" if employer else "",
        ]
        new = " ".join(p for p in parts if p)
        return _Rewrite(f"{_cap(subject)} now works {new}.", new=new)
    if match["gerund"]:
        return _Rewrite(f"{_cap(subject)} {_be(subject)} now {thing}.", new=thing)
    return _Rewrite(f"{_cap(subject)} {_be(subject)} now doing {thing}.", new=thing)


def _imperative_switch(match: re.Match[str], text: str) -> _Rewrite | None:
    new = _clean(match["new"])
    if not new:
        return None
    return _Rewrite(f"Use {new}.", new=new)


def _keep(match: re.Match[str], text: str) -> _Rewrite:
    groups = match.groupdict()
    old = _clean(groups["old"]) if groups.get("old") else None
    new = _clean(groups["new"]) if groups.get("new") else None
    return _Rewrite(text.strip(), old=old or None, new=new or None)


# --- the table -----------------------------------------------------------------------------------

_I = re.IGNORECASE
_OBJ = r"(?P<obj>(?:\s+(?!(?:to|from|up|down|back|over|into)\b)[^\s,;.]+){0,8}?)"
_CHANGE = (
    r"(?:moved|relocated|switched|migrated|upgraded|downgraded|changed|transferred|converted"
    r"|shifted|swapped|rebooked|rescheduled|updated|bumped|raised|increased|reduced|lowered|cut"
    r"|dropped|rose|grew|fell|went|jumped|climbed|extended|pushed|brought|expanded|shrank"
    r"|decreased|put|set|reset|renamed|ported|reassigned|scaled|stepped|doubled|tripled|halved"
    r"|trimmed|capped|topped)"
)
_PART = r"(?:\s+(?P<part>up|down|back|over|forward|ahead))?"
# A change verb, an optional particle and an optional object: "moved", "put the rent up", "moved
# her train". The object stops before the preposition that introduces the new value.
_CHANGE_VERB = r"\b(?P<verb>" + _CHANGE + r")" + _PART + _OBJ

_CHANGE_CUES = _cues(
    "moved relocated switched migrated upgraded downgraded changed transferred converted shifted"
    " swapped rebooked rescheduled updated bumped raised increased reduced lowered cut dropped rose"
    " grew fell went jumped climbed extended pushed brought expanded shrank decreased put set reset"
    " renamed ported reassigned scaled stepped doubled tripled halved trimmed capped topped"
)

RULES: tuple[Rule, ...] = (
    Rule(
        "imperative_switch",
        _cues("switch change back revert"),
        re.compile(
            r"^\s*(?:please\s+)?(?:switch|change|go back|revert)\s+(?:back\s+|over\s+)?to\s+"
            r"(?P<new>.+)",
            _I,
        ),
        _imperative_switch,
        ("Switch to British spelling from now on.", "Use British spelling."),
    ),
    Rule(
        "no_longer",
        _cues("longer anymore more"),
        re.compile(
            r"(?:\bno longer|\bnot (?:\w+\s+){0,6}?any ?more|n['’]t (?:\w+\s+){0,6}?any ?more)"
            r"(?P<old>.*)",
            _I,
        ),
        _keep_negated,
        ("Priya no longer eats meat.", "Priya no longer eats meat."),
    ),
    Rule(
        "used_to",
        _cues("used"),
        re.compile(
            r"\bused to\s+(?P<vp>[^,;.]+?)"
            r"(?:\s*(?:[,;—–]\s*)?(?:\bbut\b|\bnow\b|$|[.;])(?P<rest>.*))",
            _I,
        ),
        _used_to,
        (
            "Priya used to cycle to the office, but now she takes the tram.",
            "Priya does not cycle to the office anymore.",
        ),
    ),
    Rule(
        "replaced_with",
        _cues("replaced"),
        re.compile(r"\breplaced\s+(?P<old>.+?)\s+with\s+(?P<new>.+)", _I),
        _replaced_with,
        (
            "The lab replaced its old centrifuge with an Eppendorf 5425 in May.",
            "The lab now uses an Eppendorf 5425, not the lab's old centrifuge.",
        ),
    ),
    Rule(
        "replaced_by",
        _cues("replaced"),
        re.compile(r"\breplaced\s+by\s+(?P<new>.+)", _I),
        _replaced_by,
        (
            "Jenkins was replaced by GitHub Actions last quarter.",
            "GitHub Actions is used now, not Jenkins.",
        ),
    ),
    Rule(
        "from_to",
        _CHANGE_CUES,
        re.compile(_CHANGE_VERB + r"\s+from\s+(?P<old>.+?)\s+(?:to|into)\s+(?P<new>.+)", _I),
        _from_to,
        (
            "We upgraded the build server from Ubuntu 20.04 to 22.04 last night.",
            "The build server is now on Ubuntu 22.04, not on Ubuntu 20.04.",
        ),
    ),
    Rule(
        "swapped_for",
        _cues("traded swapped exchanged"),
        re.compile(
            r"\b(?:traded in|traded|swapped|exchanged)\s+(?P<old>.+?)\s+(?:for|with)\s+(?P<new>.+)",
            _I,
        ),
        _swapped_for,
        (
            "Oskar swapped his road bike for a gravel bike.",
            "Oskar now has a gravel bike, not Oskar's road bike.",
        ),
    ),
    Rule(
        "moved_to_place",
        _cues("moved relocated emigrated"),
        re.compile(
            r"\b(?:has\s+|have\s+|just\s+|recently\s+)*(?:moved|relocated|emigrated)"
            r"(?:\s+(?:back|house|away))?\s+to\s+(?P<new>.+)",
            _I,
        ),
        _moved_to_place,
        ("Tomasz moved to Gdansk in the spring.", "Tomasz is based in Gdansk."),
    ),
    Rule(
        "renewed_until",
        _cues("renewed extended prolonged"),
        re.compile(
            r"\b(?P<verb>renewed|extended|prolonged)"
            + _OBJ
            + r"\s*(?:[;,]\s*(?:it|which|they)\s*(?:['’]s|is|was|are|were)?\s*(?:now\s+)?"
            r"(?:valid|good|active|running|runs|expires?)?\s*|\s+)"
            r"(?:until|till|through|thru|to(?=\s+(?:\d|the end|" + _MONTHS + r"\b)))\s+(?P<new>.+)",
            _I,
        ),
        _renewed_until,
        (
            "Anika renewed her passport; it's valid until 2034.",
            "Anika's passport is valid until 2034.",
        ),
    ),
    Rule(
        "change_to",
        _CHANGE_CUES,
        re.compile(
            _CHANGE_VERB + r"\s+(?:(?P<part2>up|down|back|over|forward)\s+)?to\s+(?P<new>.+)", _I
        ),
        _change_to,
        (
            "Noor's weekly standup was moved to Thursdays at 9:30.",
            "Noor's weekly standup is now Thursdays at 9:30.",
        ),
    ),
    Rule(
        "hired_role",
        _cues("hired appointed brought took named signed"),
        re.compile(
            r"\b(?:hired|appointed|brought (?:in|on)|took on|named|signed)\s+"
            r"(?:a\s+new|an?|the\s+new|new)\s+(?P<role>[^,;.]+?),?\s+(?P<new>[A-Z][\w.'’-]*(?:\s+[A-Z][\w.'’-]*)*)",
        ),
        _hired_role,
        (
            "Fernwood hired a new office manager, Greta Lund.",
            "Fernwood's office manager is now Greta Lund.",
        ),
    ),
    Rule(
        "became",
        _cues("promoted appointed elected named made hired reassigned moved became become"),
        re.compile(
            r"\b(?:(?:(?:was|were|has been|have been|['’]s been|got|just|recently)\s+)+"
            r"(?:promoted|appointed|elected|named|made|hired|reassigned|moved up)\s+(?:as|to)?"
            r"|promoted\s+(?:as|to)|(?:became|has become|have become)"
            r"|made(?=\s+(?:partner|director|captain|principal|head|lead|senior|chief|manager)\b))\s+"
            r"(?P<new>[^,;.]+)",
            _I,
        ),
        _became,
        (
            "Okafor was promoted to senior site engineer in April.",
            "Okafor is now senior site engineer.",
        ),
    ),
    Rule(
        "made_state",
        _cues("made"),
        re.compile(
            r"\bmade\s+(?P<thing>[^,;.]+?)\s+(?P<new>mandatory|optional|compulsory|required"
            r"|the default|default|public|private|free|read-only|invite-only|opt-in|opt-out)\b",
            _I,
        ),
        _made_state,
        ("Quillfeather made SSO mandatory for all staff.", "SSO is now mandatory at Quillfeather."),
    ),
    Rule(
        "stopped_doing",
        _cues("stopped quit gave given ceased"),
        re.compile(
            r"\b(?:has\s+|have\s+)?(?:stopped|quit|gave up|given up|ceased)\s+"
            r"(?P<action>\w+ing\b[^,;.]*)",
            _I,
        ),
        _stopped_doing,
        ("Luis stopped taking melatonin in March.", "Luis is no longer taking melatonin."),
    ),
    Rule(
        "quit_employer",
        _cues("quit resigned left"),
        re.compile(
            r"\b(?:has\s+|have\s+)?(?P<verb>quit|resigned from|left)\s+"
            r"(?:(?:his|her|their|my|the)\s+(?:job|role|position)\s+at\s+)?"
            r"(?P<employer>[A-Z][\w&.'’-]*(?:\s+(?:&\s+|and\s+|of\s+)?[A-Z][\w&.'’-]*)*)"
        ),
        _quit_employer,
        ("Beatrix quit Hollowell Foods in June.", "Beatrix no longer works at Hollowell Foods."),
    ),
    Rule(
        "stopped_taking",
        _cues("stopped came went discontinued"),
        re.compile(
            r"\b(?:has\s+|have\s+)?(?:stopped|came off|went off|discontinued)\s+"
            r"(?P<thing>(?!(?:the|his|her|their|my|our|a|an|to|by|at|in|on)\b)[\w-]+"
            r"(?:\s+\d+\s*(?:mg|mcg|g|ml|iu)\b)?)",
            _I,
        ),
        _stopped_taking,
        ("Harriet stopped sertraline after six months.", "Harriet is no longer on sertraline."),
    ),
    Rule(
        "removed_from",
        _cues("dropped removed deleted struck cut took taken"),
        re.compile(
            r"\b(?:(?:dropped|removed|deleted|struck|cut)\s+(?P<item>.+?)\s+(?:out\s+of|off|from)"
            r"|(?:took|taken)\s+(?P<item2>.+?)\s+(?:out\s+of|off))\s+(?P<container>.+)",
            _I,
        ),
        _removed_from,
        (
            "Ferrous Ltd's renewal removed priority support from the contract.",
            "Ferrous Ltd's contract no longer includes priority support.",
        ),
    ),
    Rule(
        "cancelled",
        _cues("cancelled canceled terminated closed ended discontinued gave got sold quit"),
        re.compile(
            r"\b(?:has\s+|have\s+)?(?:cancell?ed|canceled|terminated|closed|ended"
            r"|discontinued|gave up|got rid of|sold|quit)\s+(?P<thing>(?:his|her|their|its"
            r"|our|my|the)\s+[^,;.]+)",
            _I,
        ),
        _cancelled,
        (
            "Rosa cancelled her climbing gym membership.",
            "Rosa no longer has a climbing gym membership.",
        ),
    ),
    Rule(
        "opted_out",
        _cues("opted unsubscribed turned switched disabled"),
        re.compile(
            r"\b(?:has\s+|have\s+)?(?:opted out of|unsubscribed from|turned off"
            r"|switched off|disabled)\s+(?P<thing>[^,;.]+)",
            _I,
        ),
        _opted_out,
        (
            "The client unsubscribed from the monthly newsletter.",
            "The client is no longer subscribed to the monthly newsletter.",
        ),
    ),
    Rule(
        "joined",
        _cues("joined signed"),
        re.compile(
            r"\b(?:has\s+|have\s+)?(?:joined|signed up (?:for|with)|signed with)\s+"
            r"(?P<new>[^,;.]+?)(?:\s+as\s+(?P<role>[^,;.]+))?(?=[,;.]|\s+(?:last|this|in|on"
            r"|after|before|and|but)\b|$)",
            _I,
        ),
        _joined,
        (
            "Halvard joined Brightwell Labs as a data engineer.",
            "Halvard is now with Brightwell Labs as a data engineer.",
        ),
    ),
    Rule(
        "started",
        _cues("started began begun took taken"),
        re.compile(
            r"\b(?:has\s+|have\s+)?(?:started|began|begun|took up|taken up)\s+"
            r"(?P<thing>(?P<gerund>\w+ing\b)?[^,;.]*)",
            _I,
        ),
        _started,
        (
            "Ilse started a master's in urban planning in September.",
            "Ilse is now doing a master's in urban planning.",
        ),
    ),
    Rule(
        "instead_of",
        _cues("instead"),
        re.compile(r"\b(?P<new>[^,;.]+?)\s+instead of\s+(?P<old>[^,;.]+)", _I),
        _keep,
        (
            "Lena now takes the train instead of driving.",
            "Lena now takes the train instead of driving.",
        ),
    ),
    Rule(
        "now_state",
        _cues("now back"),
        re.compile(
            r"(?:\b(?:is|are|was|were)\s+(?:now|back)\b|['’](?:s|re)\s+now\b|\bnow\s+\w+s\b|\bnow\s+(?:on|at"
            r"|in|with)\b|,\s*now\b|\bnow[.!]?$|\bnow\s+(?:has|have)\b)(?P<new>[^,;(]*)",
            _I,
        ),
        _keep,
        ("The studio's rent is now £1,400 a month.", "The studio's rent is now £1,400 a month."),
    ),
    Rule(
        "change_event",
        _cues(
            "moved relocated switched migrated upgraded downgraded changed transferred swapped"
            " rebooked rescheduled postponed renewed rebranded renamed replaced"
        ),
        re.compile(
            r"\b(?:moved|relocated|switched|migrated|upgraded|downgraded|changed|transferred"
            r"|swapped|rebooked|rescheduled|postponed|renewed|rebranded|renamed|replaced)\b",
            _I,
        ),
        _keep,
        ("Wendell switched banks.", "Wendell switched banks."),
    ),
)

# One cheap test first: most facts carry no change cue, and they should cost one set lookup.
_CUES: frozenset[str] = frozenset().union(*(rule.cues for rule in RULES))
_WORD = re.compile(r"[a-z]+")

# Used by _sentence_subject: where the leading noun phrase ends.
_SUBJECT_END = re.compile(
    r"\s+(?=(?:is|are|was|were|has|have|had|will|would|can|could|should|does|do|did|got|gets"
    r"|no longer|used to|just|recently|now|also|finally|still|lives|works|runs|uses|takes|plays"
    r"|prefers|wants|needs|goes|drives|owns|pays|costs|requires|\w+ed)\b)",
    re.IGNORECASE,
)
_NEGATION = re.compile(
    r"(?:\bno longer|\bnot (?:\w+\s+){0,6}?any ?more|n['’]t (?:\w+\s+){0,6}?any ?more)\b",
    re.IGNORECASE,
)


def normalize(text: str) -> Normalized:
    """Rewrite a change event into the state it leaves behind, for use as the NLI hypothesis.

    >>> normalize("Maya moved to Austin last month.").hypothesis
    'Maya is based in Austin.'
    """
    words = frozenset(_WORD.findall(text.lower()))
    if words.isdisjoint(_CUES):
        return Normalized(hypothesis=text)
    for rule in RULES:
        if words.isdisjoint(rule.cues):
            continue
        match = rule.pattern.search(text)
        if match is None:
            continue
        rewrite = rule.rewrite(match, text)
        if rewrite is None:
            continue
        return Normalized(
            hypothesis=rewrite.hypothesis,
            rule=rule.name,
            old_value=rewrite.old,
            new_value=rewrite.new,
            is_change=True,
            negated=rewrite.negated or bool(_NEGATION.search(text)),
        )
    return Normalized(hypothesis=text)
