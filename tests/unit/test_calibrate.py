"""engine.tuning.calibrate's pure parts (grid, choice, folds, cross-validation, memoised models) and
engine.tuning.policy_file, on synthetic predictions and fake models: no model files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.cli import main as cli_main
from engine.errors import InvalidInput
from engine.gate.policy import REVIEW, REVIEW_UNCERTAIN, STRICT, Policy, policy_by_name
from engine.tuning.calibrate import (
    Grid,
    MemoEmbedder,
    MemoNLI,
    Trial,
    choose,
    cross_validate,
    default_grid,
    folds,
    judge_grid,
    parse_grid,
    summary,
    table,
    within,
)
from engine.tuning.policy_file import (
    FORMAT,
    PolicyFile,
    PolicyFileGate,
    base_name,
    dump_policy_file,
    load_policy_file,
    resolve_overrides,
)


# -- the grid -----------------------------------------------------------------------------------
def test_parse_grid_lists_ranges_and_defaults() -> None:
    g = parse_grid(["floor=0.5:0.6:0.05", "ambiguity_margin=0.03,0.01"], STRICT)
    assert g.fields == ("floor", "contradiction", "dated_contradiction", "ambiguity_margin")
    assert g.values[0] == (0.5, 0.55, 0.6)
    assert g.values[3] == (0.01, 0.03)
    assert g.values[1] == tuple(default_grid(STRICT)["contradiction"])
    assert len(g.settings()) == 3 * 4 * 3 * 2
    assert g.settings()[0] == {
        "floor": 0.5,
        "contradiction": 0.85,
        "dated_contradiction": 0.7,
        "ambiguity_margin": 0.01,
    }
    only = parse_grid(["top_k=5,10"], STRICT, defaults=False)
    assert only.fields == ("top_k",) and only.values == ((5.0, 10.0),)


def test_default_grid_holds_the_base_values() -> None:
    for base in (STRICT, REVIEW):
        d = default_grid(base)
        assert base.floor in d["floor"] and base.contradiction in d["contradiction"]
        assert base.dated_contradiction in d["dated_contradiction"]


class _Judge:
    """What the grid reads of a served judge: whether it has update trees."""

    def __init__(self, updates: object | None = object()) -> None:
        self.updates = updates


def test_the_served_judges_bars_join_the_default_grid_where_the_policy_uses_them() -> None:
    from dataclasses import replace

    strict = replace(STRICT, judge_veto=0.45)
    assert judge_grid(strict, _Judge()) == {"judge_veto": [0.0, 0.3, 0.45, 0.6]}
    assert judge_grid(REVIEW, _Judge()) == {}  # review never replaces: no veto to sweep
    # review-uncertain replaces confident conflicts: the veto bar
    assert set(judge_grid(REVIEW_UNCERTAIN, _Judge())) == {"judge_veto"}
    # no judge, no update trees, or the judge turned off: those bars change nothing
    assert judge_grid(strict, None) == {}
    assert judge_grid(strict, _Judge(updates=None)) == {}
    assert judge_grid(replace(strict, judge=False), _Judge()) == {}
    g = parse_grid(["judge_veto=0.2,0.5", "top_k=5"], strict, judge=_Judge())
    assert g.fields == (
        "floor",
        "contradiction",
        "dated_contradiction",
        "judge_veto",
        "top_k",
    )
    assert g.values[3] == (0.2, 0.5)  # the user's values replace the default ones
    assert parse_grid([], strict, judge=_Judge()).values[3] == (0.0, 0.3, 0.45, 0.6)
    assert "judge_veto" not in parse_grid([], strict).fields  # no judge served
    assert parse_grid(["floor=0.6"], strict, defaults=False, judge=_Judge()).fields == ("floor",)
    with pytest.raises(InvalidInput, match=r"judge_veto must be in \[0, 1\]"):
        parse_grid(["judge_veto=1.5"], strict, judge=_Judge())
    for retired in ("judge_queue", "judge_dequeue", "judge_keep", "key_match_floor"):
        with pytest.raises(InvalidInput, match="not a numeric policy field"):
            parse_grid([f"{retired}=0.5"], strict, judge=_Judge())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("floor", "name=values"),
        ("lexical=0,1", "not a numeric policy field"),
        ("mode=1", "not a numeric policy field"),
        ("colour=1", "not a numeric policy field"),
        ("floor=1.5", "floor must be in [0, 1]"),
        ("floor=a,b", "a,b,c or start:stop:step"),
        ("floor=0.7:0.5:0.1", "a,b,c or start:stop:step"),
        ("top_k=2.5", "whole numbers"),
        ("top_k=0", "top_k must be in [1, 200]"),
    ],
)
def test_parse_grid_refuses_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_grid([spec], STRICT)


# -- choosing -----------------------------------------------------------------------------------
def _cases(n_replace: int, n_add: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n_replace):
        out.append(
            {
                "id": f"r{i}",
                "category": "state_update",
                "memories": [],
                "incoming": "",
                "expected": {"action": "replace", "target": "m1"},
            }
        )
    for i in range(n_add):
        out.append(
            {
                "id": f"a{i}",
                "category": "unrelated",
                "memories": [],
                "incoming": "",
                "expected": {"action": "add", "target": None},
            }
        )
    return out


def _trial(
    cases: list[dict[str, Any]], setting: dict[str, float], hits: set[int], overwrites: set[int]
) -> Trial:
    """Predictions: the replaces in ``hits`` right, the adds in ``overwrites`` replaced."""
    preds = []
    for i, c in enumerate(cases):
        if c["expected"]["action"] == "replace":
            p = {"id": c["id"], "action": "replace" if i in hits else "add", "target": "m1"}
        else:
            act = "replace" if i in overwrites else "add"
            p = {"id": c["id"], "action": act, "target": "m2" if act == "replace" else None}
        preds.append(p)
    return Trial(setting, tuple(preds))


GRID = Grid(("floor", "contradiction"), ((0.5, 0.6, 0.7), (0.9, 0.95)))


def test_choose_takes_max_recall_within_the_bound_and_ties_go_to_higher_thresholds() -> None:
    cases = _cases(4, 4)
    trials = [
        _trial(cases, {"floor": 0.5, "contradiction": 0.9}, {0, 1, 2, 3}, {4}),  # 1 overwrite
        _trial(cases, {"floor": 0.6, "contradiction": 0.9}, {0, 1, 2}, set()),
        _trial(cases, {"floor": 0.6, "contradiction": 0.95}, {0, 1, 2}, set()),  # tie, safer
        _trial(cases, {"floor": 0.7, "contradiction": 0.95}, {0}, set()),
    ]
    assert choose(GRID, trials, cases, 0) == 2
    assert choose(GRID, trials, cases, 1) == 0
    # with one overwrite allowed, a tie in recall goes to the one without it
    tied = [*trials, _trial(cases, {"floor": 0.5, "contradiction": 0.95}, {0, 1, 2, 3}, set())]
    assert choose(GRID, tied, cases, 1) == 4
    # none within the bound
    assert choose(GRID, trials[:1], cases, 0) is None
    # judged on a subset: the overwrite (case 4) is left out, so trial 0 wins
    assert choose(GRID, trials, cases, 0, subset=[0, 1, 2, 3, 5, 6]) == 0


def test_dominance_margin_is_safer_lower() -> None:
    g = Grid(("dominance_margin",), ((0.02, 0.06, 0.12),))
    assert g.safety({"dominance_margin": 0.02}) > g.safety({"dominance_margin": 0.12})
    g = Grid(("floor",), ((0.5, 0.6),))
    assert g.safety({"floor": 0.6}) > g.safety({"floor": 0.5})


def test_folds_are_a_stratified_reproducible_partition() -> None:
    cases = _cases(10, 7)
    parts = folds(cases, 3, seed=4)
    assert sorted(i for f in parts for i in f) == list(range(17))
    assert parts == folds(cases, 3, seed=4)
    assert parts != folds(cases, 3, seed=5)
    for f in parts:  # each fold holds its share of each stratum (10 replaces, 7 adds)
        assert sum(cases[i]["expected"]["action"] == "replace" for i in f) in (3, 4)
        assert sum(cases[i]["expected"]["action"] == "add" for i in f) in (2, 3)
    for k in (1, 18):
        with pytest.raises(InvalidInput, match="--folds"):
            folds(cases, k)


def test_cross_validation_scores_each_fold_with_the_choice_made_without_it() -> None:
    cases = _cases(6, 6)
    parts = folds(cases, 3, seed=0)
    # "risky" has the best recall but one overwrite, in fold 0's add; "safe" is clean.
    bad = next(i for i in parts[0] if cases[i]["expected"]["action"] == "add")
    risky = _trial(cases, {"floor": 0.5, "contradiction": 0.9}, set(range(6)), {bad})
    safe = _trial(cases, {"floor": 0.7, "contradiction": 0.95}, {0, 1, 2}, set())
    trials = [risky, safe]
    assert choose(GRID, trials, cases, 0) == 1  # in sample: safe
    cv = cross_validate(GRID, trials, cases, 0, k=3, seed=0)
    # fold 0 trains without the overwrite -> risky, which overwrites in fold 0 itself
    assert cv.folds[0]["setting"] == risky.setting and cv.folds[0]["met_bound_on_train"]
    assert cv.folds[0]["held_out"]["wrongful_overwrites"] == 1
    assert [f["setting"] for f in cv.folds[1:]] == [safe.setting, safe.setting]
    pooled = [(risky if i in parts[0] else safe).predictions[i] for i in range(len(cases))]
    assert cv.estimate == summary(cases, pooled)
    assert cv.estimate["wrongful_overwrites"] == 1  # what the in-sample choice hides


def test_cross_validation_falls_back_to_the_safest_setting() -> None:
    cases = _cases(3, 3)
    only = _trial(cases, {"floor": 0.5, "contradiction": 0.9}, {0}, {3, 4, 5})
    safest = _trial(cases, {"floor": 0.7, "contradiction": 0.95}, {0}, {3, 4, 5})
    cv = cross_validate(GRID, [only, safest], cases, 0, k=3)
    assert all(not f["met_bound_on_train"] for f in cv.folds)
    assert all(f["setting"] == safest.setting for f in cv.folds)


def test_table_marks_the_choice_and_sorts_safest_first() -> None:
    cases = _cases(2, 2)
    rows = [
        (
            {"floor": 0.5, "contradiction": 0.9},
            summary(cases, _trial(cases, {}, {0, 1}, {2}).predictions),
        ),
        (
            {"floor": 0.7, "contradiction": 0.9},
            summary(cases, _trial(cases, {}, {0}, set()).predictions),
        ),
    ]
    text = table(GRID, rows, mark=1).splitlines()
    assert text[0].split()[:2] == ["floor", "contradiction"]
    assert text[2].startswith("* 0.7") and "0.500" in text[2]
    assert text[3].strip().startswith("0.5")


# -- memoised models ----------------------------------------------------------------------------
class CountingEmbedder:
    dim = 2

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.asarray([[len(t), t.count("a")] for t in texts], dtype=np.float32)


class CountingNLI:
    contradiction_index, entailment_index = 0, None

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, str]]] = []

    def score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        self.calls.append(list(pairs))
        return np.asarray([[len(p) / 10, 1 - len(p) / 10] for p, _ in pairs], dtype=np.float32)


def test_memoised_models_compute_each_input_once_and_keep_the_order() -> None:
    inner = CountingEmbedder()
    memo = MemoEmbedder(inner)
    first = memo.embed(["aa", "b", "aa"])
    again = memo.embed(["b", "ccc", "aa"])
    assert inner.calls == [["aa", "b"], ["ccc"]] and memo.computed == 3
    assert first.tolist() == [[2, 2], [1, 0], [2, 2]]
    assert again.tolist() == [[1, 0], [3, 0], [2, 2]]
    assert memo.embed([]).shape == (0, 2)
    nli = CountingNLI()
    mnli = MemoNLI(nli)
    assert mnli.contradiction_index == 0 and mnli.entailment_index is None
    a = mnli.score([("x", "y"), ("xyz", "y")])
    b = mnli.score([("xyz", "y"), ("x", "y")])
    assert nli.calls == [[("x", "y"), ("xyz", "y")]] and mnli.computed == 2
    assert np.array_equal(a[::-1], b)


# -- policy files -------------------------------------------------------------------------------
def _write(path: Path, body: dict[str, Any]) -> Path:
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


def test_policy_file_round_trip(tmp_path: Path) -> None:
    pf = PolicyFile("review", {"floor": 0.5, "top_k": 12}, {"cases": {"sha256": "ab"}})
    dump_policy_file(tmp_path / "p.json", pf)
    back = load_policy_file(tmp_path / "p.json")
    assert back == pf
    assert back.policy.floor == 0.5 and back.policy.top_k == 12 and back.policy.mode == "review"
    assert resolve_overrides(None, tmp_path / "p.json") == ("review", back.overrides)
    assert resolve_overrides(None, None) == ("strict", {})
    with pytest.raises(InvalidInput, match="which is for review"):
        resolve_overrides("strict", tmp_path / "p.json")
    assert base_name("review", back) == "review"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"format": FORMAT, "base": "strict", "overrides": {"flor": 0.5}}, "flor"),
        ({"format": FORMAT, "base": "strict", "overrides": {"mode": "review"}}, "mode"),
        ({"format": FORMAT, "base": "strict", "overrides": {"floor": 2}}, "floor must be in"),
        ({"format": FORMAT, "base": "strict", "overrides": {"floor": "0.5"}}, "must be a float"),
        ({"format": FORMAT, "base": "strict", "overrides": {"lexical": 1}}, "must be a bool"),
        ({"format": FORMAT, "base": "strict", "overrides": {"top_k": 2.0}}, "must be a int"),
        ({"format": FORMAT, "base": "lenient", "overrides": {}}, "unknown policy 'lenient'"),
        ({"format": "other/1", "base": "strict"}, "format must be"),
        ({"format": FORMAT, "base": "strict", "extra": 1}, "unknown key"),
        ({"format": FORMAT, "base": "strict", "overrides": [1]}, "must be a JSON object"),
    ],
)
def test_policy_file_refusals(tmp_path: Path, body: dict[str, Any], message: str) -> None:
    path = _write(tmp_path / "p.json", body)
    with pytest.raises(InvalidInput, match=message) as err:
        load_policy_file(path)
    assert str(path) in str(err.value)


def test_unreadable_policy_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read"):
        load_policy_file(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(InvalidInput, match="not JSON"):
        load_policy_file(tmp_path / "bad.json")


class FakeGate:
    settings = "the gate's settings"

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def triage(self, facts: Any, policy: Any = "strict", **kw: Any) -> Any:
        self.seen.append((policy, kw))
        return "result"


def test_policy_file_gate_redefines_only_its_base_policy() -> None:
    inner = FakeGate()
    pf = PolicyFile("strict", {"floor": 0.75, "top_k": 5})
    gate = PolicyFileGate(inner, pf)
    assert gate.settings == "the gate's settings"
    assert gate.triage([], "strict", apply=True, overrides={"top_k": 3}) == "result"
    gate.triage([], "review")
    gate.triage([], REVIEW)
    (p1, kw1), (p2, kw2), (p3, _) = inner.seen
    # the named policy (so the gate adds its models' thresholds and judge's bars), with the
    # file's overrides under the request's own
    assert p1 == "strict" and kw1 == {"apply": True, "overrides": {"floor": 0.75, "top_k": 3}}
    assert p2 == "review" and kw2["overrides"] is None and p3 is REVIEW


def test_policy_file_gate_resolves_its_base_policy_with_the_files_settings() -> None:
    """The engine core resolves a request's policy once, at the edge (``gate.policy``), and
    hands the gate the result: through a policy file's gate that result holds the file's
    settings under the request's own, and triage passes it on without merging again."""

    class Resolving(FakeGate):
        def policy(self, policy: Any, overrides: dict[str, Any] | None = None) -> Policy:
            named = policy_by_name(policy) if isinstance(policy, str) else policy
            return named.with_overrides(overrides)

    inner = Resolving()
    gate = PolicyFileGate(inner, PolicyFile("strict", {"floor": 0.75, "top_k": 5}))
    pol = gate.policy("strict", {"top_k": 3})
    assert (pol.name, pol.floor, pol.top_k) == ("strict", 0.75, 3)
    assert gate.policy("review") == REVIEW
    gate.triage([], pol)
    assert inner.seen == [(pol, {"apply": False, "overrides": None})]


