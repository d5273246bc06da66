"""Step 3, ``recall``: each checked fact's candidates.

Stored neighbours come from one grouped index search per namespace. Earlier facts of the same
batch and namespace are candidates too, so a later fact sees what an earlier one wrote; they are
appended after the stored ones and never crowd them out (the list keeps ``top_k`` plus one slot
per earlier fact).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from engine.gate.ports import Index, Store
from engine.gate.probe import Hit, Probe, Ref

__all__ = ["recall"]


def recall(probes: Sequence[Probe], store: Store, index: Index, k: int) -> None:
    stored = _stored(probes, store, index, k)
    for probe in probes:
        if not probe.checked:
            continue
        assert probe.vector is not None
        pool = list(stored.get(probe.index, []))
        for earlier in probes[: probe.index]:
            if earlier.fact.namespace != probe.fact.namespace or not earlier.checked:
                continue
            assert earlier.vector is not None
            ref = Ref(f"@{earlier.index}", earlier.fact.text, earlier.fact.key)
            pool.append((ref, float(probe.vector @ earlier.vector)))
        pool.sort(key=lambda rs: -rs[1])
        probe.hits = [
            Hit(ref, sim, rank) for rank, (ref, sim) in enumerate(pool[: k + probe.index])
        ]


def _stored(
    probes: Sequence[Probe], store: Store, index: Index, k: int
) -> dict[int, list[tuple[Ref, float]]]:
    by_ns: dict[str, list[tuple[int, np.ndarray]]] = defaultdict(list)
    for probe in probes:
        if probe.checked:
            assert probe.vector is not None
            by_ns[probe.fact.namespace].append((probe.index, probe.vector))
    out: dict[int, list[tuple[Ref, float]]] = {}
    for ns, queries in by_ns.items():
        scores, rowids = index.search(ns, np.stack([q for _, q in queries]), k)
        wanted = {int(r) for r in rowids.ravel() if r >= 0}
        refs = store.texts_for_rowids(ns, sorted(wanted)) if wanted else {}
        best: dict[int, dict[int, float]] = defaultdict(dict)
        for row, (i, _) in enumerate(queries):
            for s, r in zip(scores[row], rowids[row], strict=True):
                if r >= 0 and best[i].get(int(r), -2.0) < s:
                    best[i][int(r)] = float(s)
        for i, hits in best.items():
            ranked = sorted(hits.items(), key=lambda rs: -rs[1])[:k]
            out[i] = [
                (Ref(ref.id, ref.text, ref.key, r), s)
                for r, s in ranked
                if (ref := refs.get(r)) is not None and ref.kind != "episodic"
            ]
    return out
