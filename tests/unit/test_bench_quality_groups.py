"""benchmarks/bench_quality.py: a set the judge was fitted on is never pooled with the sets
its quality is reported on (issue 31: nothing fitted on a set used to report its quality)."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks.bench_quality import GROUPS, group_of, judge_sets

SETS = {
    "heldout": {"sha256": "aa"},
    "heldout17": {"sha256": "bb"},
    "dyknow": {"sha256": "cc"},
}


def test_the_judges_sets_are_found_by_their_bytes_not_their_names() -> None:
    judge = SimpleNamespace(provenance={"sets": [{"name": "renamed", "sha256": "aa"}]})
    assert judge_sets(judge, SETS) == {"heldout"}
    edited = SimpleNamespace(provenance={"sets": [{"name": "heldout17", "sha256": "other"}]})
    assert judge_sets(edited, SETS) == set()  # same name, other bytes: not what it saw
    assert judge_sets(None, SETS) == set()
    assert judge_sets(SimpleNamespace(provenance={}), SETS) == set()


def test_groups_keep_the_fitted_sets_apart() -> None:
    seen = {"heldout"}
    outside = {"dyknow"}
    assert group_of("heldout", outside, seen) == GROUPS[1]
    assert group_of("heldout17", outside, seen) == GROUPS[0]
    assert group_of("dyknow", outside, seen) == GROUPS[2]
    assert len(set(GROUPS)) == 3
