"""The pure decision rule, on synthetic evidence: no models, no store."""

from __future__ import annotations

import pytest

from engine.errors import InvalidInput
from engine.gate.policy import (
    REVIEW,
    REVIEW_UNCERTAIN,
    STRICT,
    Evidence,
    Policy,
    apply_rule,
    policy_by_name,
)


def ev(mid: str, sim: float, contra: float | None = 0.0, **kw: object) -> Evidence:
    kw.setdefault("attribute", 1.0)  # same attribute proven: these tests are about the rest
    return Evidence(memory_id=mid, text=f"memory {mid}", similarity=sim, contradiction=contra, **kw)  # type: ignore[arg-type]


def test_no_candidates_adds() -> None:
    v = apply_rule([], STRICT)
    assert (v.action, v.target_id, v.rule) == ("add", None, "no_candidate_above_floor")


def test_below_floor_is_never_replaced_even_if_contradicting() -> None:
    v = apply_rule([ev("a", 0.59, 0.999)], STRICT)
    assert v.action == "add"
    assert v.candidates[0].reason == "below_floor"
    # ...but the review policy's floor is lower
    assert apply_rule([ev("a", 0.59, 0.999)], REVIEW).action == "review"


def test_replaces_only_the_single_most_similar_passing_candidate() -> None:
    v = apply_rule([ev("far", 0.70, 0.99), ev("near", 0.85, 0.99), ev("calm", 0.88, 0.10)], STRICT)
    assert (v.action, v.target_id) == ("replace", "near")
    passed = {c.memory_id: c.passed for c in v.candidates}
    assert passed == {"calm": False, "near": True, "far": True}


def test_threshold_is_strictly_greater() -> None:
    assert apply_rule([ev("a", 0.8, 0.95)], STRICT).action == "add"
    assert apply_rule([ev("a", 0.8, 0.9501)], STRICT).action == "replace"


def test_review_uncertain_queues_uncertain_conflicts_and_applies_confident_ones() -> None:
    pol = policy_by_name("review-uncertain")
    assert pol is REVIEW_UNCERTAIN and pol.review_scope == "uncertain" and pol.floor == 0.45
    # between the review floor and the confident floor: queued
    assert (apply_rule([ev("a", 0.5, 0.99)], pol).action, "a") == ("review", "a")
    confident = apply_rule([ev("a", 0.8, 0.99)], pol)
    assert (confident.action, confident.rule) == ("replace", "contradiction+confident")
    same = apply_rule([ev("a", 0.8, 0.99)], REVIEW.with_overrides({"review_scope": "uncertain"}))
    assert same.action == "replace"


def test_review_queues_every_conflict_and_replaces_nothing() -> None:
    # the seed's review policy: floor 0.45, every conflict to the queue
    assert REVIEW.floor == 0.45 and REVIEW.review_scope == "all"
    for sim in (0.5, 0.8, 0.99):
        v = apply_rule([ev("a", sim, 0.99)], REVIEW)
        assert (v.action, v.target_id) == ("review", "a")


def test_partial_contradiction_of_a_multi_claim_memory_is_reviewed_even_under_strict() -> None:
    v = apply_rule([ev("a", 0.8, 0.99, partial=True)], STRICT)
    assert (v.action, v.target_id) == ("review", "a")
    assert v.rule.startswith("partial_contradiction")


def test_contained_fact_is_skipped_against_the_memory_that_contains_it() -> None:
    v = apply_rule([ev("a", 0.8, 0.99), ev("b", 0.7, 0.3, contained=True)], STRICT)
    assert (v.action, v.target_id, v.rule) == ("skip", "b", "contained")


def test_a_much_less_similar_conflict_is_dominated_by_the_fact_s_real_subject() -> None:
    v = apply_rule([ev("subject", 0.86, 0.30), ev("other", 0.70, 0.99)], STRICT)
    assert (v.action, v.rule) == ("add", "dominated")


def test_a_pure_value_change_needs_less_contradiction() -> None:
    weak = ev("fee", 0.97, 0.70)
    assert apply_rule([weak], STRICT).action == "add"
    changed = ev("fee", 0.97, 0.70, value_change=True)
    assert (apply_rule([changed], STRICT).action, apply_rule([changed], STRICT).target_id) == (
        "replace",
        "fee",
    )
    far = ev("fee", 0.80, 0.70, value_change=True)  # below value_change_similarity
    assert apply_rule([far], STRICT).action == "add"
    low = ev("fee", 0.97, 0.30, value_change=True, new_values=True)  # model: compatible
    assert apply_rule([low], STRICT).action == "add"


