"""Step 2, ``embed``: one embedder call for every fact's text and every extra recall query."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.gate.ports import Embedder
from engine.gate.probe import Probe

__all__ = ["embed"]


def embed(probes: Sequence[Probe], embedder: Embedder) -> np.ndarray:
    """Set each probe's vectors; returns the facts' vectors ``[n, dim]`` (what is stored)."""
    texts = [p.fact.text for p in probes] + [q for p in probes for q in p.queries]
    vectors = embedder.embed(texts)
    at = len(probes)
    for n, probe in enumerate(probes):
        probe.vector = vectors[n]
        probe.extra = [vectors[at + j] for j in range(len(probe.queries))]
        at += len(probe.queries)
    return vectors[: len(probes)]
