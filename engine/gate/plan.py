"""Step 1, ``plan``: one :class:`Probe` per fact, saying whether it is checked.

Episodic facts and facts with an explicit key are not compared against memories (``checked`` is
False); every other fact is recalled with its own text and scored as it was written.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.gate.policy import Policy
from engine.gate.probe import Probe
from engine.types import Fact

__all__ = ["plan"]


def plan(facts: Sequence[Fact], policy: Policy) -> list[Probe]:
    return [
        Probe(index=i, fact=fact, checked=fact.kind != "episodic" and fact.key is None)
        for i, fact in enumerate(facts)
    ]
