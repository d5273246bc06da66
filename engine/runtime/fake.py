"""Deterministic stand-ins for the embedder and the NLI model, for unit tests of the gate's logic.

They satisfy :mod:`engine.gate.ports` and need no model files. Never used in what ships: the
scores mean nothing beyond what a test writes into them.

* :class:`FakeEmbedder` hashes lower-cased words into ``dim`` buckets and L2-normalises, so texts
  sharing words are similar and equal texts have similarity 1;
* :class:`FakeNLI` answers each (premise, hypothesis) pair from a table the test gives, with a
  neutral answer for every other pair, and records every pair it was asked about.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from engine.errors import InvalidInput

__all__ = ["FakeEmbedder", "FakeNLI"]

_WORD = re.compile(r"\w+")


class FakeEmbedder:
    """Bag-of-words hashing embedder: deterministic across runs and machines."""

    def __init__(self, dim: int = 384) -> None:
        if not 2 <= dim <= 4096:
            raise InvalidInput(f"dim must be in [2, 4096], got {dim}")
        self.dim = dim
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.casefold()):
                out[row, zlib.crc32(word.encode()) % self.dim] += 1.0
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out


class FakeNLI:
    """Table-driven NLI. ``labels`` sets the label order (two labels: no entailment label).

    ``table`` maps (premise, hypothesis) to ``{label: probability}``; the remaining mass goes to
    ``neutral`` (or, with two labels, to the non-contradiction label).
    """

    def __init__(
        self,
        table: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
        labels: Sequence[str] = ("contradiction", "entailment", "neutral"),
    ) -> None:
        self.labels = tuple(labels)
        if "contradiction" not in self.labels or len(set(self.labels)) != len(self.labels):
            raise InvalidInput(f"labels must be distinct and name 'contradiction': {self.labels}")
        self.contradiction_index = self.labels.index("contradiction")
        self.entailment_index = (
            self.labels.index("entailment") if "entailment" in self.labels else None
        )
        rest = [
            i for i, label in enumerate(self.labels) if label not in ("contradiction", "entailment")
        ]
        self._rest = rest[0] if rest else None
        self.table = dict(table or {})
        self.calls: list[tuple[str, str]] = []

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        out = np.zeros((len(pairs), len(self.labels)), dtype=np.float32)
        for row, pair in enumerate(pairs):
            self.calls.append(pair)
            given = self.table.get(pair, {})
            for label, p in given.items():
                if label in self.labels:
                    out[row, self.labels.index(label)] = p
            left = max(0.0, 1.0 - float(out[row].sum()))
            if self._rest is not None:
                out[row, self._rest] += left
        return out
