"""Step 4, ``relate``: which candidates the model must score.

Every candidate at or above the floor is scored memory -> fact. The most similar candidate, when
it is nearly identical, is also scored fact -> memory, where the model has an entailment label:
a duplicate must entail both ways.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.gate.policy import Policy
from engine.gate.probe import Probe

__all__ = ["relate"]


def relate(probes: Sequence[Probe], policy: Policy, *, has_entailment: bool) -> None:
    for probe in probes:
        for hit in probe.hits:
            if hit.similarity < policy.floor:
                continue
            hit.forward = True
            hit.reverse = (  # for the duplicate test only: both ways must entail
                policy.duplicates
                and hit.rank == 0
                and hit.similarity >= policy.duplicate_similarity
                and has_entailment
            )
