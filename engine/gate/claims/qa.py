"""Memories shaped "question? answer": the question names what is stored (its subject and
attribute), the answer is the value. "How do I reset the router? Hold the button for ten
seconds." and "How do I reset the router? Use the app." are one thing changed; "... the
modem? ..." is another thing. A time qualifier in the question says when, not which ("How
many titles do the Knicks have as of 1973? two.").

Pure: a regular expression and the gate's content tokens, no model and no I/O.
"""

from __future__ import annotations

import re

from engine.gate.claims import when
from engine.gate.overlap import content_tokens

__all__ = ["question", "same_question"]

_QA = re.compile(r"\s*(?P<q>[^?]*[A-Za-z][^?]*\?)\s*(?P<a>[^?]*\w[^?]*)")


def question(text: str) -> str | None:
    """The question of a text that is one question followed by its answer, else None."""
    m = _QA.fullmatch(text)
    return m.group("q") if m else None


def same_question(a: str, b: str) -> bool | None:
    """None unless both texts are "question? answer"; else whether their questions, time
    qualifiers out, have the same content words."""
    qa, qb = question(a), question(b)
    if qa is None or qb is None:
        return None
    return _key(qa) == _key(qb)


def _key(question: str) -> frozenset[str]:
    return frozenset(content_tokens(when.unqualified(question)))
