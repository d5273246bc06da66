"""Vocabulary of value formats, as data: English number words, month names, currencies and units.

These name *how values are written* (any domain), never topics. Each table is exercised by the
examples in ``tests/unit/test_gate_claims.py``.
"""

from __future__ import annotations

import calendar

__all__ = ["BASE_UNITS", "CURRENCIES", "MAGNITUDES", "MONTH", "MONTHS", "NUMBER_WORDS", "UNITS"]

MONTHS: dict[str, int] = {
    name.lower(): n
    for n in range(1, 13)
    for name in (calendar.month_name[n], calendar.month_abbr[n])
} | {"sept": 9}
"""Month names and abbreviations, lower case -> month number."""
MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
"""A regular expression alternation of :data:`MONTHS`, longest first."""

NUMBER_WORDS: dict[str, int] = {
    word: n
    for n, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
        " fifteen sixteen seventeen eighteen nineteen".split()
    )
} | {
    word: 10 * n
    for n, word in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)
}
"""Cardinal words below one hundred; "twenty-five" and "twenty five" are composed."""

MAGNITUDES: dict[str, int] = (
    {"hundred": 100, "thousand": 1_000, "k": 1_000}
    | dict.fromkeys(("million", "mn", "m"), 1_000_000)
    | dict.fromkeys(("billion", "bn"), 1_000_000_000)
)
"""Multipliers after a number ("1.24 million", "94k", "twelve hundred")."""

CURRENCIES: dict[str, str] = {
    form: code
    for code, forms in {
        "usd": "$ us$ usd dollar dollars bucks",
        "gbp": "£ gbp pound pounds quid",
        "eur": "€ eur euro euros",
        "jpy": "¥ jpy yen",
        "chf": "chf francs",
        "inr": "inr ₹ rupees",
        "aud": "aud a$",
        "cad": "cad c$",
        "nzd": "nzd nz$",
    }.items()
    for form in forms.split()
}
"""Currency symbols, codes and words -> ISO 4217 code (lower case)."""

_UNIT_FORMS: dict[str, tuple[str, ...]] = {
    "km": ("km", "kms", "kilometre", "kilometres", "kilometer", "kilometers"),
    "m": ("metre", "metres", "meter", "meters"),
    "cm": ("cm", "centimetre", "centimetres", "centimeter", "centimeters"),
    "mm": ("mm", "millimetre", "millimetres", "millimeter", "millimeters"),
    "mi": ("mi", "mile", "miles"),
    "ft": ("ft", "foot", "feet"),
    "in": ("inch", "inches"),
    "kg": ("kg", "kgs", "kilo", "kilos", "kilogram", "kilograms", "kilogramme", "kilogrammes"),
    "g": ("g", "gram", "grams", "gramme", "grammes"),
    "mg": ("mg", "milligram", "milligrams", "milligramme", "milligrammes"),
    "mcg": ("mcg", "µg", "microgram", "micrograms"),
    "lb": ("lb", "lbs", "pound-weight"),
    "l": ("l", "litre", "litres", "liter", "liters"),
    "ml": ("ml", "millilitre", "millilitres", "milliliter", "milliliters"),
    "m3": ("cubic metre", "cubic metres", "cubic meter", "cubic meters"),
    "s": ("s", "sec", "secs", "second", "seconds"),
    "min": ("min", "mins", "minute", "minutes"),
    "h": ("h", "hr", "hrs", "hour", "hours"),
    "day": ("day", "days"),
    "week": ("wk", "wks", "week", "weeks"),
    "month": ("mo", "mos", "month", "months"),
    "year": ("yr", "yrs", "year", "years"),
    "%": ("%", "percent", "per cent", "pct"),
    "gb": ("gb", "gig", "gigs", "gigabyte", "gigabytes"),
    "mb": ("mb", "megabyte", "megabytes"),
    "tb": ("tb", "terabyte", "terabytes"),
    "kb": ("kb", "kilobyte", "kilobytes"),
    "ms": ("ms", "millisecond", "milliseconds"),
    "c": ("°c", "celsius", "degrees celsius"),
    "f": ("°f", "fahrenheit"),
    "kwh": ("kwh", "kilowatt-hour", "kilowatt-hours"),
    "w": ("w", "watt", "watts"),
    "kw": ("kw", "kilowatt", "kilowatts"),
}
UNITS: dict[str, str] = {form: unit for unit, forms in _UNIT_FORMS.items() for form in forms}
"""Unit spellings -> one canonical symbol ("kilometres" and "km" are both ``km``)."""

_FACTORS: dict[str, dict[str, float]] = {
    "m": {"km": 1000.0, "m": 1.0, "cm": 0.01, "mm": 0.001},
    "g": {"kg": 1000.0, "g": 1.0, "mg": 0.001, "mcg": 0.000001},
    "l": {"l": 1.0, "ml": 0.001, "m3": 1000.0},
    "s": {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0},
    "day": {"day": 1.0, "week": 7.0},
    "month": {"month": 1.0, "year": 12.0},
    "b": {"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12},
    "w": {"w": 1.0, "kw": 1000.0},
}
BASE_UNITS: dict[str, tuple[str, float]] = {
    unit: (base, factor) for base, units in _FACTORS.items() for unit, factor in units.items()
}
"""Units that convert exactly by a factor, -> (the dimension's base unit, factor): "3.4 kg" and
"3400 g" are one quantity, as are "1.8 m" and "180 cm", "90 minutes" and "1.5 hours", "two
years" and "24 months". Units without an exact factor into another (miles, feet, degrees; days
and months) stay as written."""
