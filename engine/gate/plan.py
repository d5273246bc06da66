"""Step 1, ``plan``: one :class:`Probe` per fact, with what to check and how to search.

Episodic facts and facts with an explicit key are not compared against memories (``checked`` is
False). A checked fact is normalised (an event "moved to Porto" becomes the state "lives in
Porto"), and the rewrite, and the old state a "no longer" fact negates, become extra recall
queries: an event is often far from the stored state in embedding space; its rewrite is not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from engine.gate import keys as keymod
from engine.gate import normalize as normmod
from engine.gate.policy import Policy
from engine.gate.probe import Probe
from engine.types import Fact

__all__ = ["old_state", "plan"]


def plan(facts: Sequence[Fact], policy: Policy) -> list[Probe]:
    probes = []
    for i, fact in enumerate(facts):
        checked = fact.kind != "episodic" and fact.key is None
        probe = Probe(index=i, fact=fact, checked=checked)
        if fact.kind != "episodic":
            probe.key = keymod.infer_key(fact.text)
        if checked and policy.normalize:
            probe.norm = normmod.normalize(fact.text)
            if probe.norm.rule:
                probe.queries.append(probe.norm.hypothesis)
                old = old_state(probe.norm)
                if old:
                    probe.queries.append(old)
        probes.append(probe)
    return probes


_NEGATION = re.compile(r"\b(?:no longer|not|never|anymore|any more)\b\s*|n't\b", re.IGNORECASE)


def old_state(norm: normmod.Normalized) -> str | None:
    """The state a change fact says is over ("Ines no longer teaches" -> "Ines teaches")."""
    if not (norm.is_change and norm.negated and norm.old_value):
        return None
    clause = re.split(r"[;:]|, (?:and|but|so) ", norm.hypothesis)[0]
    stripped = " ".join(_NEGATION.sub("", clause).split())
    return stripped if stripped and stripped != clause else None