@pytest.mark.parametrize("command", ["triage", "serve", "backfill", "eval"])
def test_commands_refuse_a_bad_policy_file_with_exit_2_before_loading_models(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _write(tmp_path / "p.json", {"format": FORMAT, "base": "strict", "overrides": {"x": 1}})
    facts = tmp_path / "facts.jsonl"
    facts.write_text(json.dumps({"namespace": "a", "text": "A fact."}) + "\n", encoding="utf-8")
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"id": "c", "memories": [], "incoming": "x"}) + "\n", "utf-8")
    argv = {
        "triage": ["triage", str(facts)],
        "serve": ["serve", "--port", "0"],
        "backfill": ["backfill", "--input", str(facts)],
        "eval": ["eval", "--cases", str(cases)],
    }[command]
    common = ["--policy-file", str(bad), "--data-dir", str(tmp_path / "d")]
    assert cli_main(["--cache-dir", str(tmp_path / "no-models"), *argv, *common]) == 2
    err = capsys.readouterr().err
    assert "InvalidInput" in err and "unknown policy override(s): ['x']" in err


def test_review_objective_counts_updates_queued_with_the_right_target() -> None:
    from engine.tuning.calibrate import objective_for

    cases = _cases(3, 3)

    def queued(setting: dict[str, float], right: bool, needless: int) -> Trial:
        preds = [
            {"id": c["id"], "action": "review", "target": "m1" if right else "m2"}
            for c in cases[:3]
        ]
        preds += [
            {"id": c["id"], "action": "review" if i < needless else "add", "target": None}
            for i, c in enumerate(cases[3:])
        ]
        return Trial(setting, tuple(preds))

    trials = [
        queued({"floor": 0.5, "contradiction": 0.9}, True, 2),
        queued({"floor": 0.5, "contradiction": 0.95}, True, 1),  # as many handled, less noise
        queued({"floor": 0.7, "contradiction": 0.95}, False, 0),  # wrong targets
    ]
    assert objective_for(REVIEW) == "updates_handled" and objective_for(STRICT) == "update_recall"
    assert choose(GRID, trials, cases, 0, objective="updates_handled") == 1
    assert choose(GRID, trials, cases, 0, objective="update_recall") == 2  # all 0: safest
    assert summary(cases, trials[0].predictions)["updates_handled"] == 1.0


