"""Step 2, ``embed``: one embedder call for every fact's text."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.gate.ports import Embedder
from engine.gate.probe import Probe

__all__ = ["embed"]


def embed(probes: Sequence[Probe], embedder: Embedder) -> np.ndarray:
    """Set each probe's vector; returns the facts' vectors ``[n, dim]`` (what is stored)."""
    vectors = embedder.embed([p.fact.text for p in probes])
    for probe, vector in zip(probes, vectors, strict=True):
        probe.vector = vector
    return vectors
