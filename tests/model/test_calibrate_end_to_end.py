"""``memgate calibrate`` end to end on real models, and its policy file taken by ``triage``,
``backfill``, ``eval`` and a real ``memgate serve`` process (127.0.0.1, a free port)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from engine.cli import main as cli_main
from engine.tuning.policy_file import FORMAT, load_policy_file

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
DENVER = "The customer's office is in Denver."
CHICAGO = "The customer's office is in Chicago."
FLOOR_FILE = {"format": FORMAT, "base": "strict", "overrides": {"floor": 0.99}}
"""No candidate reaches 0.99: every decision under this file is an add below the floor, where
strict's own floor (0.60) replaces Denver with Chicago."""


def _dev() -> Path:
    """A labelled set of the repository (the test reads nothing outside it)."""
    return ROOT / "benchmarks" / "data" / "heldout.jsonl"


def _floor_file(tmp_path: Path) -> Path:
    path = tmp_path / "floor.json"
    path.write_text(json.dumps(FLOOR_FILE), encoding="utf-8")
    return path


def test_calibrate_end_to_end_and_eval_reproduces_the_choice(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _dev().read_text("utf-8").splitlines()
    # 20 cases across categories: every 6th line of the set
    subset = tmp_path / "cases.jsonl"
    subset.write_text("\n".join(lines[::6][:20]) + "\n", encoding="utf-8")
    out = tmp_path / "cal" / "policy.json"
    argv = ["--cache-dir", str(cache_dir), "calibrate", "--cases", str(subset), "--out", str(out)]
    argv += ["--grid", "floor=0.5,0.6,0.7", "--grid", "contradiction=0.9,0.98"]
    argv += ["--grid", "dated_contradiction=0.8", "--folds", "3", "--max-wrongful", "1"]
    argv += ["--only-grid"]  # the served judge's bars too otherwise (the next test)
    code = cli_main(argv)
    text = capsys.readouterr().out
    sweep = json.loads(out.with_suffix(".sweep.json").read_text("utf-8"))
    assert len(sweep["settings"]) == 6
    assert sweep["model_work"]["pairs_scored_after_first_setting"] == 0
    assert sweep["model_work"]["texts_embedded_after_first_setting"] == 0
    assert "safe zone:" in text and "3-fold cross-validation" in text
    if code == 1:  # no setting within the bound: said so, and no file
        assert not out.exists()
        return
    assert code == 0 and out.with_suffix(".png").stat().st_size > 5000
    pf = load_policy_file(out)
    assert pf.base == "strict" and set(pf.overrides) == {
        "floor",
        "contradiction",
        "dated_contradiction",
    }
    prov = pf.provenance
    assert prov["cases"]["count"] == 20 and len(prov["cases"]["sha256"]) == 64
    assert prov["models"]["embedder"]["name"] == "minilm"
    assert len(prov["models"]["nli"]["manifest_sha256"]) == 64
    chosen = prov["metrics"]
    assert chosen["wrongful_overwrites"] <= 1
    safe = [s for s in sweep["settings"] if s["metrics"]["wrongful_overwrites"] <= 1]
    assert chosen["update_recall"] == max(s["metrics"]["update_recall"] for s in safe)
    assert len(prov["cross_validation"]["estimate"]) > 5
    # eval with the written file measures exactly what the sweep said about the choice
    assert (
        cli_main(
            ["--cache-dir", str(cache_dir), "eval", "--cases", str(subset), "--json"]
            + ["--policy-file", str(out)]
        )
        == 0
    )
    scored = json.loads(capsys.readouterr().out)
    for name in ("wrongful_overwrites", "update_recall", "accuracy", "review_rate"):
        assert scored[name] == chosen[name], name
    reach = scored["update_reach"]  # what the models allowed, from the same decisions
    labelled = [json.loads(line) for line in subset.read_text("utf-8").splitlines()]
    assert reach["updates"] == sum(c["expected"]["action"] == "replace" for c in labelled)
    steps = ["target_recalled", "target_above_floor", "target_scored", "target_contradicted"]
    assert [reach[s] for s in steps] == sorted((reach[s] for s in steps), reverse=True)
    assert reach["plain_rule"] <= reach["target_contradicted"] <= reach["target_recalled"]
    assert reach["bars"]["floor"] == pf.overrides["floor"]


def test_triage_takes_the_policy_file(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = tmp_path / "facts.jsonl"
    base = ["--cache-dir", str(cache_dir), "triage", "--json", "--data-dir", str(tmp_path / "d")]
    facts.write_text(json.dumps({"namespace": "t/a", "text": DENVER}) + "\n", encoding="utf-8")
    assert cli_main([*base, str(facts), "--apply"]) == 0
    capsys.readouterr()
    facts.write_text(json.dumps({"namespace": "t/a", "text": CHICAGO}) + "\n", encoding="utf-8")
    assert cli_main([*base, str(facts), "--policy-file", str(_floor_file(tmp_path))]) == 0
    filed = json.loads(capsys.readouterr().out)
    # (strict's own floor replaces here: the serve test checks it on the same facts)
    assert filed["action"] == "add" and filed["rule"] == "no_candidate_above_floor"


def test_backfill_takes_the_policy_file(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"namespace": "b/a", "text": t}) + "\n" for t in (DENVER, CHICAGO)),
        encoding="utf-8",
    )
    audit = tmp_path / "audit.jsonl"
    argv = ["--cache-dir", str(cache_dir), "backfill", "--input", str(rows)]
    argv += ["--data-dir", str(tmp_path / "d"), "--audit", str(audit), "--progress", "off"]
    argv += ["--policy-file", str(_floor_file(tmp_path))]
    assert cli_main(argv) == 0
    capsys.readouterr()
    records = [json.loads(line) for line in audit.read_text("utf-8").splitlines()]
    assert [r["action"] for r in records] == ["add", "add"]
    assert records[1]["rule"] == "no_candidate_above_floor" and records[1]["policy"] == "strict"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_takes_the_policy_file(tmp_path: Path, cache_dir: Path) -> None:
    from engine.server.codegen import ensure

    ensure()
    from engine.client import MemgateClient
    from engine.errors import MemgateError
    from engine.types import Fact

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEMGATE_HOME": str(cache_dir)}
    cmd = [sys.executable, "-m", "engine", "--cache-dir", str(cache_dir), "serve"]
    cmd += ["--port", str(port), "--data-dir", str(tmp_path / "d"), "--log-format", "text"]
    cmd += ["--policy-file", str(_floor_file(tmp_path)), "--grace", "1"]
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        client = MemgateClient(f"127.0.0.1:{port}", timeout=10)
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text("utf-8", errors="replace")
            try:
                if client.health() == "SERVING":
                    break
            except MemgateError:
                pass
            assert time.monotonic() < deadline, "the server did not start in 90 s"
            time.sleep(0.2)
        with client:
            client.write([Fact("s/a", DENVER)])
            filed = client.triage([Fact("s/a", CHICAGO)], "strict").decisions[0]
            review = client.triage([Fact("s/a", CHICAGO)], "review").decisions[0]
            lowered: Any = client.triage([Fact("s/a", CHICAGO)], "strict", {"floor": 0.6})
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    # strict is the file's: Denver is below its floor; review is the built-in one
    assert filed.action == "add" and filed.rule == "no_candidate_above_floor"
    assert [c.reason for c in filed.candidates] == ["below_floor"]
    assert review.action in ("review", "replace") and review.candidates[0].reason != "below_floor"
    # a request's own overrides still apply on top of the file
    assert lowered.decisions[0].action == "replace"


