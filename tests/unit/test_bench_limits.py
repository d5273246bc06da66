"""Pure pieces of the runtime benchmark's limits and ratios, and compare's CPU check."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import compare  # noqa: E402

AMD = {"cpu": "AMD EPYC", "usable_cores": 2, "isa": ["avx2", "avx512f", "avx512_vnni"]}
XEON = {
    "cpu": "Intel Xeon",
    "usable_cores": 2,
    "isa": ["avx2", "avx512f", "avx512_vnni", "amx_int8"],
}


def test_compare_warns_when_runs_come_from_different_cpus() -> None:
    assert compare.cpu_mismatch({"machine": AMD}, {"machine": dict(AMD)}) is None
    warning = compare.cpu_mismatch({"machine": AMD}, {"machine": XEON})
    assert warning is not None and "AMD EPYC" in warning and "gained amx_int8" in warning
    # a suite keeps the machine in each part
    suite = {"runtime": {"machine": {**AMD, "usable_cores": 4}}}
    assert "usable cores 2 -> 4" in (compare.cpu_mismatch({"machine": AMD}, suite) or "")
    assert compare.cpu_mismatch({}, {"machine": AMD}) is None  # nothing to compare against


def test_compare_prints_the_cpu_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({"machine": AMD, "nli": {"x": {"32": {"items_per_s": 10.0}}}}))
    new.write_text(json.dumps({"machine": XEON, "nli": {"x": {"32": {"items_per_s": 20.0}}}}))
    assert compare.main([str(old), str(new)]) == 0
    assert "WARNING: the two runs come from different machines" in capsys.readouterr().out


def test_round_ratios_and_ceiling_fractions() -> None:
    pytest.importorskip("numpy")
    import bench_runtime as br

    engine, ref = br.Point(rates=[10.0, 12.0, 9.0]), br.Point(rates=[2.0, 3.0, 3.0])
    rr = br.round_ratios(engine, ref)
    assert rr == {"median": 4.0, "min": 3.0, "max": 5.0, "rounds": 3, "spread": 0.667}
    assert br.round_ratios(br.Point(), ref) is None
    ceiling = {"gops": {"int8": 100.0, "fp32": 25.0}}
    f = br.ceiling_fractions(ceiling, 50.0, flops_per_token=1e8, tokens_per_item=20, kernel="int8")
    assert f["ceiling_items_per_s"] == 50.0 and f["fraction"] == 1.0
    assert br.ceiling_fractions(ceiling, None, 1e8, 20, "int8")["fraction"] is None
