"""The judge: fitted models that tell a restatement, and an update, from a look-alike.

Gradient-boosted trees fitted for one embedder and NLI model (``memgate models judge``) read the
rule's evidence and the two parsed claims (:mod:`engine.gate.judge.features`) and give each of
the closest candidates two probabilities: that the fact restates it (``trees``) and that the
fact is its replacement (``updates``). What it may change:

an **add** becomes a **skip** at ``Policy.judge_duplicate`` (rule ``judged_duplicate``); a
**replace** below ``Policy.judge_veto`` is not made (``judged_not_update``: strict adds, review
queues). It never replaces where the rule did not; judged candidates report their probabilities.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from engine.gate.judge.boost import Boost
from engine.gate.judge.features import FEATURES, features
from engine.gate.names import Reason, Rule, detailed
from engine.gate.policy import UPDATE_SIGNALS, Evidence, Policy, Verdict

__all__ = ["BAR_FIELDS", "FORMAT", "Judge", "VerdictJudge", "amended", "with_bars"]

FORMAT = "memgate-judge/4"
"""Version 4: two bars (duplicate, veto). Older files are skipped until refitted."""


class VerdictJudge(Protocol):
    """What the gate asks of a judge: its bars for a named policy, and the verdict amended."""

    def policy(self, policy: Policy) -> Policy: ...

    def amend(
        self, verdict: Verdict, evidence: Sequence[Evidence], fact: str, policy: Policy
    ) -> Verdict: ...


BAR_FIELDS: dict[str, str] = {
    "duplicate_bar": "judge_duplicate",
    "veto_bar": "judge_veto",
}
"""The policy field each of a judge's bars sets."""


def with_bars(policy: Policy, bars: Mapping[str, float]) -> Policy:
    """``policy`` with the judge's ``bars`` (keys of :data:`BAR_FIELDS`) that are given."""
    fields: dict[str, Any] = {BAR_FIELDS[name]: bar for name, bar in bars.items()}
    return replace(policy, **fields)


@dataclass(frozen=True)
class Judge:
    """A fitted judge and the bars chosen with it."""

    trees: Boost
    """The duplicate model: probability that the fact restates a candidate."""
    duplicate_bar: float
    """The named policies' ``judge_duplicate`` (chosen by cross-validation when fitted)."""
    models: Mapping[str, Any] = field(default_factory=dict)
    """The embedder and NLI artefacts it was fitted with (``name``, ``variant``,
    ``model_sha256`` each)."""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    """How it was fitted (sets, settings, figures). Shown, never used to decide."""
    updates: Boost | None = None
    """The update model (None: no veto)."""
    veto_bar: float = 0.0
    """The named policies' ``judge_veto`` (0: none)."""
    seal: str = ""
    """The judge file's ``judge_sha256`` when loaded from one (empty for a judge in memory)."""

    def __post_init__(self) -> None:
        for name, trees in (("duplicate", self.trees), ("update", self.updates)):
            if trees is not None and trees.n_features != len(FEATURES):
                raise ValueError(
                    f"judge {name} trees read {trees.n_features} features; this engine has "
                    f"{len(FEATURES)}"
                )
        for name in ("duplicate_bar", "veto_bar"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"judge {name} must be in [0, 1]")
        if self.updates is None and self.veto_bar > 0:
            raise ValueError("judge veto_bar needs update trees")

    def policy(self, policy: Policy) -> Policy:
        """``policy`` with this judge's bars (a named policy runs with them)."""
        return with_bars(policy, {"duplicate_bar": self.duplicate_bar, "veto_bar": self.veto_bar})

    def amend(
        self, verdict: Verdict, evidence: Sequence[Evidence], fact: str, policy: Policy
    ) -> Verdict:
        """``verdict`` as the judge amends it (only an add or a replacement); ``evidence`` is
        every candidate the rule saw, ``fact`` the fact's text."""
        action = verdict.action
        veto = action == "replace" and self.updates is not None and policy.judge_veto > 0
        if not policy.judge or not (action == "add" or veto):
            return verdict
        chosen, rows = features(evidence, fact, policy.floor)
        if not chosen:
            return verdict
        ids = [e.memory_id for e in chosen]
        if veto and self.updates is not None:
            update = dict(zip(ids, map(float, self.updates.probability(rows)), strict=True))
            return amended(verdict, {}, policy, update)
        probs = self.trees.probability(rows)
        return amended(verdict, dict(zip(ids, map(float, probs), strict=True)), policy)

    def describe(self) -> str:
        emb, nli = self.models.get("embedder", {}), self.models.get("nli", {})
        what = "duplicate and update judge" if self.updates is not None else "duplicate judge"
        return (
            f"{what} for {emb.get('name', '?')}/{emb.get('variant', '?')} + "
            f"{nli.get('name', '?')}/{nli.get('variant', '?')}"
        )


def amended(
    verdict: Verdict,
    duplicate: Mapping[str, float],
    policy: Policy,
    update: Mapping[str, float] | None = None,
) -> Verdict:
    """``verdict`` amended by the judged candidates' duplicate probabilities (for an add) and
    update probabilities (for a veto), memory id -> probability, most similar first: pure, so a
    fit can replay it."""
    if not policy.judge:
        return verdict
    action, target, rule = verdict.action, verdict.target_id, verdict.rule
    note: dict[str, str] = {}
    if action == "replace":
        if rule.split("+")[0] in UPDATE_SIGNALS:
            return verdict  # positive evidence of an update: never vetoed
        if not update or policy.judge_veto <= 0 or target is None or target not in update:
            return verdict  # a target the judge did not read (below the floor, not closest)
        if update[target] >= policy.judge_veto:
            return _noted(verdict, {}, {target: update[target]}, note)
        note[target] = detailed(Reason.JUDGED_NOT_UPDATE, f"{update[target]:.2f}")
        rule = str(Rule.JUDGED_NOT_UPDATE)
        if policy.mode == "review":
            action = "review"
        else:
            action, target = "add", None
        return _noted(Verdict(action, target, rule, verdict.candidates), {}, update, note)
    if action != "add" or not duplicate:
        return verdict
    best = max(duplicate, key=lambda k: duplicate[k])  # the first of equals: most similar
    if duplicate[best] >= policy.judge_duplicate:
        action, target, rule = "skip", best, str(Rule.JUDGED_DUPLICATE)
        note[best] = detailed(Reason.JUDGED_DUPLICATE, f"{duplicate[best]:.2f}")
    return _noted(Verdict(action, target, rule, verdict.candidates), duplicate, {}, note)


def _noted(
    verdict: Verdict,
    duplicate: Mapping[str, float],
    update: Mapping[str, float],
    note: Mapping[str, str],
) -> Verdict:
    """``verdict`` with the judged probabilities on its candidates, and the judge's reason on
    those whose outcome it changed (which then did not pass)."""
    cands = tuple(
        replace(
            c,
            duplicate=duplicate.get(c.memory_id, c.duplicate),
            update=update.get(c.memory_id, c.update),
            reason=note.get(c.memory_id, c.reason),
            passed=False if c.memory_id in note else c.passed,
        )
        for c in verdict.candidates
    )
    return Verdict(verdict.action, verdict.target_id, verdict.rule, cands)