def test_a_rival_with_a_value_of_the_changed_kind_and_a_nearer_frame_is_reviewed() -> None:
    money = frozenset({"money"})
    fee = ev("fee", 0.80, 0.99, changed_kinds=money, attribute=0.11)
    limit = ev("limit", 0.75, 0.93, changed_kinds=money, attribute=0.36)  # below the bar
    v = apply_rule([fee, limit], STRICT)
    assert (v.action, v.target_id, v.rule) == ("review", "fee", "attribute_rival")
    assert {c.memory_id: c.reason for c in v.candidates}["limit"] == "nearer_attribute"
    # not nearer by the margin, of another kind, or about another subject: the target stands
    for rival in (
        ev("limit", 0.75, 0.93, changed_kinds=money, attribute=0.25),
        ev("limit", 0.75, 0.93, changed_kinds=frozenset({"date"}), attribute=0.9),
        ev("limit", 0.75, 0.93, changed_kinds=money, attribute=0.9, subject="disjoint"),
    ):
        assert apply_rule([fee, rival], STRICT).action == "replace"
    assert apply_rule([fee, limit], STRICT.with_overrides({"attribute_margin": 0.3})).action == (
        "replace"
    )


def test_duplicate_is_checked_before_contradiction() -> None:
    v = apply_rule([ev("a", 0.97, 0.05), ev("b", 0.80, 0.99)], STRICT)
    assert (v.action, v.target_id, v.rule) == ("skip", "a", "duplicate")


def test_near_identical_but_contradicting_is_an_update_not_a_duplicate() -> None:
    v = apply_rule([ev("a", 0.97, 0.99)], STRICT)
    assert (v.action, v.target_id) == ("replace", "a")


def test_duplicate_needs_mutual_entailment_when_measured() -> None:
    one_way = apply_rule([ev("a", 0.95, 0.01, entailment=0.9, reverse_entailment=0.1)], STRICT)
    both = apply_rule([ev("a", 0.95, 0.01, entailment=0.9, reverse_entailment=0.8)], STRICT)
    assert one_way.action == "add"
    assert both.action == "skip"


def test_two_equally_plausible_targets_go_to_review() -> None:
    v = apply_rule([ev("a", 0.80, 0.99), ev("b", 0.795, 0.99)], STRICT)
    assert v.action == "review"
    assert v.rule == "ambiguous_target"


def test_overrides_are_validated() -> None:
    assert STRICT.with_overrides({"floor": 0.7}).floor == 0.7
    with pytest.raises(InvalidInput):
        STRICT.with_overrides({"floor": 1.5})
    with pytest.raises(InvalidInput):
        STRICT.with_overrides({"no_such_setting": 1})
    retired = (  # issue 31: deleted, not switched off; refused like any unknown name
        "keys",
        "key_match_contradiction",
        "key_match_floor",
        "key_ambiguity_margin",
        "normalize",
        "verify_reverse",
        "reverse_contradiction",
        "judge_keep",
        "judge_queue",
        "judge_dequeue",
        "old_value",
    )
    for name in retired:
        with pytest.raises(InvalidInput, match="unknown policy override"):
            STRICT.with_overrides({name: 0})
    with pytest.raises(InvalidInput):
        STRICT.with_overrides({"mode": "replace"})
    with pytest.raises(InvalidInput):
        REVIEW.with_overrides({"review_scope": "some"})
    for bad in (-1, 2.5, 21):
        with pytest.raises(InvalidInput, match="partial_values"):
            STRICT.with_overrides({"partial_values": bad})


def test_named_policies() -> None:
    assert policy_by_name("strict").floor == 0.60 and policy_by_name("strict").contradiction == 0.95
    assert policy_by_name("review").floor == 0.45 and policy_by_name("review").mode == "review"
    with pytest.raises(InvalidInput):
        policy_by_name("lenient")
    with pytest.raises(InvalidInput):
        Policy(top_k=0)


# -- the seed's plain rule (issue 31, item 5) ------------------------------------------------------
def seed_rule(evidence: list[Evidence], floor: float, bar: float) -> str | None:
    """The seed's rule as published, written out independently: the most similar candidate at
    or above the floor whose contradiction exceeds the bar (None: add)."""
    passing = [e for e in evidence if e.similarity >= floor and (e.contradiction or 0.0) > bar]
    return max(passing, key=lambda e: e.similarity).memory_id if passing else None


