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


def _run(ts: int, dur: int) -> dict[str, object]:
    return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}


def _node(op: str, ts: int, dur: int) -> dict[str, object]:
    return {
        "cat": "Node",
        "name": f"n{ts}_kernel_time",
        "ts": ts,
        "dur": dur,
        "args": {"op_name": op},
    }


def test_operator_times_leave_out_the_warm_up_and_bound_what_a_gemm_kernel_can_give() -> None:
    pytest.importorskip("numpy")
    import bench_runtime as br

    events = [
        _run(0, 1000),  # warm-up: its nodes must not count
        _node("MatMulNBits", 10, 900),
        _run(2000, 100),
        _node("MatMulNBits", 2010, 60),
        _node("Softmax", 2070, 15),
        _node("MatMulNBits", 2085, 5),
        _node("MatMulNBits_fence_before", 2090, 99) | {"name": "fence"},  # not a kernel event
        _run(3000, 100),
        _node("FusedMatMul", 3010, 40),
        _node("LayerNormalization", 3050, 30),
    ]
    ops = br.operator_times(events, skip_runs=1)
    assert ops["runs"] == 2 and ops["run_us"] == 200.0
    assert ops["kernel_us_by_op"] == {
        "MatMulNBits": 65.0,
        "FusedMatMul": 40.0,
        "LayerNormalization": 30.0,
        "Softmax": 15.0,
    }
    assert ops["gemm_us"] == 105.0 and ops["gemm_share"] == pytest.approx(0.525)
    # the rest (95 us, runtime overhead between kernels included) stays when GEMMs are free
    assert ops["free_gemm_speedup"] == pytest.approx(200 / 95)
    bound = br.gemm_bounds(ops, rate=30.0, pytorch=20.0, faster=3.0)
    free, sped = bound["free_gemms"], bound["gemms_faster"]
    assert free["pairs_per_s"] == pytest.approx(30 * 200 / 95)
    assert free["vs_pytorch"] == pytest.approx(1.5 * 200 / 95)
    # GEMMs 3x as fast: 95 + 105 / 3 = 130 of 200 us
    assert sped["speedup"] == pytest.approx(200 / 130)
    assert sped["vs_pytorch"] == pytest.approx(1.5 * 200 / 130)
    unknown = br.gemm_bounds(ops, rate=None, pytorch=20.0, faster=None)
    assert unknown["free_gemms"]["pairs_per_s"] is None
    assert unknown["gemms_faster"]["speedup"] is None
    text = br.operators_table({**ops, "pairs": 2, "bound": bound}, "int8")
    assert "52.5% of it in GEMMs" in text and "every GEMM free: 63 pairs/s = 3.16x" in text
    with pytest.raises(ValueError, match="2 model runs, 2 to skip"):
        br.operator_times(events[:7], skip_runs=2)


def test_int8_drift_counts_flips_on_either_side_of_each_bar() -> None:
    import int8_drift
    import numpy as np

    ref = np.array([0.10, 0.49, 0.51, 0.90, 0.96, 0.99])
    got = np.array([0.10, 0.52, 0.47, 0.79, 0.94, 0.99])
    row = int8_drift.drift_row(got, ref)
    assert row["max_abs"] == pytest.approx(0.11)
    assert row["mean_abs"] == pytest.approx((0.03 + 0.04 + 0.11 + 0.02) / 6)
    # 0.5: 0.49->0.52 up and 0.51->0.47 down; 0.8: 0.90->0.79; 0.95: 0.96->0.94
    assert row["flips"] == {"0.5": 2, "0.8": 1, "0.95": 1}
    assert int8_drift.drift_row(ref, ref)["flips"] == {"0.5": 0, "0.8": 0, "0.95": 0}
