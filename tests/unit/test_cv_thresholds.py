"""cv_thresholds' pure parts: the leave-one-set-out choice and the replay of the policy rule over
captured evidence. Synthetic evidence, no model."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cv_thresholds as cv  # noqa: E402

from engine.gate.policy import STRICT, Evidence, apply_rule  # noqa: E402


def test_each_set_is_judged_with_the_setting_chosen_on_the_others() -> None:
    # setting a is best on x and y, setting b is best on z; the default (c) is never best
    results = {
        (1.0,): {"x": (9, 0, 10), "y": (9, 0, 10), "z": (5, 0, 10)},
        (2.0,): {"x": (5, 0, 10), "y": (5, 0, 10), "z": (19, 0, 20)},
        (3.0,): {"x": (6, 0, 10), "y": (6, 0, 10), "z": (6, 0, 10)},
    }
    chosen = dict(cv.leave_one_out(results, ["x", "y", "z"], (3.0,)))
    assert chosen["x"] == (2.0,)  # on y + z: a 14, b 24
    assert chosen["z"] == (1.0,)  # on x + y: a 18, b 10
    assert chosen["y"] == (2.0,)


def test_a_wrongful_overwrite_counts_twice_and_ties_go_to_the_default() -> None:
    results = {
        (0.5,): {"x": (10, 3, 10), "y": (8, 0, 10)},  # 7 on x
        (0.9,): {"x": (7, 0, 10), "y": (8, 0, 10)},  # 7 on x: a tie
    }
    assert dict(cv.leave_one_out(results, ["x", "y"], (0.9,)))["y"] == (0.9,)
    assert dict(cv.leave_one_out(results, ["x", "y"], (0.5,)))["y"] == (0.5,)


def test_replay_applies_the_policy_to_the_captured_evidence() -> None:
    ev = [Evidence("s1", "memory", 0.9, contradiction=0.97, attribute=0.9, subject="shared")]
    owners = {"s1": "m1"}
    loose = cv.replay([ev], ["c-1"], owners, STRICT, apply_rule)
    strict = cv.replay(
        [ev], ["c-1"], owners, STRICT.with_overrides({"contradiction": 0.98}), apply_rule
    )
    assert loose == [{"id": "c-1", "action": "replace", "target": "m1"}]
    assert strict == [{"id": "c-1", "action": "add", "target": None}]


def test_the_grid_holds_the_defaults_and_takes_overrides() -> None:
    grid = cv.parse_grid(["contradiction=0.95,0.99"])
    assert grid["contradiction"] == [0.95, 0.99]
    for name, values in cv.GRID.items():
        assert float(getattr(STRICT, name)) in values, name


def test_held_out_sets_are_refused_before_anything_is_read() -> None:
    import pytest

    for name in cv.HELD_OUT:
        with pytest.raises(SystemExit, match=f"{name}: held out"):
            cv.main(["--sets", "dev", name])
    assert not set(cv.HELD_OUT) & set(cv.TUNED_ON)
