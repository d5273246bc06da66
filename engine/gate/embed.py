"""Step 2, ``embed``: one embedder call for every fact's text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from engine.gate.ports import Embedder, EncodedEmbedder
from engine.gate.probe import Probe

__all__ = ["embed"]


def embed(
    probes: Sequence[Probe], embedder: Embedder, encoded: Sequence[Any] | None = None
) -> np.ndarray:
    """Set each probe's vector; returns the facts' vectors ``[n, dim]`` (what is stored).

    ``encoded``: the facts' texts as the edge tokenised them for the batch budget
    (:class:`engine.types.ValidFacts`), one per probe: the embedder takes them as they are."""
    texts = [p.fact.text for p in probes]
    if encoded is not None:  # made by this embedder's own encode_items, at the edge
        vectors = cast(EncodedEmbedder, embedder).embed(texts, encoded=list(encoded))
    else:
        vectors = embedder.embed(texts)
    for probe, vector in zip(probes, vectors, strict=True):
        probe.vector = vector
    return vectors
