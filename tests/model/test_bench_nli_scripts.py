"""The issue-16 scripts on the real artefacts, at smoke size: bench_span measures each
narrowed graph against the same graph widened back (same logits), bench_aegis_gate runs the gate
with the served aegis graph and with the one as shipped, bench_parse with the claim parser batched
and one by one, bench_judge with and without the judge, cv_judge's leave-one-set-out fit. Their
speed figures are not asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_aegis_gate  # noqa: E402
import bench_span  # noqa: E402


def _result(out: Path, name: str) -> dict:
    (path,) = out.glob(f"{name}-*.json")
    return json.loads(path.read_text(encoding="utf-8"))


def test_bench_span_widens_every_narrowed_graph_and_scores_it_the_same(
    cache_dir: Path, tmp_path: Path
) -> None:
    argv = ["--smoke", "--cache-dir", str(cache_dir), "--out", str(tmp_path)]
    assert bench_span.main(argv) == 0
    models = _result(tmp_path, "bench_span")["models"]
    assert "aegis-nli/int8" in models
    for label, m in models.items():
        assert m["products_narrowed"] > 0, label
        assert m["max_abs_logit_diff"] <= 1e-5, label
        assert set(m["points"]) == {str(s) for s in bench_span.SIZES}, label


def test_bench_aegis_gate_runs_both_variants_on_the_same_facts(
    cache_dir: Path, tmp_path: Path
) -> None:
    argv = ["--smoke", "--cache-dir", str(cache_dir), "--out", str(tmp_path)]
    assert bench_aegis_gate.main(argv) == 0
    (row,) = _result(tmp_path, "bench_aegis_gate")["rows"]
    assert row["memories"] == 200 and row["facts"] == 10
    assert set(row["facts_per_s"]) == set(bench_aegis_gate.VARIANTS)
    assert all(rate > 0 for rate in row["facts_per_s"].values())
    assert 0 <= row["same_decisions"] <= row["facts"]


def test_bench_parse_runs_both_parser_arms_to_the_same_decisions(
    cache_dir: Path, tmp_path: Path
) -> None:
    import bench_parse

    from engine.gate.claims import nlp

    batched = nlp._Docs.many
    argv = ["--smoke", "--cache-dir", str(cache_dir), "--out", str(tmp_path)]
    assert bench_parse.main(argv) == 0
    assert nlp._Docs.many is batched  # the one-by-one arm is undone
    (row,) = _result(tmp_path, "bench_parse")["rows"]
    assert row["same_actions"] is True and row["facts"] == 20
    assert set(row["ms_per_fact"]) == set(bench_parse.ARMS)
    assert all(v > 0 for v in row["identify_ms_per_fact"].values())


def test_bench_judge_runs_the_gate_with_and_without_the_served_judge(
    cache_dir: Path, tmp_path: Path
) -> None:
    import bench_judge

    argv = ["--smoke", "--cache-dir", str(cache_dir), "--out", str(tmp_path)]
    assert bench_judge.main(argv) == 0
    (row,) = _result(tmp_path, "bench_judge")["rows"]
    assert row["memories"] == 200 and row["facts"] == 20
    assert set(row["ms_per_fact"]) == set(row["actions"]) == set(bench_judge.ARMS)
    assert all(v > 0 for v in row["ms_per_fact"].values()) and row["cost"] > 0
    # under strict the judge may skip an add and hold a replacement back (an add): it never
    # replaces where the rule did not, and never queues itself; a held-back replacement leaves
    # its target standing for the later facts of the batch, which may then find two plausible
    # targets (review): the reviews differ by at most the replacements held back
    alone, judged = (row["actions"][a] for a in bench_judge.ARMS)
    held = alone.get("replace", 0) - judged.get("replace", 0)
    assert held >= 0
    assert abs(judged.get("review", 0) - alone.get("review", 0)) <= held
    assert sum(alone.values()) == sum(judged.values()) == 20


def test_cv_judge_scores_each_set_with_a_judge_fitted_without_it(
    cache_dir: Path, tmp_path: Path
) -> None:
    import cv_judge

    data = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
    sets = [str(data / f"{name}.jsonl") for name in ("heldout2", "heldout3", "heldout4")]
    argv = ["--smoke", "--cache-dir", str(cache_dir), "--out", str(tmp_path), "--sets", *sets]
    assert cv_judge.main(argv) == 0
    result = _result(tmp_path, "cv_judge")
    assert [r["set"] for r in result["sets"]] == ["heldout2", "heldout3", "heldout4"]
    for rec in result["sets"]:
        assert set(rec["bars"]) == {"duplicate_bar", "veto_bar"}
        alone, judged = rec["alone"], rec["judge"]
        assert alone["strict"]["cases"] == judged["strict"]["cases"] == 15
        # the judge never adds a wrongful overwrite, and review never replaces
        assert judged["strict"]["wrongful_overwrites"] <= alone["strict"]["wrongful_overwrites"]
        assert judged["review"]["wrongful_overwrites"] == 0
    assert set(result["review_all"]) == {"alone", "judge"}


def test_bench_nli_graph_profiles_the_trimmed_graph_and_its_baseline(
    cache_dir: Path, tmp_path: Path
) -> None:
    """bench_nli_graph on the cache's nli-deberta int8: the untrimmed graph against itself
    trimmed on the fly (a cache built before the trim step), or the trimmed graph alone."""
    import bench_nli_graph

    argv = ["--smoke", "--cache-dir", str(cache_dir), "--out", str(tmp_path)]
    assert bench_nli_graph.main(argv) == 0
    result = _result(tmp_path, "bench_nli_graph")
    assert result["profiles"] and all(
        0.0 < p["int8_gemm_share"] < 1.0 and p["quiet_ms"] > 0 for p in result["profiles"].values()
    )
    trimmed = [p for name, p in result["profiles"].items() if name.startswith("after")]
    assert trimmed and all("Tile" not in p["ms_by_op"] for p in trimmed)
    if result["decisions"] is not None:  # a baseline was measured: the same decisions
        assert result["decisions"]["max_abs_contradiction_diff"] == 0.0
        assert set(result["decisions"]["flips"].values()) == {0}
