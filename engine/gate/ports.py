"""What the gate needs from its collaborators, as protocols (the gate imports no concrete one):
the store's own ``Store``, the part of the index manager and of the ONNX runtimes it calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from engine.store.base import Store

__all__ = ["NLI", "Embedder", "EncodedEmbedder", "Index", "Store"]


@runtime_checkable
class Embedder(Protocol):
    """Texts -> L2-normalised float32 vectors ``[n, dim]``."""

    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class EncodedEmbedder(Protocol):
    """An embedder that also takes texts already tokenised (``encoded``: one entry per text,
    None for a text still to tokenise), as the ONNX runtime and its model-stage wrapper do."""

    dim: int

    def embed(
        self, texts: Sequence[str], *, encoded: Sequence[Any] | None = None
    ) -> np.ndarray: ...

    def encode_items(self, items: Sequence[str]) -> Sequence[Any]: ...


@runtime_checkable
class NLI(Protocol):
    """(premise, hypothesis) pairs -> probabilities ``[n, labels]``.

    ``contradiction_index`` is always set; ``entailment_index`` is None for a two-label
    contradiction classifier (no entailment label to read).
    """

    contradiction_index: int
    entailment_index: int | None

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray: ...


@runtime_checkable
class Index(Protocol):
    """Per-namespace vector search keyed by the store's rowids."""

    def search(self, namespace: str, vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scores float32 [q, k], rowids int64 [q, k])``; a missing hit has rowid -1."""
        ...

    def add(self, namespace: str, rowids: Sequence[int] | np.ndarray, vecs: np.ndarray) -> int: ...

    def remove(self, namespace: str, rowids: Sequence[int] | np.ndarray) -> int: ...