def test_seed_policies_are_named_and_turn_every_mechanism_off() -> None:
    from engine.gate.policy import POLICY_NAMES, SEED, SEED_REVIEW

    assert policy_by_name("seed") is SEED and policy_by_name("seed-review") is SEED_REVIEW
    assert {"seed", "seed-review"} <= set(POLICY_NAMES)
    assert (SEED.floor, SEED.contradiction, SEED.mode) == (0.60, 0.95, "replace")
    assert (SEED_REVIEW.floor, SEED_REVIEW.mode, SEED_REVIEW.review_scope) == (
        0.45,
        "review",
        "all",
    )
    for pol in (SEED, SEED_REVIEW):
        switches = (
            "lexical",
            "claims",
            "evidence",
            "judge",
            "duplicates",
            "dominance",
            "model_bars",
            "time_order",
            "explicit_change",
        )
        assert not any(getattr(pol, name) for name in switches), pol.name
        assert pol.ambiguity_margin == 0.0
        assert pol.partial_values == 0
    # a named policy's mechanism switches are all on; the seed's the same fields, all off
    assert all(getattr(STRICT, name) for name in ("duplicates", "dominance", "model_bars"))
    with pytest.raises(InvalidInput, match="model_bars"):
        SEED.with_overrides({"model_bars": True})


def test_seed_replaces_the_closest_confidently_contradicted_candidate_and_nothing_else() -> None:
    from engine.gate.policy import SEED

    v = apply_rule(
        [
            ev("calm", 0.97, 0.10),  # closest, not contradicted
            ev("near", 0.80, 0.99),  # the closest contradicted one: the target
            ev("close", 0.79, 0.999),  # as contradicted, 0.01 less similar: no ambiguity test
            ev("far", 0.65, 0.999),
            ev("under", 0.59, 1.0),  # below the floor
        ],
        SEED,
    )
    assert (v.action, v.target_id, v.rule) == ("replace", "near", "contradiction")
    reasons = {c.memory_id: c.reason for c in v.candidates}
    assert reasons == {
        "calm": "low_contradiction",
        "near": "contradiction",
        "close": "contradiction",
        "far": "contradiction",
        "under": "below_floor",
    }
    # the bar is strict (> 0.95), the floor inclusive (>= 0.60)
    assert apply_rule([ev("a", 0.80, 0.95)], SEED).action == "add"
    assert apply_rule([ev("a", 0.60, 0.951)], SEED).target_id == "a"


def test_seed_ignores_what_strict_weighs() -> None:
    """Near-identical, dominated, unproven: strict holds back; the seed replaces."""
    from engine.gate.policy import SEED

    identical = ev("a", 0.99, 0.99, entailment=0.9, reverse_entailment=0.9)
    assert apply_rule([identical], SEED).action == "replace"
    dominated = [ev("subject", 0.86, 0.10), ev("other", 0.70, 0.99)]
    assert apply_rule(dominated, STRICT).rule == "dominated"
    assert apply_rule(dominated, SEED).target_id == "other"
    unproven = ev("a", 0.8, 0.99, subject="disjoint")
    assert apply_rule([unproven], STRICT).rule == "unproven"
    assert apply_rule([unproven], SEED).target_id == "a"
    rivals = [ev("a", 0.80, 0.99), ev("b", 0.79, 0.99)]
    assert apply_rule(rivals, STRICT).rule == "ambiguous_target"
    assert apply_rule(rivals, SEED).target_id == "a"


def test_seed_equals_the_published_rule_on_random_evidence() -> None:
    """Over random candidates with what the seed's pipeline measures (similarity,
    contradiction, and entailment both ways for a model that has it), the named policy picks
    exactly what the written-out rule picks, and seed-review queues that same target."""
    import random

    from engine.gate.policy import SEED, SEED_REVIEW

    rng = random.Random(31)
    replaced = 0
    for _ in range(2000):
        evidence = [
            Evidence(
                memory_id=f"m{i}",
                text=f"memory {i}",
                similarity=rng.choice([rng.random(), 0.6, 0.45, 0.95, 0.99]),
                contradiction=rng.choice([rng.random(), 0.95, 0.96, 0.999, None]),
                entailment=rng.choice([None, rng.random()]),
                reverse_entailment=rng.choice([None, rng.random()]),
            )
            for i in range(rng.randint(0, 6))
        ]
        want = seed_rule(evidence, 0.60, 0.95)
        v = apply_rule(evidence, SEED)
        assert (v.action, v.target_id) == (("replace", want) if want else ("add", None))
        replaced += want is not None
        queued = seed_rule(evidence, 0.45, 0.95)
        r = apply_rule(evidence, SEED_REVIEW)
        assert (r.action, r.target_id) == (("review", queued) if queued else ("add", None))
    assert 300 < replaced < 1700  # both branches exercised


