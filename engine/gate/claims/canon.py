"""Value canonicalisation: the values a text states, each in one canonical spelling.

"$1,240,000" and "1.24 million dollars" are ``money:usd:1240000``; "31/08/2026" and "August 31,
2026" are ``date:08-31`` plus ``year:2026``; "twelve kilometres" is ``qty:m:12000`` (units with
an exact factor in their dimension's base unit); codes are ``id:``, phone numbers ``tel:<last
nine digits>``, plain numbers ``num:``, and ``email:``, ``url:``, ``ip:``, ``time:``,
``month:``, ``weekday:``, ``days:``, ``ord:`` likewise. Pure and stdlib-only: we read only the
formats people write values in.
"""

from __future__ import annotations

import calendar
import re
from functools import lru_cache

from engine.gate.claims.vocab import BASE_UNITS, CURRENCIES, MAGNITUDES, NUMBER_WORDS, UNITS
from engine.gate.claims.vocab import MONTH as _MONTH
from engine.gate.claims.vocab import MONTHS as _MONTHS

__all__ = ["FORMAT_WORDS", "values"]


_ISO = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_NUMERIC_DATE = re.compile(r"\b(\d{1,2})[/.](\d{1,2})[/.](\d{4}|\d{2})\b")
_DAY_MONTH = re.compile(
    rf"\b(\d{{1,2}})(?:st|nd|rd|th)?(?:\s+of)?\s+({_MONTH})\.?(?:,?\s+(\d{{4}}))?\b", re.I
)
_MONTH_DAY = re.compile(
    rf"\b({_MONTH})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+(\d{{4}}))?", re.I
)
_MONTH_YEAR = re.compile(rf"\b({_MONTH})\.?\s+(\d{{4}})\b", re.I)
_BARE_MONTH = re.compile(
    r"\b(?:(?<=in )|(?<=of )|(?<=since )|(?<=until )|(?<=from )|(?<=by ))May\b|\b(?!May\b)("
    + "|".join(calendar.month_name[n] for n in range(1, 13))
    + r")\b"
)
"""A month named on its own ("the first Saturday of November"), capitalised; "May" only after a
preposition ("Maya may call" names no month)."""
_WEEKDAYS: dict[str, int] = {calendar.day_name[n].lower(): n + 1 for n in range(7)}
_WEEKDAY = re.compile(
    r"\b(?:(" + "|".join(_WEEKDAYS) + r")s?|(Mon|Tue|Tues|Thu|Thur|Thurs|Fri)\.?)\b", re.I
)
_DAY_NAME = r"(?:" + "|".join(_WEEKDAYS) + r"|mon|tues?|wed|thu(?:rs?)?|fri|sat|sun)"
_DAY_RANGE = re.compile(
    rf"\b({_DAY_NAME})\.?\s*(?:-|–|to|through|thru|until)\s*({_DAY_NAME})\b\.?", re.I
)
"""A run of weekdays ("Mon-Fri", "Monday to Friday", "tue–sat")."""
_DAY_SETS = re.compile(r"\b(?:(weekdays|week days|workdays)|(weekends?))\b", re.I)
_DAY_SET_VALUES = ("days:1-5", "days:6-7")
FORMAT_WORDS: frozenset[str] = frozenset(
    [*_MONTHS, *UNITS, *CURRENCIES, *MAGNITUDES, *NUMBER_WORDS, "am", "pm"]
    + [f"{day}s" for day in _WEEKDAYS]
    + [*_WEEKDAYS, "mon", "tue", "tues", "wed", "thu", "thur", "thurs", "fri", "sat", "sun"]
    + ["weekday", "weekdays", "weekend", "weekends", "workdays"]
)
"""Words that only spell a value (months, weekdays, units, currencies, number words): not
content."""
_TIME = re.compile(r"\b(\d{1,2})(?::(\d{2}))?\s*(am|pm|a\.m\.|p\.m\.)|\b(\d{1,2}):(\d{2})\b", re.I)
_CODE = re.compile(
    r"\b(?:[A-Z]{2,}[ -]?|[A-Za-z]{2,}-)\d[\d-]{1,}\d\b|\b[A-Za-z]{2,}\d[\d-]{3,}\d\b"
)
_SPACED_METRE = re.compile(r"(?<![$£€¥₹\d.,])(\d+(?:[.,]\d+)?) m\b(?![\w'])")
"""A number, a space and a bare "m" not after a currency: metres ("1.8 m wide"); "$1.8m" and
"1.8m" stay millions."""
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?:/\d{1,2})?(?![\w.]*\d)")
"""A dotted IPv4 address ("10.40.3.61", "10.0.0.0/16"), each part at most 255."""
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_URL = re.compile(r"\bhttps?://[^\s,;)]+[^\s,;).]")
_HYPHENATED = re.compile(r"(\d|\b(?:" + "|".join(NUMBER_WORDS) + r"))-([A-Za-z])", re.I)
"""A number hyphenated to its unit: "a 3-month notice period" is three months, "a two-year
warranty" two years."""
_ORDINAL = re.compile(r"(\d{1,3})(?:st|nd|rd|th)", re.I)
_PHONE = re.compile(r"^(?:\+|00|0(?!0))")
_PHONE_DIGITS = 9
_LONG_CODE = 7
"""A code with this many digits is its digits alone: "ISBN 978-1-7394-2210-6" and
"9781739422106", "MSKU 448120-3" and "MSKU4481203" are one identifier each."""
_DIGIT_RUN = re.compile(r"(?<![\w$£€.,])\+?\d[\d ().-]{5,}\d(?![\w%])")
_ALNUM = re.compile(r"\b(?=[\w.-]*[A-Za-z])(?=[\w.-]*\d)[A-Za-z0-9][\w.-]*[A-Za-z0-9]\b")
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[A-Za-z]+(?:-[A-Za-z]+)*|[$£€¥₹%°]|\S")


