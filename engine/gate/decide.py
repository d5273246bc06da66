"""Step 7, ``decide``: the facts' decisions, in batch order, a later fact seeing what earlier
ones did. Episodes are added; a keyed fact is added, skipped (same text) or replaces its key's
memory, no model; every other fact gets the policy's rule, then the judge's amendment.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from engine.gate.judge import VerdictJudge
from engine.gate.names import Reason, Rule
from engine.gate.policy import Policy
from engine.gate.policy import apply_rule as rule
from engine.gate.probe import Probe
from engine.store import new_memory_id
from engine.types import Candidate, Decision, Memory

__all__ = ["EarlierFacts", "decide"]

ActiveByKey = Callable[[str, str], Memory | None]


@dataclass
class EarlierFacts:
    """What earlier facts of this batch did, as later facts must see it."""

    ids: dict[str, str] = field(default_factory=dict)
    """``@<index>`` -> the memory id that fact stored."""
    gone: set[str] = field(default_factory=set)
    """Memories replaced by an earlier fact."""
    keyed: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    """(namespace, key) -> (memory id, text) of the newest keyed write."""

    def record(self, probe: Probe, d: Decision) -> None:
        if d.action in ("add", "replace") and d.memory_id:
            self.ids[f"@{probe.index}"] = d.memory_id
        if d.action == "replace" and d.target_id:
            self.gone.add(d.target_id)


def decide(
    probes: Sequence[Probe],
    policy: Policy,
    active_by_key: ActiveByKey,
    judge: VerdictJudge | None = None,
) -> list[Decision]:
    batch = EarlierFacts()
    out = []
    for probe in probes:
        new_id = new_memory_id()
        if probe.fact.kind == "episodic":
            d = Decision("add", probe.fact, None, (), policy.name, Rule.EPISODIC, memory_id=new_id)
        elif probe.fact.key is not None:
            d = _keyed(probe, policy, batch, active_by_key, new_id)
        else:
            d = _free_text(probe, policy, batch, new_id, judge)
        batch.record(probe, d)
        out.append(d)
    return out


def _free_text(
    probe: Probe, policy: Policy, batch: EarlierFacts, new_id: str, judge: VerdictJudge | None
) -> Decision:
    evidence = []
    for ev in probe.evidence:
        mid = batch.ids.get(ev.memory_id, ev.memory_id)
        if mid in batch.gone or mid.startswith("@"):
            continue  # superseded earlier in this batch, or that fact stored nothing
        evidence.append(ev if mid == ev.memory_id else replace(ev, memory_id=mid))
    v = rule(evidence, policy)
    if judge is not None:
        v = judge.amend(v, evidence, probe.fact.text, policy)
    return Decision(
        v.action,
        probe.fact,
        v.target_id,
        v.candidates,
        policy.name,
        v.rule,
        memory_id=new_id if v.action in ("add", "replace") else None,
    )


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def _keyed(
    probe: Probe, policy: Policy, batch: EarlierFacts, active_by_key: ActiveByKey, new_id: str
) -> Decision:
    fact = probe.fact
    assert fact.key is not None
    slot = (fact.namespace, fact.key)
    current = batch.keyed.get(slot)
    if current is None:
        mem = active_by_key(fact.namespace, fact.key)
        if mem is not None and mem.id not in batch.gone:
            current = (mem.id, mem.text)
    if current is None:
        batch.keyed[slot] = (new_id, fact.text)
        return Decision("add", fact, None, (), policy.name, Rule.KEYED_NEW, memory_id=new_id)
    cand = (Candidate(current[0], current[1], 1.0, None, None, fact.key, True, Reason.SAME_KEY),)
    if _same_text(current[1], fact.text):
        return Decision("skip", fact, current[0], cand, policy.name, Rule.KEYED_SAME)
    batch.keyed[slot] = (new_id, fact.text)
    return Decision("replace", fact, current[0], cand, policy.name, Rule.KEYED, memory_id=new_id)