# -- general update signals (issue 31, item 4) ----------------------------------------------------
SIGNALS = Policy(time_order=True)
NO_SIGNALS = Policy(time_order=False)


def test_time_order_is_on_in_the_named_policies() -> None:
    """As the pre-registered adoption rule decided (docs/experiments/2026-12-05-gate-v3.md)."""
    for name in ("strict", "review", "review-uncertain"):
        assert policy_by_name(name).time_order, name


def test_a_later_dated_fact_updates_its_subject_s_attribute_at_a_lower_bar() -> None:
    dated = ev("a", 0.96, 0.90, subject="shared", dated="later")
    assert apply_rule([dated], NO_SIGNALS).rule == "no_conflict"  # under 0.95: added without it
    v = apply_rule([dated], SIGNALS)
    assert (v.action, v.target_id, v.rule) == ("replace", "a", "later_dated")
    assert v.candidates[0].reason == "later_dated"
    # the bar is dated_contradiction (0.80), not lower
    assert apply_rule([ev("a", 0.9, 0.85, subject="shared", dated="later")], SIGNALS).action == (
        "replace"
    )
    assert (
        apply_rule([ev("a", 0.9, 0.75, subject="shared", dated="later")], SIGNALS).action == "add"
    )


def test_a_dated_fact_about_another_subject_is_never_its_target() -> None:
    for subject in ("disjoint", "apart", "unknown"):
        lookalike = ev("a", 0.96, 0.90, subject=subject, dated="later")
        assert apply_rule([lookalike], SIGNALS).action == "add", subject
    other_frame = ev("a", 0.96, 0.90, subject="shared", dated="later", attribute=0.05)
    assert apply_rule([other_frame], SIGNALS).action == "add"


def test_an_earlier_dated_fact_arriving_late_is_added_to_history() -> None:
    older = ev("a", 0.9, 0.99, subject="shared", dated="earlier")
    assert apply_rule([older], NO_SIGNALS).action == "replace"
    v = apply_rule([older], SIGNALS)
    assert (v.action, v.target_id, v.rule) == ("add", None, "older_than_target")
    assert v.candidates[0].reason == "older_than_target"
    assert apply_rule([older], replace_review(SIGNALS)).action == "add"


def replace_review(pol: Policy) -> Policy:
    from dataclasses import replace

    return replace(pol, name="review", mode="review", floor=0.45)


def test_the_judge_never_vetoes_a_signalled_update() -> None:
    from engine.gate.judge import amended

    strict = Policy(time_order=True, judge_veto=0.5)
    dated = apply_rule([ev("a", 0.9, 0.9, subject="shared", dated="later")], strict)
    assert dated.rule == "later_dated"
    assert amended(dated, {}, strict, {"a": 0.01}) == dated
    plain = apply_rule([ev("a", 0.7, 0.99)], strict)
    assert amended(plain, {}, strict, {"a": 0.01}).rule == "judged_not_update"


def test_an_explicit_change_of_the_held_value_is_an_update_at_any_contradiction() -> None:
    named = ev("a", 0.80, 0.10, changed_from=True)
    v = apply_rule([named], STRICT)
    assert (v.action, v.target_id, v.rule) == ("replace", "a", "explicit_change")
    assert apply_rule([named], REVIEW).rule == "explicit_change"
    # never for another subject, and off by its switch (the seed's rule knows nothing of it)
    assert (
        apply_rule([ev("a", 0.80, 0.10, changed_from=True, subject="disjoint")], STRICT).action
        == "add"
    )
    assert apply_rule([named], STRICT.with_overrides({"explicit_change": False})).action == "add"
    # a near-identical memory that holds the old value is the target, not a duplicate
    twin = ev("a", 0.97, 0.01, entailment=0.9, reverse_entailment=0.9, changed_from=True)
    assert apply_rule([twin], STRICT).action == "replace"


def test_the_same_question_re_answered_passes_at_the_dated_bar() -> None:
    bar = STRICT.dated_contradiction
    assert bar < STRICT.contradiction
    between = (bar + STRICT.contradiction) / 2
    assert apply_rule([ev("a", 0.80, between)], STRICT).action == "add"
    v = apply_rule([ev("a", 0.80, between, same_question=True)], STRICT)
    assert (v.action, v.target_id) == ("replace", "a")
    asked_else = ev("a", 0.80, 0.99, mismatch="other_question")
    assert apply_rule([asked_else], STRICT).action == "add"
