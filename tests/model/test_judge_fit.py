"""The judge on the real models: captured evidence replays the gate's own decisions,
``memgate models judge`` fits and seals a judge, and the engine serves it (``eval`` with it
and without it)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.cli import main as cli_main
from engine.gate.gate import policy_for
from engine.gate.judge.store import load_judge
from engine.tuning.evaluate import decide_cases, load_cases, stage
from engine.tuning.fit_judge import capture, replay

pytestmark = pytest.mark.model

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"


def _subset(tmp_path: Path, name: str, every: int, count: int) -> Path:
    lines = (DATA / f"{name}.jsonl").read_text("utf-8").splitlines()
    path = tmp_path / f"{name}-part.jsonl"
    path.write_text("\n".join(lines[::every][:count]) + "\n", encoding="utf-8")
    return path


def test_captured_evidence_replays_the_gate_s_own_strict_decisions(make_gate, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The fit chooses its bars by replaying the rule over evidence captured under review's
    floor; that is only sound if the replay is what strict itself decides."""
    cases = load_cases(_subset(tmp_path, "heldout3", 5, 40))
    gate = make_gate()
    items = capture(gate, [("heldout3", cases)])
    assert len(items) == len(cases) and all(it.group == "heldout3" for it in items)
    strict = policy_for("strict", gate.nli, gate.embedder)
    replayed = replay(items, strict, None)
    direct = [p for p, _ in decide_cases(gate, stage(gate, cases, prefix="direct"), strict)]
    assert replayed == direct


def test_models_judge_fits_a_sealed_judge_that_eval_serves(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a cache of our own (the shared one's models, linked) so the fitted judge lands here only
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(cache_dir / "models", target_is_directory=True)
    sets = [_subset(tmp_path, name, 4, 30) for name in ("heldout2", "heldout4", "heldout5")]
    argv = ["--cache-dir", str(cache), "models", "judge", "--cases", *map(str, sets)]
    assert cli_main([*argv, "--trees", "40", "--json", "--quiet", "--nli", "aegis-nli"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    path = Path(record["path"])
    assert path.parent == cache / "judges" and path.name.endswith("+aegis-nli-int8.json")
    judge = load_judge(path)
    assert [s["name"] for s in judge.provenance["sets"]] == [p.stem for p in sets]
    cv = judge.provenance["cross_validation"]
    assert cv["folds"] == "leave one set out"
    # the bars never lose more information than the rule alone did on the same cases
    alone, judged = cv["strict_rule_alone"], cv["strict_with_judge"]
    assert judged["lost_information"] <= alone["lost_information"]
    # it never replaces where the rule did not; it may hold a replacement back
    assert judged["wrongful_overwrites"] <= alone["wrongful_overwrites"]
    assert judge.updates is not None and 0.0 <= judge.veto_bar <= 0.7
    # review never replaces, and the judge neither queues nor dequeues (issue 31): the
    # conflicts its rule queues are the ones queued with the judge
    assert cv["review_with_judge"]["wrongful_overwrites"] == 0
    queued = [
        cv[k]["updates_queued_right_target"] for k in ("review_rule_alone", "review_with_judge")
    ]
    assert queued[1] == queued[0]
    assert judge.models["nli"]["name"] == "aegis-nli"

    cases = _subset(tmp_path, "heldout6", 3, 30)
    out_on, out_off = tmp_path / "on.jsonl", tmp_path / "off.jsonl"
    base = ["--cache-dir", str(cache), "eval", "--cases", str(cases), "--nli", "aegis-nli"]
    assert cli_main([*base, "--out", str(out_on), "--explain"]) == 0
    off = ["--out", str(out_off), "--explain", "--overrides", '{"judge": false}']
    assert cli_main([*base, *off]) == 0
    capsys.readouterr()
    on = [json.loads(line) for line in out_on.read_text("utf-8").splitlines()]
    without = [json.loads(line) for line in out_off.read_text("utf-8").splitlines()]
    assert not any(r["rule"].startswith("judged_") for r in without)
    for a, b in zip(on, without, strict=True):
        if a["rule"] == "judged_duplicate":
            assert b["action"] == "add" and a["action"] == "skip" and a["target"]
        elif a["rule"] == "judged_not_update":  # strict adds what the rule would replace
            assert b["action"] == "replace" and a["action"] == "add"
        else:  # the judge changed nothing else: replaces, reviews and the rest are the rule's
            assert (a["action"], a["target"], a["rule"]) == (b["action"], b["target"], b["rule"])


def test_a_judge_for_other_graphs_is_not_served(tmp_path: Path, cache_dir: Path) -> None:
    import numpy as np

    from engine.app import EngineSettings, open_engine
    from engine.gate.judge import Judge
    from engine.gate.judge.features import FEATURES
    from engine.gate.judge.store import judge_path, model_identity, save_judge
    from engine.runtime.loader import ModelChoice
    from engine.tuning.boost import BoostSettings, fit

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(cache_dir / "models", target_is_directory=True)
    settings = EngineSettings(
        data_dir=tmp_path / "data", cache_dir=cache, models=ModelChoice(nli="aegis-nli")
    )
    x = np.random.default_rng(0).uniform(size=(40, len(FEATURES)))
    trees = fit(x, (x[:, 0] > 0.5).astype(float), BoostSettings(trees=3, min_leaf=2))
    with open_engine(settings) as eng:
        assert eng.gate.judge is None  # none fitted in this cache yet
        emb, nli = model_identity(eng.gate.embedder), model_identity(eng.gate.nli)
    stale = {"embedder": emb, "nli": {**nli, "model_sha256": "0" * 64}}
    save_judge(judge_path(cache, emb, nli), Judge(trees, 0.8, stale))
    with open_engine(settings) as eng:
        assert eng.gate.judge is None  # fitted with another graph of that name: not used
    save_judge(judge_path(cache, emb, nli), Judge(trees, 0.8, {"embedder": emb, "nli": nli}))
    with open_engine(settings) as eng:
        assert eng.gate.judge is not None
        strict = eng.gate.policy("strict")
        assert (strict.judge_duplicate, strict.judge_veto) == (0.8, 0.0)
        assert replace(strict, judge=False).judge is False
    with open_engine(replace(settings, judge=False)) as eng:
        assert eng.gate.judge is None
