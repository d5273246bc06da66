"""The gate's closed vocabularies: the rule a decision reports, the reason a candidate reports,
how two texts' subjects relate. ``StrEnum``: a member *is* its plain string in records. Some
reasons carry a detail after a colon; :func:`partial_rule` and :func:`confident_rule` compose.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Reason", "Rule", "Subject", "confident_rule", "detailed", "partial_rule"]


class Rule(StrEnum):
    """Why a fact was decided as it was (``Decision.rule``); each rule's condition and outcome
    is its row of :data:`engine.gate.table.ROWS`."""

    # -- no model: episodes, keyed facts, replays
    EPISODIC = "episodic"
    KEYED = "keyed"
    KEYED_NEW = "keyed_new"
    KEYED_SAME = "keyed_same"
    REPLAYED = "replayed"
    # -- free text: the policy's rule (engine.gate.policy.apply_rule)
    NO_CANDIDATE_ABOVE_FLOOR = "no_candidate_above_floor"
    DUPLICATE = "duplicate"
    CONTAINED = "contained"
    RESTATED = "restated"
    NO_CONFLICT = "no_conflict"
    OLDER_THAN_TARGET = "older_than_target"
    AMBIGUOUS_TARGET = "ambiguous_target"
    ATTRIBUTE_RIVAL = "attribute_rival"
    DOMINATED = "dominated"
    UNPROVEN = "unproven"
    CONTRADICTION = "contradiction"
    EXPLICIT_CHANGE = "explicit_change"
    LATER_DATED = "later_dated"
    PARTIAL_CONTRADICTION = "partial_contradiction"
    # -- the judge (engine.gate.judge)
    JUDGED_NOT_UPDATE = "judged_not_update"
    JUDGED_DUPLICATE = "judged_duplicate"


class Reason(StrEnum):
    """Why a candidate passed or not (``Candidate.reason``; some carry a detail after ``:``)."""

    BELOW_FLOOR = "below_floor"
    NOT_REACHED = "not_reached"
    """The decision was made before this candidate was weighed."""
    DUPLICATE = "duplicate"
    CONTAINS_NEW_FACT = "contains_new_fact"
    SAME_VALUES = "same_values"
    SAME_KEY = "same_key"
    MISMATCH = "mismatch"
    """About something else (detail: ``other_subject`` or ``other_instance``)."""
    LOW_CONTRADICTION = "low_contradiction"
    CONTRADICTION = "contradiction"
    LATER_DATED = "later_dated"
    OLDER_THAN_TARGET = "older_than_target"
    AMBIGUOUS = "ambiguous"
    NEARER_ATTRIBUTE = "nearer_attribute"
    DOMINATED_BY = "dominated_by"
    """Detail: the more similar memory's id."""
    UNPROVEN = "unproven"
    """Detail: the missing evidence (``subject_disjoint``, ``attribute:0.05<0.10``...)."""
    JUDGED_NOT_UPDATE = "judged_not_update"
    JUDGED_DUPLICATE = "judged_duplicate"
    """The judge's probability follows as the detail."""


class Subject(StrEnum):
    """How the subjects of a fact and a memory relate (:mod:`engine.gate.evidence`)."""

    SHARED = "shared"
    """A word of one subject occurs in the other text."""
    DISJOINT = "disjoint"
    """Both name a subject and neither's occurs in the other (or their owners differ)."""
    APART = "apart"
    """Two things of one kind named on the subject side: "Hive 2" and "Hive 4"."""
    UNKNOWN = "unknown"
    """One text names no subject (an instruction, a fragment)."""


def detailed(reason: Reason, detail: object) -> str:
    """``reason:detail``, as a candidate reports it."""
    return f"{reason}:{detail}"


def partial_rule(rule: str) -> str:
    """The rule of a partial contradiction found by ``rule``."""
    return f"{Rule.PARTIAL_CONTRADICTION}:{rule}"


def confident_rule(rule: str) -> str:
    """The rule of a conflict review-uncertain replaced unattended."""
    return f"{rule}+confident"
