"""bench_gate_cost's pure parts on synthetic rounds: the summary's medians and ratios, the memo
cache clearing, the revision default, bench_gate's scenario keys and its plot. No model runs
here."""

from __future__ import annotations

import sys
import types
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_gate  # noqa: E402
import bench_gate_cost as cost  # noqa: E402


def side(s_per_fact: float, spacy: float = 0.0, cpu: float | None = None) -> dict[str, Any]:
    cpu = s_per_fact * 2 if cpu is None else cpu
    run = {
        "s_per_fact": s_per_fact,
        "cpu_s_per_fact": cpu,
        "spacy_s_per_fact": spacy,
        "spacy_calls_per_fact": 2.0,
        "pairs_per_fact": 3.0,
    }
    cached = {"s_per_fact": s_per_fact / 2, "cpu_s_per_fact": cpu / 2}
    per = {"uncached": [run], "cached": [cached]}
    return {"sizes": {"1000": {"aegis": per}}}


def test_summary_takes_the_median_of_per_round_ratios() -> None:
    rounds = [
        {"old": side(0.010), "new": side(0.012, spacy=0.003)},  # 1.2x
        {"old": side(0.020), "new": side(0.030, spacy=0.003)},  # 1.5x
        {"old": side(0.010), "new": side(0.011, spacy=0.003, cpu=0.040)},  # 1.1x; CPU 2x
    ]
    (row,) = cost.summarise(rounds, ["1000"], ["aegis"])
    assert row["ratio_uncached"]["median"] == pytest.approx(1.2)
    assert row["ratio_uncached"]["min"] == pytest.approx(1.1)
    assert row["ratio_uncached"]["max"] == pytest.approx(1.5)
    assert row["old_uncached_ms"]["median"] == pytest.approx(10.0)
    assert row["new_uncached_ms"]["max"] == pytest.approx(30.0)
    assert row["met"]  # 1.2 <= 1.3
    assert row["ratio_uncached_cpu"]["median"] == pytest.approx(1.5)  # 1.2, 1.5, 2.0
    assert row["ratio_uncached_cpu"]["max"] == pytest.approx(2.0)
    assert row["parser"]["spacy_ms_per_fact"] == pytest.approx(3.0)
    assert row["parser"]["spacy_share"] == pytest.approx(0.25)  # 3 ms of the 12 ms median
    assert row["parser"]["uncached_minus_cached_ms"] == pytest.approx(6.0)


def test_summary_reports_a_missed_target() -> None:
    rounds = [{"old": side(0.010), "new": side(0.014)}, {"old": side(0.010), "new": side(0.015)}]
    (row,) = cost.summarise(rounds, ["1000"], ["aegis"])
    assert row["ratio_uncached"]["median"] == pytest.approx(1.45)
    assert not row["met"]


def test_gate_caches_are_cleared_but_model_loaders_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("engine.gate._cost_probe")
    calls: list[str] = []

    @lru_cache(maxsize=64)
    def parse(text: str) -> str:
        calls.append(text)
        return text.upper()

    @lru_cache(maxsize=1)
    def pipeline() -> object:
        return object()

    for fn in (parse, pipeline):
        fn.__module__ = module.__name__
        setattr(module, fn.__name__, fn)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    parse("a")
    loaded = pipeline()
    assert cost.clear_gate_caches() >= 1
    assert parse.cache_info().currsize == 0
    parse("a")
    assert calls == ["a", "a"]  # parsed again after the clear
    assert pipeline() is loaded  # the one-slot loader survives


def test_default_against_is_a_commit() -> None:
    try:
        rev, why = cost.default_against()
    except SystemExit:
        pytest.skip("no gate-v2 merge in this clone's history (shallow clone)")
    assert len(rev) == 40 and "first parent" in why


def test_scenario_keys_are_unique_and_short() -> None:
    keys = [
        bench_gate.scenario_key(s)
        for s in (
            bench_gate.Scenario("", 1, 1_000),
            bench_gate.Scenario("", 1, 100_000),
            bench_gate.Scenario("", 1, 300),
            bench_gate.Scenario("", 10_000, 100),
        )
    ]
    assert keys == ["1k", "100k", "300", "10000x100"]


@pytest.mark.parametrize("namespaces", [[1, 1], [1, 10_000], [10_000]])
def test_bench_gate_plots_any_mix_of_scenarios(tmp_path: Path, namespaces: list[int]) -> None:
    """A run of the many-namespace scenario alone (``--scenarios 10000x100``) has no
    one-namespace curve; the plot must still be drawn (a log axis with no data raised)."""
    pytest.importorskip("matplotlib")
    rows = [
        {
            "namespaces": n,
            "per_namespace": 100 if n > 1 else 1000 * (i + 1),
            "memories": 100 * n if n > 1 else 1000 * (i + 1),
            "memgate_deberta": 25.6,
            "memgate_aegis": 27.6,
            "pytorch": 13.9,
            "seed": 1.4,
        }
        for i, n in enumerate(namespaces)
    ]
    png = tmp_path / "gate.png"
    assert bench_gate.plot(png, rows, "synthetic")
    assert png.stat().st_size > 1000


def test_the_checkout_goes_first_unless_pythonpath_names_a_tree() -> None:
    from _common import with_checkout

    here = str(ROOT)
    assert with_checkout(["/bench", "/old", "/site"], here, "/old") == [
        "/bench",
        "/old",
        here,
        "/site",
    ]
    assert with_checkout(["/bench", "/site"], here, "") == [here, "/bench", "/site"]
    assert with_checkout(["/bench", here], here, "/old") == ["/bench", here]


def test_a_worker_imports_the_engine_of_its_tree(tmp_path: Path) -> None:
    """The old side must measure the old tree: ``_common`` used to put this checkout first on
    the path, ahead of the worker's ``PYTHONPATH``, so both sides imported this checkout's
    ``engine``."""
    import os
    import subprocess

    fake = tmp_path / "old-tree"
    (fake / "engine" / "cli").mkdir(parents=True)
    (fake / "engine" / "__init__.py").write_text("")
    (fake / "engine" / "cli" / "__init__.py").write_text("")
    (fake / "engine" / "cli" / "common.py").write_text("def default_cache_dir():\n    return 0\n")
    code = (
        "import sys; sys.argv = ['x']; import bench_gate_cost, _common, engine; "
        "print(engine.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(fake)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "benchmarks",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert Path(out.stdout.strip()).resolve() == (fake / "engine" / "__init__.py").resolve()