def _cache_with_a_judge(tmp_path: Path, cache_dir: Path, cases: Path) -> tuple[Path, float]:
    """A private cache: the real models and a judge for MiniLM + aegis-nli (trees on random
    features, so its probabilities are arbitrary but fixed), recorded as fitted on ``cases``.
    Returns the cache and the judge's veto bar."""
    import numpy as np

    from engine.app import EngineSettings, open_engine
    from engine.gate.judge import Judge
    from engine.gate.judge.features import FEATURES
    from engine.gate.judge.store import judge_path, model_identity, save_judge
    from engine.runtime.loader import ModelChoice
    from engine.tuning.boost import BoostSettings, fit
    from engine.tuning.calibrate import sha256_of

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(cache_dir / "models", target_is_directory=True)
    settings = EngineSettings(
        data_dir=tmp_path / "data", cache_dir=cache, models=ModelChoice(nli="aegis-nli")
    )
    with open_engine(settings) as eng:
        emb, nli = model_identity(eng.gate.embedder), model_identity(eng.gate.nli)
    x = np.random.default_rng(0).uniform(size=(60, len(FEATURES)))
    small = BoostSettings(trees=3, min_leaf=2)
    judge = Judge(
        fit(x, (x[:, 0] > 0.5).astype(float), small),
        0.8,
        {"embedder": emb, "nli": nli},
        {"sets": [{"name": "mine", "sha256": sha256_of(cases), "cases": 20}]},
        updates=fit(x, (x[:, 1] > 0.5).astype(float), small),
        veto_bar=0.45,
    )
    save_judge(judge_path(cache, emb, nli), judge)
    return cache, judge.veto_bar


