"""When a statement holds: its time qualifier ("as of 2019", "since March 2020", "now"), and
which of two statements is the later one. A qualifier is a marker (:data:`MARKERS`) before a
year, month and year, or date, or a word of :data:`NOW_WORDS`; a bare date, or one after "on" or
"by", is the statement's value, never its time. Pure; :data:`EXAMPLES` are run by the tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.gate.claims.vocab import MONTH as _MONTH
from engine.gate.claims.vocab import MONTHS as _MONTHS

__all__ = ["EXAMPLES", "MARKERS", "NOW_WORDS", "Stamp", "order", "stamp", "unqualified"]

MARKERS: tuple[str, ...] = (
    "as of", "as at", "since", "until", "till", "through", "starting", "starting in",
    "starting from", "beginning", "beginning in", "effective", "effective from", "in", "during",
    "from",
)  # fmt: skip
"""Words that introduce the time a statement holds from, until or during."""

NOW_WORDS: tuple[str, ...] = (
    "now", "currently", "presently", "at present", "nowadays", "these days", "as of now",
    "as of today", "at the moment",
)  # fmt: skip
"""Words that put a statement in the present."""

_MARKER = "|".join(
    re.escape(m).replace(r"\ ", r"\s+") for m in sorted(MARKERS, key=len, reverse=True)
)
_YEAR = r"(?:1[89]|2[01])\d\d"
_DATE = (
    rf"(?:(?P<iso>{_YEAR})-(?P<isom>[01]\d)(?:-(?P<isod>[0-3]\d))?"
    rf"|(?:(?P<d1>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?)?(?P<m1>{_MONTH})\.?"
    rf"(?:\s+(?P<d2>\d{{1,2}})(?:st|nd|rd|th)?)?,?\s+(?P<y1>{_YEAR})"
    rf"|(?:the\s+year\s+)?(?P<y2>{_YEAR}))"
)
_TIMED = re.compile(rf"\b(?:{_MARKER})\s+(?:early\s+|mid-?\s*|late\s+)?{_DATE}(?![\w-])", re.I)
_NOW = re.compile(
    r"\b(?:" + "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in NOW_WORDS) + r")\b", re.I
)
_NOT_NOW = re.compile(r"\b(?:until|till|by)\s+now\b|\bnow\s+that\b|\bjust\s+now\b", re.I)


@dataclass(frozen=True, order=False)
class Stamp:
    """The time a statement holds at: a date to the precision the text gives (``month`` and
    ``day`` 0 when not given), or ``now``."""

    year: int = 0
    month: int = 0
    day: int = 0
    now: bool = False

    def __str__(self) -> str:
        if self.now:
            return "now"
        return "-".join(f"{p:02d}" for p in (self.year, self.month, self.day) if p)


def stamp(text: str) -> Stamp | None:
    """The first time qualifier of ``text`` (a dated one before "now"), or None."""
    for m in _TIMED.finditer(text):
        got = _date(m)
        if got is not None:
            return got
    if _NOW.search(_NOT_NOW.sub(" ", text)):
        return Stamp(now=True)
    return None


def unqualified(text: str) -> str:
    """``text`` with its first dated time qualifier blanked: what it says, apart from when."""
    for m in _TIMED.finditer(text):
        if _date(m) is not None:
            return text[: m.start()] + " " + text[m.end() :]
    return text


def _date(m: re.Match[str]) -> Stamp | None:
    g = m.groupdict()
    if g["iso"]:
        return Stamp(int(g["iso"]), int(g["isom"]), int(g["isod"] or 0))
    if g["y1"]:
        day = int(g["d1"] or g["d2"] or 0)
        return Stamp(int(g["y1"]), _MONTHS[g["m1"].lower().rstrip(".")], day if day <= 31 else 0)
    if g["y2"]:
        return Stamp(int(g["y2"]))
    return None


def order(fact: Stamp | None, memory: Stamp | None) -> str:
    """``later`` / ``earlier`` when the fact is dated after / before the memory, ``""`` when it
    cannot be told (either undated, the same time at the precision both give, or a memory that
    holds "now"). A fact that holds "now" is later than any dated memory."""
    if fact is None or memory is None or memory.now:
        return ""
    if fact.now:
        return "later"
    for a, b in ((fact.year, memory.year), (fact.month, memory.month), (fact.day, memory.day)):
        if not a or not b:
            return ""
        if a != b:
            return "later" if a > b else "earlier"
    return ""


EXAMPLES: tuple[tuple[str, str | None], ...] = (
    ("As of 2019, Marc Sarreau plays for Groupama-FDJ.", "2019"),
    ("As at March 2020 the fund held 40 assets.", "2020-03"),
    ("Keiko has lived in Kobe since 2019.", "2019"),
    ("Since March 2020, Lena works remotely.", "2020-03"),
    ("Since 3 March 2020, Lena works remotely.", "2020-03-03"),
    ("The lease runs until 2024-06-30.", "2024-06-30"),
    ("Ravi chaired the board till 2018.", "2018"),
    ("In 2021, Ana moved to Lisbon.", "2021"),
    ("Starting in January 2023 the fee is $40.", "2023-01"),
    ("Effective from 1 July 2022, rent is due on the 5th.", "2022-07-01"),
    ("From 2015 to 2019 he coached Ajax.", "2015"),
    ("During mid-2017 the plant was closed.", "2017"),
    ("Tom now lives in Rome.", "now"),
    ("The team is currently based in Leeds.", "now"),
    ("At present, the CEO is Ada Park.", "now"),
    # a date that is the statement's value, not its time: no qualifier
    ("The deadline is 3 May 2021.", None),
    ("The meeting is on 3 May 2021.", None),
    ("The report is due by June 2021.", None),
    ("The 2022 budget is $5M.", None),
    ("Room 2019 is on the second floor.", None),
    ("In 45 minutes the shop closes.", None),
    ("Until now, nobody has complained.", None),
    ("Maya lives in Porto.", None),
)
"""(text, its stamp as :class:`Stamp` prints it, or None): run by the tests."""
