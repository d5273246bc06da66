"""The duplicate judge: a fitted model that tells a restatement from a new fact.

The rule (:mod:`engine.gate.policy`) recognises few duplicates on wording it was not tuned on
(about a third of them across ten sets by ten authors): a paraphrase, a format change or a
less specific restatement rarely meets its lexical tests, and the two-label offline NLI model
has no entailment to read. The judge reads the same evidence as the rule, plus plain
comparisons of the two parsed claims (:mod:`engine.gate.judge.features`), and gives each of the
closest candidates the probability that the fact restates it: gradient-boosted trees
(:mod:`engine.gate.judge.boost`) fitted on labelled cases with the served models' own outputs
(``memgate models judge``), so it belongs to one embedder and NLI model, as thresholds do.

What it may change, and nothing else:

* a fact the rule would **add** is **skipped** when a judged candidate's probability is at
  least ``Policy.judge_duplicate`` (rule ``judged_duplicate``, that candidate the target);
* a rule **skip** of a judged candidate whose probability is below ``Policy.judge_keep`` is
  **added** instead (rule ``judged_new``): storing a duplicate loses nothing, skipping a new
  fact loses it.

It never replaces and never queues: a wrongful overwrite stays the rule's alone to prevent.
Every judged candidate reports its probability (``Candidate.duplicate``).

The judge file is sealed like a model manifest (``judge_sha256``: the sha256 of its canonical
JSON without the seal) and names the models it was fitted with; the gate loads it only for
those models (:func:`engine.gate.judge.store.find_judge`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from engine.gate.judge.boost import Boost
from engine.gate.judge.features import FEATURES, features
from engine.gate.policy import Evidence, Policy, Verdict

__all__ = ["FORMAT", "Judge", "VerdictJudge", "amended"]

FORMAT = "memgate-judge/1"


class VerdictJudge(Protocol):
    """What the gate asks of a judge: its bars for a named policy, and the rule's verdict
    amended (or as it was)."""

    def policy(self, policy: Policy) -> Policy: ...

    def amend(
        self, verdict: Verdict, evidence: Sequence[Evidence], fact: str, policy: Policy
    ) -> Verdict: ...


@dataclass(frozen=True)
class Judge:
    """A fitted duplicate judge and the bars chosen with it."""

    trees: Boost
    duplicate_bar: float
    """Probability at or above which a candidate the rule would add beside is a duplicate; the
    named policies' ``judge_duplicate`` (chosen by cross-validation when fitted)."""
    keep_bar: float
    """Probability below which a rule's skip is overturned; the named policies' ``judge_keep``."""
    models: Mapping[str, Any] = field(default_factory=dict)
    """The embedder and NLI artefacts it was fitted with: ``{"embedder": {"name", "variant",
    "model_sha256"}, "nli": {...}}``."""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    """How it was fitted: the labelled sets and their sha256, the settings, the cross-validated
    figures. Shown, never used to decide."""
    seal: str = ""
    """The judge file's ``judge_sha256`` when loaded from one (empty for a judge in memory)."""

    def __post_init__(self) -> None:
        if self.trees.n_features != len(FEATURES):
            raise ValueError(
                f"judge trees read {self.trees.n_features} features; this engine has "
                f"{len(FEATURES)}"
            )
        for name in ("duplicate_bar", "keep_bar"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"judge {name} must be in [0, 1]")

    def probabilities(self, rows: np.ndarray) -> np.ndarray:
        return self.trees.probability(rows)

    def policy(self, policy: Policy) -> Policy:
        """``policy`` with this judge's bars (a named policy runs with them)."""
        return replace(policy, judge_duplicate=self.duplicate_bar, judge_keep=self.keep_bar)

    def amend(
        self, verdict: Verdict, evidence: Sequence[Evidence], fact: str, policy: Policy
    ) -> Verdict:
        """``verdict`` as the judge amends it (unchanged with ``policy.judge`` off, or for a
        replace or a review); ``evidence`` is every candidate the rule saw, ``fact`` the
        fact's text."""
        if not policy.judge or verdict.action not in ("add", "skip"):
            return verdict
        chosen, rows = features(evidence, fact, policy.floor)
        if not chosen:
            return verdict
        probs = self.probabilities(rows)
        judged = {e.memory_id: float(p) for e, p in zip(chosen, probs, strict=True)}
        return amended(verdict, judged, policy)

    def describe(self) -> str:
        emb, nli = self.models.get("embedder", {}), self.models.get("nli", {})
        return (
            f"duplicate judge for {emb.get('name', '?')}/{emb.get('variant', '?')} + "
            f"{nli.get('name', '?')}/{nli.get('variant', '?')}"
        )


def amended(verdict: Verdict, duplicate: Mapping[str, float], policy: Policy) -> Verdict:
    """``verdict`` amended by the judged candidates' duplicate probabilities (memory id ->
    probability, most similar first): pure, so a fit can replay it over remembered verdicts."""
    if not policy.judge or verdict.action not in ("add", "skip") or not duplicate:
        return verdict
    action, target, rule = verdict.action, verdict.target_id, verdict.rule
    note: dict[str, str] = {}
    if action == "add":
        best = max(duplicate, key=lambda k: duplicate[k])  # the first of equals: most similar
        if duplicate[best] >= policy.judge_duplicate:
            action, target, rule = "skip", best, "judged_duplicate"
            note[best] = f"judged_duplicate:{duplicate[best]:.2f}"
    elif target is not None and target in duplicate and duplicate[target] < policy.judge_keep:
        note[target] = f"judged_new:{duplicate[target]:.2f}"
        action, target, rule = "add", None, "judged_new"
    cands = tuple(
        replace(
            c,
            duplicate=duplicate.get(c.memory_id),
            reason=note.get(c.memory_id, c.reason),
            passed=False if c.memory_id in note else c.passed,
        )
        for c in verdict.candidates
    )
    return Verdict(action, target, rule, cands)
