"""benchmarks/ablate.py: every arm is a valid override that turns its mechanism off, and the
pre-registered retirement rule."""

from __future__ import annotations

from typing import Any

from benchmarks.ablate import ARMS, retire, split_ours
from engine.gate.policy import REVIEW, STRICT


def fig(net: int, wo: int, right: float = 0.8, needless: float = 0.1) -> dict[str, Any]:
    return {"net": net, "wrongful_overwrites": wo, "queued_right": right, "needless": needless}


def test_every_arm_is_a_valid_override_that_changes_the_policy() -> None:
    assert ARMS["on"] == {}
    bars = {"judge_veto": 0.3}  # a fitted judge's
    for name, overrides in ARMS.items():
        for base in (STRICT.with_overrides(bars), REVIEW.with_overrides(bars)):
            pol = base.with_overrides(overrides)  # unknown names are refused
            assert (pol != base) == (name != "on"), name


def test_retirement_rule() -> None:
    on = fig(100, 5)
    assert retire(on, fig(97, 5)) == (True, "net 97 <= 100 - 3")
    assert retire(on, fig(98, 5))[0] is False  # a cost of 2 does not keep it
    assert retire(on, fig(120, 6))[0] is True  # one more wrongful overwrite keeps it
    assert retire(on, fig(100, 5, right=0.79))[0] is True
    assert retire(on, fig(100, 5, right=0.79, needless=0.05))[0] is False  # fewer queued
    assert retire(on, fig(130, 2)) == (False, "no cost on the outside sets")


def test_our_sets_the_judge_was_fitted_on_are_a_group_of_their_own() -> None:
    case = [{"id": "x"}]
    groups = {"ours": [("heldout", case), ("heldout17", case)], "outside": [("dyknow", case)]}
    split = split_ours(groups, {"heldout"})
    assert split == {
        "ours, unseen by the judge": [("heldout17", case)],
        "ours, judge fitted on them": [("heldout", case)],
        "outside": [("dyknow", case)],
    }
    assert split_ours(groups, set()) == groups  # no judge, or none of ours in its fit
    only_seen = split_ours({"ours": [("heldout", case)]}, {"heldout"})
    assert list(only_seen) == ["ours, judge fitted on them"]  # no empty group