def test_a_review_choice_stays_within_the_needless_queue_bound() -> None:
    cases = _cases(2, 10)

    def queued(setting: dict[str, float], handled: int, needless: int) -> Trial:
        preds = [
            {"id": c["id"], "action": "review" if i < handled else "add", "target": "m1"}
            for i, c in enumerate(cases[:2])
        ]
        preds += [
            {"id": c["id"], "action": "review" if i < needless else "add", "target": None}
            for i, c in enumerate(cases[2:])
        ]
        return Trial(setting, tuple(preds))

    trials = [
        queued({"floor": 0.5, "contradiction": 0.9}, 2, 3),  # both updates, 30% needless
        queued({"floor": 0.6, "contradiction": 0.9}, 1, 1),  # one update, 10%
        queued({"floor": 0.7, "contradiction": 0.95}, 0, 0),
    ]
    objective = "updates_handled"
    assert choose(GRID, trials, cases, 0, objective=objective) == 0  # no bound: most handled
    assert choose(GRID, trials, cases, 0, objective=objective, max_needless=0.10) == 1
    assert choose(GRID, trials, cases, 0, objective=objective, max_needless=0.3) == 0
    assert choose(GRID, trials[:1], cases, 0, objective=objective, max_needless=0.1) is None
    m = summary(cases, trials[0].predictions)
    assert m["adds_skips_queued"] == pytest.approx(0.3)
    assert within(m, 0) and within(m, 0, 0.3) and not within(m, 0, 0.29)
    cv = cross_validate(GRID, trials, cases, 0, k=2, objective=objective, max_needless=0.10)
    assert all(f["setting"] != trials[0].setting for f in cv.folds if f["met_bound_on_train"])
    rows = [(t.setting, summary(cases, t.predictions)) for t in trials]
    text = table(GRID, rows, mark=1, objective=objective).splitlines()
    assert text[0].split()[-4:] == ["updates", "handled", "queued", "needlessly"]
    assert text[2].split()[-2:] == ["1.000", "0.300"]  # the most handled first, at 0 overwrites
    assert "needlessly" not in table(GRID, rows).splitlines()[0]


def test_a_missing_bench_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from engine.tuning.calibrate import pyplot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an absent package imports as
    with pytest.raises(SystemExit, match=r"bench extra .*memgate\[bench\].*--no-plot"):
        pyplot()