def test_calibrate_sweeps_the_served_judges_bars(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = _dev().read_text("utf-8").splitlines()
    subset = tmp_path / "cases.jsonl"
    subset.write_text("\n".join(lines[1::6][:20]) + "\n", encoding="utf-8")
    cache, veto = _cache_with_a_judge(tmp_path, cache_dir, subset)
    fixed = ["--grid", "floor=0.6", "--grid", "contradiction=0.95"]
    fixed += ["--grid", "dated_contradiction=0.8", "--folds", "2", "--no-plot"]
    out = tmp_path / "strict.json"
    argv = ["--cache-dir", str(cache), "calibrate", "--nli", "aegis-nli", "--cases", str(subset)]
    code = cli_main([*argv, "--out", str(out), "--max-wrongful", "20", *fixed])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "fitted on these cases" in captured.err  # its figures here flatter it
    sweep = json.loads(out.with_suffix(".sweep.json").read_text("utf-8"))
    assert sweep["grid"]["judge_veto"] == [0.0, 0.3, veto, 0.6]
    assert sweep["judge"]["fitted_on_these_cases"] is True and len(sweep["judge"]["seal"]) == 64
    assert sweep["judge"]["bars"]["judge_veto"] == veto
    # a higher veto bar only holds replacements back: never more replaced, never more wrongly
    by_veto = sorted(sweep["settings"], key=lambda s: s["setting"]["judge_veto"])
    for lower, higher in zip(by_veto, by_veto[1:], strict=False):
        for name in ("update_recall", "wrongful_overwrites"):
            assert higher["metrics"][name] <= lower["metrics"][name], name
    pf = load_policy_file(out)
    assert pf.overrides["judge_veto"] == sweep["chosen"]["judge_veto"]
    assert pf.provenance["judge"]["fitted_on_these_cases"] is True
    assert pf.provenance["max_needless"] is None
    assert (
        cli_main(
            ["--cache-dir", str(cache), "eval", "--cases", str(subset), "--json"]
            + ["--nli", "aegis-nli", "--policy-file", str(out)]
        )
        == 0
    )
    scored = json.loads(capsys.readouterr().out)
    for name in ("wrongful_overwrites", "update_recall", "accuracy"):
        assert scored[name] == pf.provenance["metrics"][name], name
    # review: no judge bar to sweep (it never replaces; the judge's queue is retired), the
    # thresholds within a bound on needless queueing
    out = tmp_path / "review.json"
    code = cli_main([*argv, "--policy", "review", "--out", str(out), *fixed])
    captured = capsys.readouterr()
    sweep = json.loads(out.with_suffix(".sweep.json").read_text("utf-8"))
    assert not any(name.startswith("judge_") for name in sweep["grid"])
    assert sweep["max_needless"] == 0.10 and "queued needlessly" in captured.out
    if code == 0:
        chosen = load_policy_file(out).provenance["metrics"]
        assert chosen["adds_skips_queued"] <= 0.10 and chosen["wrongful_overwrites"] == 0
    else:  # none within the bound: said so, no file
        assert "--max-needless" in captured.err and not out.exists()