@lru_cache(maxsize=65536)
def values(text: str) -> frozenset[str]:
    """The canonical values stated in ``text`` (empty when it states none)."""
    out: set[str] = set()
    text = text.replace("’", "'").replace("\u00a0", " ")
    text = _SPACED_METRE.sub(r"\1 metres", text)
    text = _addresses(text, out)
    text = _dates(text, out)
    text = _times(text, out)
    text = _identifiers(text, out)
    _amounts(text, out)
    return frozenset(out)


def _blank(text: str, m: re.Match[str]) -> str:
    return text[: m.start()] + " ; " + text[m.end() :]


def _date(out: set[str], month: int, day: int, year: str | None) -> None:
    if 1 <= month <= 12 and 1 <= day <= 31:
        out.add(f"date:{month:02d}-{day:02d}")
        out.add(f"month:{month:02d}")  # "in May" restates "14-16 May"
    if year:
        y = int(year)
        out.add(f"year:{y + 2000 if y < 100 else y}")


def _dates(text: str, out: set[str]) -> str:
    for pattern in (_ISO, _NUMERIC_DATE, _DAY_MONTH, _MONTH_DAY, _MONTH_YEAR):
        while (m := pattern.search(text)) is not None:
            g = m.groups()
            if pattern is _ISO:
                _date(out, int(g[1]), int(g[2]), g[0])
            elif pattern is _NUMERIC_DATE:
                a, b = int(g[0]), int(g[1])
                _date(out, b, a, g[2])  # day first (most of the world)
                if a <= 12 and a != b:
                    _date(out, a, b, None)  # month first: another reading
            elif pattern is _DAY_MONTH:
                _date(out, _MONTHS[g[1].lower()], int(g[0]), g[2])
            elif pattern is _MONTH_DAY:
                _date(out, _MONTHS[g[0].lower()], int(g[1]), g[2])
            else:
                out.add(f"month:{_MONTHS[g[0].lower()]:02d}")
                out.add(f"year:{g[1]}")
            text = _blank(text, m)
    while (m := _BARE_MONTH.search(text)) is not None:
        out.add(f"month:{_MONTHS[m.group().lower()]:02d}")
        text = _blank(text, m)
    text = _day_ranges(text, out)
    for m in _WEEKDAY.finditer(text):
        if m.group(1):
            out.add(f"weekday:{_WEEKDAYS[m.group(1).lower()]}")
        elif m.group(2)[0].isupper():
            out.add(f"weekday:{_day_number(m.group(2))}")
    return text


