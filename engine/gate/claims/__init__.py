"""Claims read from text with spaCy: parsing (``claim``), values (``canon``), comparison
(``compare``); vocabulary of value formats as data (``vocab``); spaCy itself only in ``nlp``."""

from engine.gate.claims.canon import values
from engine.gate.claims.claim import Claim, claim
from engine.gate.claims.compare import (
    adds_beside,
    changed_kinds,
    changes_value,
    named_apart,
    negates_part,
    partial,
    restates,
    says_of_another,
    values_left,
)

__all__ = [
    "Claim",
    "adds_beside",
    "changed_kinds",
    "changes_value",
    "claim",
    "named_apart",
    "negates_part",
    "partial",
    "restates",
    "says_of_another",
    "values",
    "values_left",
]
