"""Step 2, ``embed``: one embedder call for every fact's text and every extra recall query."""

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
    """Set each probe's vectors; returns the facts' vectors ``[n, dim]`` (what is stored).

    ``encoded``: the facts' texts as the edge tokenised them for the batch budget
    (:class:`engine.types.ValidFacts`), one per probe: the embedder takes them and tokenises
    only the extra queries."""
    texts = [p.fact.text for p in probes] + [q for p in probes for q in p.queries]
    if encoded is not None:  # made by this embedder's own encode_items, at the edge
        extra: list[Any] = [None] * (len(texts) - len(probes))
        vectors = cast(EncodedEmbedder, embedder).embed(texts, encoded=[*encoded, *extra])
    else:
        vectors = embedder.embed(texts)
    at = len(probes)
    for n, probe in enumerate(probes):
        probe.vector = vectors[n]
        probe.extra = [vectors[at + j] for j in range(len(probe.queries))]
        at += len(probe.queries)
    return vectors[: len(probes)]