def _day_number(word: str) -> int:
    word = word.lower()
    if word in _WEEKDAYS:
        return _WEEKDAYS[word]
    return next(n for name, n in _WEEKDAYS.items() if name.startswith(word[:3]))


def _day_ranges(text: str, out: set[str]) -> str:
    """A run of weekdays is one value, ``days:<first>-<last>`` ("Mon-Fri" = "weekdays" =
    ``days:1-5``): the days of one opening time, not five values."""
    while (m := _DAY_RANGE.search(text)) is not None:
        out.add(f"days:{_day_number(m.group(1))}-{_day_number(m.group(2))}")
        text = _blank(text, m)
    while (m := _DAY_SETS.search(text)) is not None:
        out.add(_DAY_SET_VALUES[0] if m.group(1) else _DAY_SET_VALUES[1])
        text = _blank(text, m)
    return text


def _times(text: str, out: set[str]) -> str:
    while (m := _TIME.search(text)) is not None:
        if m.group(3):
            hour, minute = int(m.group(1)) % 12, int(m.group(2) or 0)
            if m.group(3).lower().startswith("p"):
                hour += 12
        else:
            hour, minute = int(m.group(4)), int(m.group(5))
        if hour < 24 and minute < 60:
            out.add(f"time:{hour:02d}:{minute:02d}")
        text = _blank(text, m)
    return text


def _addresses(text: str, out: set[str]) -> str:
    for found in list(_IPV4.finditer(text)):
        if all(int(part) <= 255 for part in found.group().split("/")[0].split(".")):
            out.add(f"ip:{found.group()}")
            text = text.replace(found.group(), " ; ", 1)
    for pattern, kind in ((_EMAIL, "email"), (_URL, "url")):
        while (m := pattern.search(text)) is not None:
            out.add(f"{kind}:{m.group().lower().rstrip('/')}")
            text = _blank(text, m)
    return text


def _identifiers(text: str, out: set[str]) -> str:
    while (m := _CODE.search(text)) is not None:
        digits = re.sub(r"\D", "", m.group())
        if len(digits) >= _LONG_CODE:  # the digits identify it; the letters name the scheme
            out.add("id:" + digits)
        else:
            out.add("id:" + re.sub(r"[^a-z0-9]", "", m.group().lower()))
        text = _blank(text, m)
    for m in list(_DIGIT_RUN.finditer(text)):
        digits = re.sub(r"\D", "", m.group())
        if len(digits) > _PHONE_DIGITS and _PHONE.match(m.group()):
            out.add(f"tel:{digits[-_PHONE_DIGITS:]}")  # the trunk 0 or the country code dropped
            text = text.replace(m.group(), " ; ", 1)
        elif len(digits) >= 7:
            out.add("id:" + digits)
            text = text.replace(m.group(), " ; ", 1)
    for m in list(_ALNUM.finditer(text)):
        word = m.group()
        if (nth := _ORDINAL.fullmatch(word)) is not None:
            out.add(f"ord:{int(nth.group(1))}")  # "on the 4th": a day or a rank, not a code
            text = text.replace(word, " ; ", 1)
            continue
        head = re.match(r"^(\d+(?:\.\d+)?)-?([A-Za-z%]+)$", word)
        if head and head.group(2).lower() in UNITS | MAGNITUDES.keys():
            continue  # "12km", "94k", "3-month": an amount, read below
        out.add("id:" + re.sub(r"[^a-z0-9]", "", word.lower()))
        text = text.replace(word, " ; ", 1)
    return text


