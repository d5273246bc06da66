"""engine.tuning.scoring: the labelling README's metrics, checked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from engine.tuning.scoring import (
    Seen,
    format_scores,
    headline,
    review_measures,
    score,
    update_reach,
)

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "benchmarks" / "data" / "heldout.jsonl"


def _load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def case(
    cid: str,
    action: str,
    target: str | None,
    category: str = "state_update",
    notes: str = "",
    memories: int = 3,
) -> dict[str, Any]:
    return {
        "id": cid,
        "category": category,
        "memories": [{"id": f"m{i}", "text": f"memory {i}"} for i in range(1, memories + 1)],
        "incoming": "x",
        "expected": {"action": action, "target": target},
        "notes": notes,
    }


def pred(cid: str, action: str, target: str | None = None) -> dict[str, Any]:
    return {"id": cid, "action": action, "target": target}


# -- the definitions, by hand -------------------------------------------------------------------
def test_wrongful_overwrites_and_their_breakdown() -> None:
    cases = [
        case("a", "replace", "m1", "lookalike", "[trap] sibling closer"),
        case("b", "replace", "m2"),
        case("c", "add", None, "unrelated"),
        case("d", "skip", "m3", "duplicate"),
        case("e", "review", "m1", "multi_claim"),
        case("f", "replace", "m1"),
    ]
    preds = [
        pred("a", "replace", "m2"),  # wrong sibling, on a trap
        pred("b", "replace", "m2"),  # right
        pred("c", "replace", "m1"),  # on an expected add
        pred("d", "replace", "m3"),  # on an expected skip
        pred("e", "replace", "m9"),  # on an expected review, with an id that does not exist
        pred("f", "review", "m1"),  # deferred: neither overwrite nor missed
    ]
    m = score(cases, preds)
    assert m["wrongful_overwrites"] == 4
    assert m["wrongful_overwrite_rate"] == pytest.approx(4 / 6)
    assert m["wrongful_overwrite_breakdown"] == {
        "wrong_target_on_expected_replace": 1,
        "on_expected_add": 1,
        "on_expected_skip": 1,
        "on_expected_review": 1,
        "on_trap_cases": 1,
    }
    assert m["trap_cases"] == 1
    assert m["update_recall"] == pytest.approx(1 / 3)
    assert m["update_precision"] == pytest.approx(1 / 5)
    assert m["deferred_updates"] == 1 and m["missed_updates"] == 0
    assert m["accuracy"] == pytest.approx(1 / 6)


def test_skips_adds_reviews_missing_and_accuracy_by_category() -> None:
    cases = [
        case("a", "skip", "m1", "duplicate"),
        case("b", "skip", "m2", "duplicate"),
        case("c", "add", None, "refinement"),
        case("d", "replace", "m1"),
        case("e", "review", None, "multi_claim"),
        case("f", "add", None, "refinement"),
        case("g", "replace", "m3"),
    ]
    preds = [
        pred("a", "skip", "m1"),
        pred("b", "skip", "m3"),  # a duplicate hit, wrong target: not accurate
        pred("c", "skip", "m1"),  # lost information
        pred("d", "add"),  # missed update
        pred("e", "review", "m2"),  # review is scored on the action alone
        pred("f", "maybe"),  # unknown action -> missing
        # g: no prediction -> missing
        pred("zz", "replace", "m1"),  # not a case: ignored
    ]
    m = score(cases, preds)
    assert m["duplicate_precision"] == pytest.approx(2 / 3)
    assert m["duplicate_recall"] == 1.0
    assert m["duplicate_target_accuracy"] == 0.5
    assert m["lost_information"] == 1
    assert m["missed_updates"] == 1 and m["missed_update_rate"] == 0.5
    assert m["missing_predictions"] == 2
    assert m["wrongful_overwrites"] == 0
    assert math.isnan(m["update_precision"])  # no predicted replace: undefined, not 0
    assert m["add_recall"] == 0.0 and m["add_precision"] == 0.0  # the one add was an update
    assert m["review_rate"] == pytest.approx(1 / 7) and m["review_recall"] == 1.0
    assert m["accuracy_by_category"] == {
        "duplicate": 0.5,
        "multi_claim": 1.0,
        "refinement": 0.0,
        "state_update": 0.0,
    }
    assert m["confusion_expected_x_predicted"]["add->missing"] == 1
    assert m["confusion_expected_x_predicted"]["replace->missing"] == 1


def test_the_last_prediction_of_an_id_counts() -> None:
    cases = [case("a", "replace", "m1")]
    m = score(cases, [pred("a", "add"), pred("a", "replace", "m1")])
    assert m["update_recall"] == 1.0 and m["accuracy"] == 1.0


def test_review_measures() -> None:
    cases = [
        case("a", "replace", "m1"),
        case("b", "replace", "m2"),
        case("c", "replace", "m3"),
        case("d", "add", None),
        case("e", "skip", "m1"),
        case("f", "add", None),
        case("g", "review", "m1"),
    ]
    preds = [
        pred("a", "review", "m1"),  # queued with the right target
        pred("b", "review", "m1"),  # queued, wrong target
        pred("c", "replace", "m3"),
        pred("d", "review", "m1"),  # queued needlessly
        pred("e", "skip", "m1"),
        pred("f", "add"),
        pred("g", "replace", "m1"),  # a wrongful overwrite
    ]
    r = review_measures(cases, preds)
    assert r == {
        "wrongful_overwrites": 1,
        "updates_queued_right_target": pytest.approx(1 / 3),
        "adds_skips_queued": pytest.approx(1 / 3),
    }


def test_update_reach_follows_each_true_update_to_the_first_step_it_fails() -> None:
    cases = [
        case("lost", "replace", "m1"),  # target not recalled
        case("low", "replace", "m1"),  # below the floor, within the lowest floor's reach
        case("asked-not", "replace", "m1"),  # above the floor, never scored
        case("soft", "replace", "m1"),  # scored 0.85: only within the lowest bar's reach
        case("beaten", "replace", "m2"),  # contradicted, but a more similar memory is too
        case("plain", "replace", "m1"),  # the plain rule's replace
        case("added", "add", None),  # not a true update: not counted
    ]
    seen = {
        "low": [Seen("m1", 0.55, 0.99)],
        "asked-not": [Seen("m1", 0.70, None)],
        "soft": [Seen("m1", 0.80, 0.85)],
        "beaten": [Seen("m1", 0.90, 0.97), Seen("m2", 0.70, 0.99), Seen(None, 0.95, 0.99)],
        "plain": [Seen("m2", 0.90, 0.10), Seen("m1", 0.70, 0.99), Seen("m3", 0.50, 0.99)],
        "added": [Seen("m1", 0.90, 0.99)],
    }
    r = update_reach(
        cases, seen, floor=0.60, contradiction=0.95, lowest_floor=0.40, lowest_bar=0.80
    )
    assert r["updates"] == 6
    assert r["target_recalled"] == pytest.approx(5 / 6)
    assert r["target_above_floor"] == pytest.approx(4 / 6)
    assert r["target_scored"] == pytest.approx(3 / 6)
    assert r["target_contradicted"] == pytest.approx(2 / 6)
    assert r["plain_rule"] == pytest.approx(1 / 6)
    assert r["target_within_reach"] == pytest.approx(4 / 6)  # low, soft, beaten, plain
    assert r["bars"] == {
        "floor": 0.60,
        "contradiction": 0.95,
        "lowest_floor": 0.40,
        "lowest_bar": 0.80,
    }
    # the bar is "exceeds", as in the gate; no lower floor or bar: the reach is the seed's
    at = update_reach(cases, seen, floor=0.60, contradiction=0.97)
    assert at["target_contradicted"] == at["target_within_reach"] == pytest.approx(2 / 6)
    at = update_reach(cases, seen, floor=0.60, contradiction=0.99)
    assert at["target_contradicted"] == 0.0 and at["plain_rule"] == 0.0
    # a "lowest" floor or bar above the policy's own is no lower
    at = update_reach(cases, seen, floor=0.60, contradiction=0.95, lowest_bar=0.99)
    assert at["bars"]["lowest_bar"] == 0.95
    nothing = update_reach([case("a", "add", None)], {}, floor=0.6, contradiction=0.9)
    assert nothing["updates"] == 0 and math.isnan(nothing["target_recalled"])


def test_text_output_names_every_figure() -> None:
    cases = [case("a", "replace", "m1"), case("b", "add", None)]
    m = score(cases, [pred("a", "replace", "m1"), pred("b", "add")])
    text = format_scores(m, review_measures(cases, []))
    for name in ("wrongful_overwrites", "on_trap_cases", "update_recall", "review measures"):
        assert name in text
    assert headline(m).startswith("wrongful overwrites 0 (0 on traps), update recall 1.000")
