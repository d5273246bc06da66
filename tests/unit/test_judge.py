"""The judge: its boosted trees, its features, what it may change, and its file.

Pure logic and spaCy's parse; no model file (the judge is fitted here on synthetic rows)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engine.errors import ModelError
from engine.gate.judge import FORMAT, Judge, amended
from engine.gate.judge.boost import Boost
from engine.gate.judge.features import FEATURES, JUDGED, features, judged
from engine.gate.judge.store import OlderJudge, find_judge, judge_path, load_judge, save_judge
from engine.gate.policy import REVIEW, REVIEW_UNCERTAIN, STRICT, Evidence, apply_rule
from engine.runtime.manifest import manifest_digest
from engine.tuning.boost import BoostSettings, fit

SMALL = BoostSettings(trees=30, max_leaves=4, min_leaf=5)


# -- boosting -------------------------------------------------------------------------------------
def _xor(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 3))
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).astype(float)  # an interaction no linear model fits
    return x, y


def test_boosting_learns_an_interaction_and_generalises() -> None:
    x, y = _xor(600)
    model = fit(x, y, BoostSettings(trees=60, max_leaves=4, min_leaf=5, learning_rate=0.3))
    xt, yt = _xor(400, seed=1)
    accuracy = ((model.probability(xt) > 0.5) == (yt > 0.5)).mean()
    assert accuracy > 0.9
    # the base rate alone (a constant) would be right about half the time
    assert abs(yt.mean() - 0.5) < 0.1


def test_boosting_is_deterministic_and_round_trips_through_json() -> None:
    x, y = _xor(300)
    a, b = fit(x, y, SMALL), fit(x, y, SMALL)
    assert np.array_equal(a.margin(x), b.margin(x))
    back = Boost.from_dict(json.loads(json.dumps(a.to_dict())))
    assert np.array_equal(back.margin(x), a.margin(x))


def test_a_split_sends_values_at_the_threshold_left() -> None:
    x = np.array([[0.0], [1.0]] * 30)
    y = np.array([0.0, 1.0] * 30)
    model = fit(x, y, BoostSettings(trees=5, max_leaves=2, min_leaf=1, learning_rate=1.0))
    t = float(model.threshold[model.roots[0]])
    assert 0.0 < t < 1.0
    low, high = model.probability(np.array([[t], [np.nextafter(t, 2.0)]]))
    assert low < 0.5 < high


def test_boosting_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="labels"):
        fit(np.zeros((4, 2)), np.array([0, 1, 2, 1]))
    with pytest.raises(ValueError, match="finite"):
        fit(np.array([[np.nan], [1.0]]), np.array([0, 1]))
    with pytest.raises(ValueError, match="non-empty"):
        fit(np.zeros((0, 2)), np.zeros(0))
    model = fit(*_xor(100), SMALL)
    with pytest.raises(ValueError, match="3 features"):
        model.margin(np.zeros((2, 4)))


def test_malformed_trees_are_refused() -> None:
    d = fit(*_xor(100), SMALL).to_dict()
    inner = next(i for i, f in enumerate(d["feature"]) if f >= 0)
    cyclic = {**d, "left": [i if i == inner else v for i, v in enumerate(d["left"])]}
    with pytest.raises(ValueError, match="malformed"):
        Boost.from_dict(cyclic)
    with pytest.raises(ValueError, match="unequal"):
        Boost.from_dict({**d, "value": d["value"][:-1]})
    with pytest.raises(ValueError, match="malformed"):
        Boost.from_dict({**d, "feature": [5 if f >= 0 else f for f in d["feature"]]})


# -- features --------------------------------------------------------------------------------------
def ev(mid: str, sim: float, contra: float | None = 0.1, text: str = "", **kw: object) -> Evidence:
    return Evidence(mid, text or f"memory {mid}", sim, contra, **kw)  # type: ignore[arg-type]


def test_the_closest_candidates_at_or_above_the_floor_are_judged() -> None:
    evs = [ev("a", 0.50), ev("b", 0.95), ev("c", 0.70), ev("d", 0.65), ev("e", 0.61)]
    assert [e.memory_id for e in judged(evs, 0.60)] == ["b", "c", "d"][:JUDGED]
    assert [e.memory_id for e in judged(evs, 0.68)] == ["b", "c"]
    assert judged([ev("a", 0.3)], 0.45) == []


def test_feature_rows_follow_the_named_columns() -> None:
    fact = "Dana's flat is in Leith."
    evs = [
        ev("m1", 0.92, 0.02, "Dana lives in a flat in Leith.", subject="shared", attribute=0.8),
        ev("m2", 0.70, 0.99, "Dana works in Glasgow."),
        ev("m3", 0.40, None, "Dana likes tea."),
    ]
    chosen, rows = features(evs, fact, 0.45)
    assert [e.memory_id for e in chosen] == ["m1", "m2"]
    assert rows.shape == (2, len(FEATURES))
    col = {name: rows[:, i] for i, name in enumerate(FEATURES)}
    assert col["rank"].tolist() == [0.0, 1.0]
    assert col["below_top"][0] == 0.0 and col["below_top"][1] == pytest.approx(-0.22)
    assert col["above_next"][1] == pytest.approx(0.30)
    assert col["contradiction_logit"][0] < 0 < col["contradiction_logit"][1]
    assert col["subject_shared"].tolist() == [1.0, 0.0]
    assert col["attribute"][0] == pytest.approx(0.8) and col["attribute_known"][1] == 0.0
    # "Dana's flat is in Leith" is worded by "Dana lives in a flat in Leith", not by the job
    assert col["fact_words_in_memory"][0] > col["fact_words_in_memory"][1]
    assert np.isfinite(rows).all()


def test_structure_columns_tell_where_two_texts_differ() -> None:
    fact = "The kitchen thermostat is set to 21 degrees."
    evs = [
        ev("same", 0.99, None, "The kitchen thermostat is set to 21 degrees."),
        ev("other", 0.90, None, "The hallway thermostat is set to 20 degrees."),
        ev("plain", 0.85, None, "The thermostat is set to 21 degrees."),
    ]
    chosen, rows = features(evs, fact, 0.45)
    assert [e.memory_id for e in chosen] == ["same", "other", "plain"]
    col = {name: rows[:, i] for i, name in enumerate(FEATURES)}
    # the same text: nothing differs, and the first difference is "at the end"
    assert col["diff_chunks"][0] == 0.0 and col["diff_ratio"][0] == 1.0
    assert col["first_diff_memory"][0] == 1.0 and col["first_diff_fact"][0] == 1.0
    assert col["front_overlap"][0] == 1.0 and col["said_overlap"][0] == 1.0
    # another thermostat: which one (the qualifier) and the value differ, both sides split
    assert col["both_split"].tolist() == [1.0, 1.0, 1.0]
    assert col["qualifiers_differ"].tolist() == [0.0, 1.0, 0.0]
    assert col["qualifier_one_sided"].tolist() == [0.0, 0.0, 1.0]
    assert col["said_values_differ"].tolist() == [0.0, 1.0, 0.0]
    assert col["same_verb"].tolist() == [1.0, 1.0, 1.0]
    assert col["front_overlap"][1] < 1.0 and col["diff_chunks"][1] == 2.0
    # the difference starts at the second word ("kitchen" / "hallway")
    assert col["first_diff_memory"][1] == pytest.approx(1 / 8)
    assert 0.0 < col["diff_ratio"][1] < 1.0


def test_disjoint_owners_and_an_unsplit_text_are_columns_of_their_own() -> None:
    fact = "Grandma's appointment is at 4pm."
    evs = [
        ev("m1", 0.95, None, "Grandad's appointment is at 3pm."),
        ev("m2", 0.80, None, "Tuesdays."),
    ]
    _, rows = features(evs, fact, 0.45)
    col = {name: rows[:, i] for i, name in enumerate(FEATURES)}
    assert col["owners_disjoint"][0] == 1.0
    assert col["said_values_differ"][0] == 1.0
    # a text that does not split (no verb, no note) reads -1, not "no overlap"
    assert col["both_split"].tolist() == [1.0, 0.0]
    assert col["front_overlap"][1] == -1.0 and col["said_overlap"][1] == -1.0
    assert col["same_verb"][1] == 0.0 and col["said_values_differ"][1] == 0.0


def test_an_unscored_candidate_reads_as_unknown_not_as_compatible() -> None:
    _, rows = features([ev("m1", 0.9, None, "Dana likes tea.")], "Dana likes tea.", 0.45)
    col = dict(zip(FEATURES, rows[0], strict=True))
    assert col["contradiction_known"] == 0.0 and col["contradiction_logit"] == 0.0


# -- what the judge may change ---------------------------------------------------------------------
def _verdict(evs: list[Evidence], policy=STRICT):  # type: ignore[no-untyped-def]
    return apply_rule(evs, policy)


def test_a_fact_the_rule_adds_is_skipped_when_the_judge_calls_it_a_duplicate() -> None:
    evs = [ev("m1", 0.82, 0.05), ev("m2", 0.70, 0.02)]
    v = _verdict(evs)
    assert v.action == "add"
    out = amended(v, {"m1": 0.40, "m2": 0.91}, STRICT)
    assert (out.action, out.target_id, out.rule) == ("skip", "m2", "judged_duplicate")
    cands = {c.memory_id: c for c in out.candidates}
    assert cands["m2"].reason == "judged_duplicate:0.91" and cands["m2"].duplicate == 0.91
    assert cands["m1"].duplicate == 0.40 and cands["m1"].reason == v.candidates[0].reason
    # under the bar nothing changes but the reported probabilities
    kept = amended(v, {"m1": 0.40, "m2": 0.79}, STRICT)
    assert (kept.action, kept.target_id, kept.rule) == ("add", None, v.rule)


def test_duplicate_probabilities_never_touch_a_replace_or_a_review() -> None:
    evs = [ev("m1", 0.80, 0.99, subject="shared", attribute=0.9)]
    replace_v = _verdict(evs)
    assert replace_v.action == "replace"
    assert amended(replace_v, {"m1": 0.99}, STRICT) is replace_v
    review_v = _verdict(evs, REVIEW)
    assert review_v.action == "review"
    assert amended(review_v, {"m1": 0.99}, REVIEW) is review_v
    # nor do update probabilities touch a review: the judge only holds a replacement back
    assert amended(review_v, {}, replace(REVIEW, judge_veto=0.5), {"m1": 0.01}) is review_v


def _conflict() -> list[Evidence]:
    return [
        ev("m1", 0.80, 0.99, subject="shared", attribute=0.9),
        ev("m2", 0.70, 0.02),
    ]


def test_a_replacement_the_judge_doubts_is_held_back() -> None:
    strict = replace(STRICT, judge_veto=0.4)
    v = _verdict(_conflict(), strict)
    assert (v.action, v.target_id) == ("replace", "m1")
    out = amended(v, {}, strict, {"m1": 0.25, "m2": 0.9})
    # strict adds the fact beside the memory: a missed update, never an overwrite
    assert (out.action, out.target_id, out.rule) == ("add", None, "judged_not_update")
    cands = {c.memory_id: c for c in out.candidates}
    assert cands["m1"].reason == "judged_not_update:0.25" and not cands["m1"].passed
    assert cands["m1"].update == 0.25
    # at or above the bar the rule's replacement stands, its target's probability reported
    kept = amended(v, {}, strict, {"m1": 0.4})
    assert (kept.action, kept.target_id, kept.rule) == ("replace", "m1", v.rule)
    assert {c.memory_id: c.update for c in kept.candidates} == {"m1": 0.4, "m2": None}
    # a target the judge did not read, a veto of 0, the judge off: the rule's verdict
    assert amended(v, {}, strict, {"m2": 0.01}) is v
    assert amended(v, {}, replace(strict, judge_veto=0.0), {"m1": 0.01}) is v
    assert amended(v, {}, replace(strict, judge=False), {"m1": 0.01}) is v


def test_a_rule_skip_and_a_review_are_left_as_the_rule_made_them() -> None:
    """The judge's keep and dequeue parts are retired (issue 31): a rule skip is never
    overturned, and a queued conflict is never stored as new, whatever the probabilities."""
    skip = _verdict([ev("m1", 0.97, 0.01)])
    assert (skip.action, skip.rule) == ("skip", "duplicate")
    assert amended(skip, {"m1": 0.0}, STRICT, {"m1": 0.0}) is skip
    review_v = _verdict(_conflict(), REVIEW)
    assert review_v.action == "review"
    assert amended(review_v, {"m1": 0.0}, replace(REVIEW, judge_veto=0.9), {"m1": 0.0}) is review_v
    # nor does a review policy queue what its rule adds
    add = _verdict([ev("m1", 0.82, 0.05)], REVIEW)
    assert add.action == "add"
    assert amended(add, {"m1": 0.1}, REVIEW, {"m1": 0.99}).action == "add"


def test_review_uncertain_queues_the_replacement_the_judge_holds_back() -> None:
    pol = replace(REVIEW_UNCERTAIN, judge_veto=0.4)
    v = _verdict(_conflict(), pol)
    assert (v.action, v.target_id) == ("replace", "m1")
    out = amended(v, {}, pol, {"m1": 0.1})
    assert (out.action, out.target_id, out.rule) == ("review", "m1", "judged_not_update")


def test_the_judge_is_off_when_the_policy_says_so() -> None:
    v = _verdict([ev("m1", 0.82, 0.05)])
    off = replace(STRICT, judge=False)
    assert amended(v, {"m1": 0.99}, off) is v


def _tiny_judge(bar: float = 0.5, veto: float = 0.0) -> Judge:
    # column 0 is the similarity: the trees call a candidate a duplicate from 0.85 up, and an
    # update (its replacement) from 0.78 up
    x = np.array([[s] + [0.0] * (len(FEATURES) - 1) for s in np.linspace(0.5, 1.0, 60)])
    small = BoostSettings(trees=20, max_leaves=2, min_leaf=3, learning_rate=0.5)
    trees = fit(x, (x[:, 0] >= 0.85).astype(float), small)
    updates = fit(x, (x[:, 0] >= 0.78).astype(float), small) if veto else None
    models = {"embedder": {"name": "e", "variant": "v", "model_sha256": "1"}, "nli": {}}
    return Judge(trees, bar, models, {"note": "synthetic"}, updates=updates, veto_bar=veto)


def test_a_fitted_judge_holds_back_a_replacement_through_its_update_trees() -> None:
    judge = _tiny_judge(veto=0.5)
    pol = judge.policy(STRICT)
    assert pol.judge_veto == 0.5
    near = ev(
        "m1",
        0.82,
        0.99,
        "Dana lives in Leith.",
        subject="shared",
        attribute=0.9,
    )
    far = ev(
        "m1",
        0.66,
        0.99,
        "Dana lives in Leith.",
        subject="shared",
        attribute=0.9,
    )
    for e, action in ((near, "replace"), (far, "add")):
        v = apply_rule([e], pol)
        assert v.action == "replace"
        out = judge.amend(v, [e], "Dana lives in Portobello now.", pol)
        assert out.action == action
        assert out.candidates[0].update is not None
    with pytest.raises(ValueError, match="update trees"):
        replace(_tiny_judge(), veto_bar=0.3)


def test_a_fitted_judge_amends_through_its_own_features() -> None:
    judge = _tiny_judge()
    near = ev("m1", 0.88, 0.1, "Dana lives in Leith.")
    far = ev("m2", 0.75, 0.1, "Dana works in Glasgow.")
    v = apply_rule([near, far], STRICT)
    assert v.action == "add"
    pol = judge.policy(STRICT)
    assert (pol.judge_duplicate, pol.judge_veto) == (0.5, 0.0)
    out = judge.amend(v, [near, far], "Dana's home is in Leith.", pol)
    assert (out.action, out.target_id) == ("skip", "m1")
    assert {c.memory_id: c.duplicate is not None for c in out.candidates} == {
        "m1": True,
        "m2": True,
    }


# -- the judge file --------------------------------------------------------------------------------
def _runtime(name: str, variant: str, sha: str) -> SimpleNamespace:
    manifest = SimpleNamespace(
        name=name, variant=variant, model_file="model.onnx", files={"model.onnx": {"sha256": sha}}
    )
    return SimpleNamespace(manifest=manifest)


def test_the_judge_file_round_trips_sealed_and_is_found_for_its_models(tmp_path: Path) -> None:
    emb, nli = _runtime("minilm", "fp32", "aa"), _runtime("aegis-nli", "int8", "bb")
    models = {
        "embedder": {"name": "minilm", "variant": "fp32", "model_sha256": "aa"},
        "nli": {"name": "aegis-nli", "variant": "int8", "model_sha256": "bb"},
    }
    judge = replace(_tiny_judge(0.7), models=models)
    path = judge_path(tmp_path, models["embedder"], models["nli"])
    assert path == tmp_path / "judges" / "minilm-fp32+aegis-nli-int8.json"
    save_judge(path, judge)
    back = find_judge(tmp_path, emb, nli)
    assert back is not None and back.duplicate_bar == 0.7 and back.models == models
    x = np.random.default_rng(0).uniform(size=(5, len(FEATURES)))
    assert np.array_equal(back.trees.probability(x), judge.trees.probability(x))
    assert back.updates is None and back.veto_bar == 0.0
    # with update trees and a veto bar
    written = replace(_tiny_judge(0.7, veto=0.3), models=models)
    save_judge(path, written)
    vetoing = find_judge(tmp_path, emb, nli)
    assert vetoing is not None and vetoing.veto_bar == 0.3 and vetoing.updates is not None
    assert vetoing.policy(STRICT).judge_veto == 0.3
    assert written.updates is not None
    assert np.array_equal(vetoing.updates.probability(x), written.updates.probability(x))
    # another graph of the same names: the judge does not apply to it
    assert find_judge(tmp_path, emb, _runtime("aegis-nli", "int8", "cc")) is None
    # no judge for other models at all
    assert find_judge(tmp_path, emb, _runtime("nli-deberta-v3-small", "int8", "dd")) is None


def test_a_judge_fitted_on_a_cpu_of_other_instruction_sets_is_served_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from engine.runtime.cpu import cpu

    emb, nli = _runtime("minilm", "fp32", "aa"), _runtime("aegis-nli", "int8", "bb")
    models = {
        "embedder": {"name": "minilm", "variant": "fp32", "model_sha256": "aa"},
        "nli": {"name": "aegis-nli", "variant": "int8", "model_sha256": "bb"},
    }
    path = judge_path(tmp_path, models["embedder"], models["nli"])
    here = {"cpu": cpu()[0], "isa": list(cpu()[1])}
    other = {"cpu": "Some Other CPU", "isa": ["sse4_2", "avx", "avx2"]}
    if other["isa"] == here["isa"]:
        other["isa"] = ["neon"]
    for provenance, warned in ((here, False), (other, True), ({}, False)):
        save_judge(path, replace(_tiny_judge(), models=models, provenance=provenance))
        caplog.clear()
        with caplog.at_level("WARNING", logger="memgate.judge"):
            assert find_judge(tmp_path, emb, nli) is not None  # served either way
        assert ("other instruction sets" in caplog.text) is warned
        if warned:
            assert "Some Other CPU" in caplog.text and "--force" in caplog.text


def test_the_cpu_is_read_from_cpuinfo(tmp_path: Path) -> None:
    import platform

    from engine.runtime.cpu import ISA, cpu

    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu avx2 sse4_2 amx_int8 x\n"
        "processor\t: 1\nmodel name\t: Test CPU 9000\nflags\t\t: fpu\n"
    )
    model, isa = cpu(info)
    assert isa == ("sse4_2", "avx2", "amx_int8")  # ISA's order, the first CPU's flags
    assert list(isa) == [f for f in ISA if f in isa]
    if platform.processor() in ("", platform.machine()):  # Linux: the name comes from cpuinfo
        assert model == "Test CPU 9000"
    assert cpu(tmp_path / "absent")[1] == ()


def test_an_edited_or_foreign_judge_file_is_refused(tmp_path: Path) -> None:
    path = save_judge(tmp_path / "j.json", _tiny_judge())
    body = json.loads(path.read_text())
    body["duplicate_bar"] = 0.1
    path.write_text(json.dumps(body))
    with pytest.raises(ModelError, match="seal"):
        load_judge(path)
    path.write_text("{not json")
    with pytest.raises(ModelError, match="unreadable"):
        load_judge(path)
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ModelError, match="not a memgate-judge"):
        load_judge(path)

    # an older engine's judge (format 1, no update trees) is refused by load, and skipped with
    # a warning by the gate (an upgrade leaves one in the cache until `models judge` runs)
    older = {k: v for k, v in body.items() if k not in ("update_trees", "veto_bar")}
    older["format"] = "memgate-judge/1"
    older["judge_sha256"] = manifest_digest({k: v for k, v in older.items() if k != "judge_sha256"})
    models = {
        "embedder": {"name": "minilm", "variant": "fp32", "model_sha256": "aa"},
        "nli": {"name": "aegis-nli", "variant": "int8", "model_sha256": "bb"},
    }
    old_path = judge_path(tmp_path, models["embedder"], models["nli"])
    old_path.parent.mkdir(parents=True, exist_ok=True)
    old_path.write_text(json.dumps({**older, "models": models}))
    with pytest.raises(OlderJudge, match=rf"older engine \(memgate-judge/1, not {FORMAT}\)"):
        load_judge(old_path)
    # format 2 (32 columns, before the structure columns) is older too, not a stopped engine
    two = {**body, "format": "memgate-judge/2", "features": list(FEATURES[:32]), "models": models}
    two["judge_sha256"] = manifest_digest({k: v for k, v in two.items() if k != "judge_sha256"})
    old_path.write_text(json.dumps(two))
    with pytest.raises(OlderJudge, match="memgate-judge/2"):
        load_judge(old_path)
    emb0, nli0 = _runtime("minilm", "fp32", "aa"), _runtime("aegis-nli", "int8", "bb")
    assert find_judge(tmp_path, emb0, nli0) is None
    old_path.write_text(json.dumps({**older, "models": models}))
    assert issubclass(OlderJudge, ModelError)  # `models verify` still fails it
    emb, nli = _runtime("minilm", "fp32", "aa"), _runtime("aegis-nli", "int8", "bb")
    assert find_judge(tmp_path, emb, nli) is None
    # a later format than this engine's is not "older": refused like any foreign file
    newer = {**older, "format": "memgate-judge/9", "models": models}
    newer["judge_sha256"] = manifest_digest({k: v for k, v in newer.items() if k != "judge_sha256"})
    old_path.write_text(json.dumps(newer))
    with pytest.raises(ModelError, match=f"not a {FORMAT}"):
        find_judge(tmp_path, emb, nli)
    old_path.write_text("{damaged")
    with pytest.raises(ModelError, match="unreadable"):
        find_judge(tmp_path, emb, nli)

    other = {**body, "duplicate_bar": 0.8, "features": ["similarity"]}
    other["judge_sha256"] = manifest_digest({k: v for k, v in other.items() if k != "judge_sha256"})
    path.write_text(json.dumps(other))
    with pytest.raises(ModelError, match="other features"):
        load_judge(path)


def test_the_level_by_level_walk_is_the_walk_down_each_tree() -> None:
    x, y = _xor(400)
    model = fit(x, y, BoostSettings(trees=25, max_leaves=9, min_leaf=3))
    probe = np.random.default_rng(3).uniform(-1.5, 1.5, size=(60, 3))
    expected = np.full(len(probe), model.base)
    for r, row in enumerate(probe):
        for root in model.roots:
            n = int(root)
            while model.feature[n] >= 0:
                go_left = row[model.feature[n]] <= model.threshold[n]
                n = int(model.left[n] if go_left else model.right[n])
            expected[r] += model.value[n]
    assert model.depth >= 2
    assert np.allclose(model.margin(probe), expected, atol=1e-12)


def test_bars_chosen_when_fitting_set_the_fields_the_served_judge_sets() -> None:
    from engine.tuning.fit_judge import BAR_GRID, with_bars

    judge = _tiny_judge(bar=0.65, veto=0.3)
    bars = {"duplicate_bar": judge.duplicate_bar, "veto_bar": judge.veto_bar}
    assert set(bars) == set(BAR_GRID)
    for base in (STRICT, REVIEW):
        assert with_bars(base, bars) == judge.policy(base)
    # only the bars given change
    partial = with_bars(STRICT, {"veto_bar": 0.3})
    assert partial == replace(STRICT, judge_veto=0.3)
    with pytest.raises(KeyError):
        with_bars(STRICT, {"veto": 0.3})


def test_a_plain_fit_keeps_a_judge_fitted_on_the_user_s_own_sets(tmp_path: Path) -> None:
    from engine.runtime.cpu import cpu
    from engine.tuning.fit_judge import BAR_GRID, OVERWRITE_COST, _up_to_date, gate_code

    settings = BoostSettings()
    models = {"embedder": {"name": "e"}, "nli": {"name": "n"}}
    ours = [{"name": "heldout", "sha256": "aa", "cases": 120}]
    theirs = [{"name": "mine", "sha256": "bb", "cases": 300}]

    def saved(
        sets: list[dict[str, object]],
        given: bool,
        isa: list[str] | None = None,
        code: str | None = None,
    ) -> Path:
        provenance = {
            "sets": sets,
            "sets_given": given,
            "gate_code": gate_code() if code is None else code,
            "isa": list(cpu()[1]) if isa is None else isa,
            "settings": settings.__dict__,
            "bar_grid": {k: list(v) for k, v in BAR_GRID.items()},
            "overwrite_cost": OVERWRITE_COST,
        }
        judge = replace(_tiny_judge(), models=models, provenance=provenance)
        return save_judge(tmp_path / "judge.json", judge)

    path = saved(ours, given=False)
    assert _up_to_date(path, models, ours, settings, given=False)
    assert not _up_to_date(path, models, ours + theirs, settings, given=False)  # a new set
    assert not _up_to_date(path, {**models, "nli": {"name": "m"}}, ours, settings, given=False)
    assert not _up_to_date(path, models, ours, BoostSettings(trees=10), given=False)
    # fitted by other gate code (its features were measured otherwise): refitted
    path = saved(ours, given=False, code="0" * 64)
    assert not _up_to_date(path, models, ours, settings, given=False)
    assert not _up_to_date(path, models, ours, settings, given=True)
    # ... unless it was fitted on a user's own sets: kept by a plain fit, which says so
    path = saved(theirs, given=True, code="0" * 64)
    assert "by other gate code" in _up_to_date(path, models, ours, settings, given=False)
    assert not _up_to_date(path, models, theirs, settings, given=True)
    # fitted with another CPU's kernels: refitted here, unless it was fitted on a user's sets
    elsewhere = ["neon"] if cpu()[1] != ("neon",) else ["avx2"]
    path = saved(ours, given=False, isa=elsewhere)
    assert not _up_to_date(path, models, ours, settings, given=False)
    path = saved(theirs, given=True, isa=elsewhere)
    assert "your own sets (mine)" in _up_to_date(path, models, ours, settings, given=False)
    path = saved(theirs, given=True)
    assert "your own sets (mine)" in _up_to_date(path, models, ours, settings, given=False)
    assert _up_to_date(path, models, theirs, settings, given=True)
    assert not _up_to_date(path, models, ours, settings, given=True)
    assert not _up_to_date(tmp_path / "none.json", models, ours, settings, given=False)


def test_build_info_names_the_served_judge_by_its_seal(tmp_path: Path) -> None:
    from engine.server.metrics import Metrics

    judge = load_judge(save_judge(tmp_path / "j.json", _tiny_judge()))
    assert len(judge.seal) == 64
    for served, label in ((judge, judge.seal[:16]), (None, "none")):
        metrics = Metrics()
        metrics.describe(SimpleNamespace(embedder=None, nli=None, judge=served))
        (sample,) = [
            s
            for m in metrics.registry.collect()
            for s in m.samples
            if s.name == "memgate_build_info"
        ]
        assert sample.labels["judge"] == label and sample.value == 1.0


def test_models_list_and_verify_cover_the_judge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.cli import models as cli

    path = save_judge(tmp_path / "judges" / "e-v+n-w.json", _tiny_judge())
    assert cli.main(["models", "list", "--cache-dir", str(tmp_path)]) == 0
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[:4] == ["judge", "e-v+n-w", "judge", "fitted"] and row[-1] == "yes"
    assert cli.main(["models", "verify", "--cache-dir", str(tmp_path)]) == 0
    assert "1/1 artefacts verify" in capsys.readouterr().out
    body = json.loads(path.read_text())
    path.write_text(json.dumps({**body, "veto_bar": 0.9}))
    assert cli.main(["models", "verify", "--cache-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH judges/e-v+n-w.json" in out and "0/1 artefacts verify" in out