def _number(tokens: list[str], i: int) -> tuple[float, int] | None:
    """The number starting at ``tokens[i]`` (digits or words, with a magnitude), and the end."""
    tok = tokens[i].lower()
    if tok[0].isdigit():
        try:
            value = float(tok.replace(",", ""))
        except ValueError:
            return None
        if re.fullmatch(r"\d{1,3}(?:\.\d{3})+", tok):  # "1.240.000"
            value = float(tok.replace(".", ""))
        j = i + 1
    elif tok in NUMBER_WORDS or (tok.split("-")[0] in NUMBER_WORDS and "-" in tok):
        parts = tok.split("-")
        if not all(p in NUMBER_WORDS for p in parts):
            return None
        value, j = float(sum(NUMBER_WORDS[p] for p in parts)), i + 1
        while j < len(tokens) and tokens[j].lower() in NUMBER_WORDS and value % 10 == 0:
            value += NUMBER_WORDS[tokens[j].lower()]
            j += 1
    else:
        return None
    while j < len(tokens) and tokens[j].lower() in MAGNITUDES:
        if tokens[j] == "M" or tokens[j].lower() in ("m", "k") and not tok[0].isdigit():
            break
        magnitude = MAGNITUDES[tokens[j].lower()]
        value *= magnitude
        j += 1
        k = j + 1 if j < len(tokens) and tokens[j].lower() == "and" else j
        if k < len(tokens) and tokens[k].lower() in NUMBER_WORDS and not tok[0].isdigit():
            rest = _number(tokens, k)  # "four thousand eight hundred (and) twenty"
            if rest is not None and rest[0] < magnitude:
                value += rest[0]
                j = rest[1]
    return value, j


def _fmt(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def _quantity(unit: str, value: float) -> str:
    base, factor = BASE_UNITS.get(unit, (unit, 1.0))
    return f"qty:{base}:{_fmt(round(value * factor, 9))}"


def _amounts(text: str, out: set[str]) -> None:
    tokens = _TOKEN.findall(_HYPHENATED.sub(r"\1 \2", text))
    i = 0
    while i < len(tokens):
        low = tokens[i].lower()
        currency = (
            CURRENCIES.get(low) if not low[0].isalpha() or low.isupper() or len(low) > 1 else None
        )
        if currency and low in ("$", "£", "€", "¥", "₹", "usd", "gbp", "eur", "jpy", "chf", "inr"):
            got = _number(tokens, i + 1) if i + 1 < len(tokens) else None
            if got is not None:
                out.add(f"money:{currency}:{_fmt(got[0])}")
                i = got[1]
                continue
        got = _number(tokens, i)
        if got is None or (low in ("one", "zero") and got[1] == i + 1):
            i += 1
            continue
        value, j = got
        after = tokens[j].lower() if j < len(tokens) else ""
        two = f"{after} {tokens[j + 1].lower()}" if j + 1 < len(tokens) else ""
        if after in CURRENCIES and (after[0].isalpha() or after in ("€", "£", "$", "¥", "₹")):
            out.add(f"money:{CURRENCIES[after]}:{_fmt(value)}")
            j += 1
        elif two in UNITS:
            out.add(_quantity(UNITS[two], value))
            j += 2
        elif after in UNITS:
            out.add(_quantity(UNITS[after], value))
            j += 1
        elif tokens[i][0].isdigit() and len(tokens[i]) == 4 and 1900 <= value <= 2100:
            out.add(f"year:{_fmt(value)}")
        else:
            out.add(f"num:{_fmt(value)}")
        i = j
