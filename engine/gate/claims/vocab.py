"""Vocabulary of value formats, as data: English number words, currencies and units.

These name *how values are written* (any domain), never topics. Each table is exercised by the
examples in ``tests/unit/test_gate_claims.py``.
"""

from __future__ import annotations

__all__ = ["BASE_UNITS", "CURRENCIES", "MAGNITUDES", "NUMBER_WORDS", "UNITS"]

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

MAGNITUDES: dict[str, int] = {
    "hundred": 100,
    "thousand": 1_000,
    "k": 1_000,
    "million": 1_000_000,
    "mn": 1_000_000,
    "m": 1_000_000,
    "billion": 1_000_000_000,
    "bn": 1_000_000_000,
}
"""Multipliers after a number ("1.24 million", "94k", "twelve hundred")."""

CURRENCIES: dict[str, str] = {
    "$": "usd",
    "us$": "usd",
    "usd": "usd",
    "dollar": "usd",
    "dollars": "usd",
    "bucks": "usd",
    "£": "gbp",
    "gbp": "gbp",
    "pound": "gbp",
    "pounds": "gbp",
    "quid": "gbp",
    "€": "eur",
    "eur": "eur",
    "euro": "eur",
    "euros": "eur",
    "¥": "jpy",
    "jpy": "jpy",
    "yen": "jpy",
    "chf": "chf",
    "francs": "chf",
    "inr": "inr",
    "₹": "inr",
    "rupees": "inr",
    "aud": "aud",
    "a$": "aud",
    "cad": "cad",
    "c$": "cad",
    "nzd": "nzd",
    "nz$": "nzd",
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

BASE_UNITS: dict[str, tuple[str, float]] = {
    "km": ("m", 1000.0),
    "m": ("m", 1.0),
    "cm": ("m", 0.01),
    "mm": ("m", 0.001),
    "kg": ("g", 1000.0),
    "g": ("g", 1.0),
    "mg": ("g", 0.001),
    "mcg": ("g", 0.000001),
    "l": ("l", 1.0),
    "ml": ("l", 0.001),
    "m3": ("l", 1000.0),
    "ms": ("s", 0.001),
    "s": ("s", 1.0),
    "min": ("s", 60.0),
    "h": ("s", 3600.0),
    "day": ("day", 1.0),
    "week": ("day", 7.0),
    "month": ("month", 1.0),
    "year": ("month", 12.0),
    "kb": ("b", 1e3),
    "mb": ("b", 1e6),
    "gb": ("b", 1e9),
    "tb": ("b", 1e12),
    "w": ("w", 1.0),
    "kw": ("w", 1000.0),
}
"""Units that convert exactly by a factor, -> (the dimension's base unit, factor): "3.4 kg" and
"3400 g" are one quantity, as are "1.8 m" and "180 cm", "90 minutes" and "1.5 hours", "two
years" and "24 months". Units without an exact factor into another (miles, feet, degrees; days
and months) stay as written."""
