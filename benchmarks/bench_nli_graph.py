"""NLI graph trim benchmark (issue 34, item 4): where a 32-pair NLI call spends its time by
operator, before and after ``engine.pipeline.trim``, and the call against careful PyTorch, in
the same run.

1. **Profile** (ONNX Runtime's profiler, the engine's session options): one 32-pair call of the
   pool's pairs, length-bucketed as the engine does, at one forward pass of 32 and at the
   sub-batch the tuner picks. Per operator type: the sum over nodes of each node's *fastest*
   of ``--profile-runs`` runs (on a shared machine a node is only ever slowed down, so this
   estimates the quiet time), its share, and the share of the int8 GEMMs
   (``MatMulIntegerToFloat``, ``MatMulInteger``, ``MatMulNBits``, ``QLinearMatMul``): the
   fraction of the int8 GEMM ceiling in the issue's sense (what the call would cost if
   everything but the int8 GEMMs at these shapes were free).
2. **Interleaved rounds** of 32-pair calls: the untrimmed and the trimmed graph, each at one pass
   of 32 and at its tuned sub-batch, and sentence-transformers' CrossEncoder on the same
   random-initialised weights in the careful user's loop (bench_runtime's baseline). Pairs/s
   is the best round and the median; ratios ``engine / PyTorch`` are the median of per-round
   ratios (min-max shown).
3. **Dense GEMM ceiling** (bench_runtime's): the int8 kernel's GOPS on the DeBERTa FFN shape,
   and each engine's pairs/s as a fraction of what that allows.
4. **Decisions**: the contradiction probability of every pool pair scored by both graphs (one
   pass of 32): largest difference and flips at 0.5 / 0.8 / 0.95.

``--before`` is the untrimmed int8 artefact (default: ``nli-deberta-v3-small/int8`` in the
cache; a cache built before the trim step holds one). ``--after`` is the trimmed one (default:
the ``--before`` graph trimmed here by ``trim_graph``, the build step itself, into a temporary
artefact).

Prints tables; writes JSON and a PNG to ``--out`` (default benchmarks/results/).

    python benchmarks/bench_nli_graph.py --quick      # ~4 minutes on 2 idle cores
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import bisect  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    Corpus,
    add_common_args,
    pyplot,
    run_header,
    shared_machine_note,
    table,
    torch_cross_encoder,
    utc_stamp,
    write_json,
)
from bench_runtime import (  # noqa: E402
    BIG,
    GEMM_OPS,
    TARGET_NLI_RATIO,
    TORCH,
    Engine,
    careful_cross_encoder,
    ceiling_fractions,
    gemm_ceiling,
    gemm_flops_per_token,
    round_ratios,
    sweep,
)

NAME = "bench_nli_graph"
CALL = 32
INT8_GEMMS = frozenset({"MatMulIntegerToFloat", "MatMulInteger", "MatMulNBits", "QLinearMatMul"})
TARGET_INT8_CEILING = 0.35
"""Issue 34: the 32-pair call at >= 0.35 of the int8 GEMM ceiling."""
BARS = (0.5, 0.8, 0.95)


def scorer(directory: Path, threads: int, max_batch: int) -> Any:
    from engine.runtime.base import BatchSettings
    from engine.runtime.manifest import load_manifest
    from engine.runtime.nli import NLIScorer
    from engine.runtime.session import SessionSettings

    return NLIScorer(
        load_manifest(directory),
        SessionSettings(intra_op_threads=threads),
        BatchSettings(max_batch=max_batch, max_batch_tokens=BIG),
    )


def trimmed_artefact(before: Path, work: Path) -> tuple[Path, dict[str, Any]]:
    """``before``'s graph trimmed by the build step into an artefact under ``work``."""
    from engine.pipeline._common import _inherited_fields, _publish
    from engine.pipeline.trim import trim_graph
    from engine.runtime.manifest import load_manifest

    manifest = load_manifest(before)
    graph = work / "trimmed.onnx"
    record = trim_graph(manifest.model_path, graph)
    fields = _inherited_fields(before)
    fields.update(trim={**record, "checked": False, "reason": "trimmed by the benchmark"})
    files = {"model.onnx": graph, "tokenizer.json": manifest.tokenizer_path}
    final = work / "models" / "nli-deberta-v3-small" / "int8-trimmed"
    final.parent.mkdir(parents=True, exist_ok=True)
    _publish(final, files, fields)
    return final, record


def profile(model: Any, pairs: Sequence[tuple[str, str]], runs: int, threads: int) -> dict:
    """Kernel time by operator type of one call over ``pairs`` at the scorer's sub-batch:
    per node the fastest of ``runs`` profiled runs, summed by type (see the module docstring)."""
    import onnxruntime as ort

    prepared = model.preprocess(list(pairs))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "nli")
        session = ort.InferenceSession(
            str(model.manifest.model_path), opts, providers=["CPUExecutionProvider"]
        )
        names = {i.name for i in session.get_inputs()}
        feeds = [{k: v for k, v in b.feeds.items() if k in names} for b in prepared.buckets]
        for f in feeds:  # warm-up, left out
            session.run(None, f)
        for _ in range(runs):
            t0 = time.perf_counter()
            for f in feeds:
                session.run(None, f)
            walls.append(time.perf_counter() - t0)
        events = json.loads(Path(session.end_profiling()).read_text(encoding="utf-8"))
    starts = sorted(
        e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"
    )
    cut = starts[len(feeds)]
    per: dict[tuple[int, str], list[float]] = {}
    kind: dict[str, str] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= cut:
            run = bisect.bisect_right(starts, e["ts"]) - 1
            per.setdefault((run % len(feeds), e["name"]), []).append(float(e["dur"]))
            kind[e["name"]] = e["args"]["op_name"]
    by: dict[str, float] = {}
    for (_, node), durations in per.items():
        by[kind[node]] = by.get(kind[node], 0.0) + min(durations)
    total = sum(by.values())
    int8 = sum(v for k, v in by.items() if k in INT8_GEMMS)
    gemm = sum(v for k, v in by.items() if k in GEMM_OPS)
    return {
        "pairs": len(pairs),
        "sub_batch": model.max_batch,
        "passes": len(feeds),
        "runs": runs,
        "quiet_ms": total / 1e3,
        "wall_ms_median": 1e3 * statistics.median(walls),
        "wall_ms_best": 1e3 * min(walls),
        "ms_by_op": {k: round(v / 1e3, 3) for k, v in sorted(by.items(), key=lambda kv: -kv[1])},
        "int8_gemm_share": int8 / total if total else None,
        "gemm_share": gemm / total if total else None,
        "quiet_pairs_per_s": len(pairs) / (total / 1e6) if total else None,
    }


def profile_table(profiles: dict[str, dict[str, Any]], top: int = 16) -> str:
    names = list(profiles)
    ops: dict[str, float] = {}
    for p in profiles.values():
        for op, ms in p["ms_by_op"].items():
            ops[op] = max(ops.get(op, 0.0), ms)
    rows = []
    for op in sorted(ops, key=lambda o: -ops[o])[:top]:
        row: list[Any] = [op]
        for n in names:
            ms = profiles[n]["ms_by_op"].get(op, 0.0)
            row.append(f"{ms:.2f} ({ms / profiles[n]['quiet_ms']:.1%})")
        rows.append(row)
    rows.append(["total (quiet estimate)"] + [f"{profiles[n]['quiet_ms']:.1f}" for n in names])
    rows.append(["int8 GEMM share"] + [f"{profiles[n]['int8_gemm_share']:.1%}" for n in names])
    return table(
        ["operator, ms a 32-pair call", *names],
        rows,
        title="(1) where a 32-pair call's time goes (per node: fastest of the profiled runs)",
    )


def decisions(a: Any, b: Any, pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    p = np.concatenate([a.contradiction(pairs[i : i + CALL]) for i in range(0, len(pairs), CALL)])
    q = np.concatenate([b.contradiction(pairs[i : i + CALL]) for i in range(0, len(pairs), CALL)])
    return {
        "pairs": len(pairs),
        "max_abs_contradiction_diff": float(np.abs(p - q).max()),
        "flips": {str(t): int(((p > t) != (q > t)).sum()) for t in BARS},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser)
    parser.add_argument("--before", type=Path, default=None, help="untrimmed int8 artefact dir")
    parser.add_argument("--after", type=Path, default=None, help="trimmed int8 artefact dir")
    parser.add_argument("--profile-runs", type=int, default=None, help="profiled runs per graph")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    from engine.runtime import tuning

    rounds, seconds, pool_n, runs = (
        (1, 0.2, 64, 2) if args.smoke else (6, 0.5, 512, 8) if args.quick else (10, 1.0, 1024, 16)
    )
    runs = args.profile_runs or runs
    result: dict[str, Any] = run_header(NAME, args)
    m = result["machine"]
    print(
        f"{NAME}: {m['cpu']} ({m['usable_cores']} cores), load {m['load_average_at_start']}, "
        f"git {result['git']['sha'][:10]}{'+dirty' if result['git']['dirty'] else ''}",
        flush=True,
    )
    before_dir = args.before or args.cache_dir / "models" / "nli-deberta-v3-small" / "int8"
    work = Path(tempfile.mkdtemp(prefix="memgate-bench-graph-"))
    try:
        before_trim = json.loads((before_dir / "manifest.json").read_text("utf-8")).get("trim")
        if args.after is None:
            if before_trim and before_trim.get("applied"):
                # a cache built by the trimming pipeline holds no untrimmed graph: measure the
                # trimmed one alone (a baseline needs --before from an older cache)
                print(f"  {before_dir} is trimmed and no --before is untrimmed: no baseline")
                after_dir, record = before_dir, before_trim
            else:
                after_dir, record = trimmed_artefact(before_dir, work)
                print(f"  trimmed {before_dir} here: {record}", flush=True)
        else:
            after_dir = args.after
            record = json.loads((after_dir / "manifest.json").read_text("utf-8")).get("trim")
        result["settings"].update(
            before=str(before_dir),
            after=str(after_dir),
            trim=record,
            rounds=rounds,
            slice_s=seconds,
            pool=pool_n,
            profile_runs=runs,
        )
        pairs = Corpus(args.seed).pairs(pool_n, salt=3)
        graphs = {"after": after_dir}
        if after_dir != before_dir:
            graphs = {"before": before_dir, **graphs}

        print("[1/4] tuned sub-batch of each graph (the tuner's own measurement)", flush=True)
        tuned: dict[str, int] = {}
        for name, d in graphs.items():
            probe = scorer(d, args.threads, CALL)
            rates = tuning.measure(probe, rounds=max(2, rounds // 2))
            tuned[name] = tuning.choose(rates)
            print(
                f"  {name}: sub-batch {tuned[name]} "
                f"({', '.join(f'{k}: {v:.0f}' for k, v in sorted(rates.items()))} pairs/s)",
                flush=True,
            )
        result["tuned_sub_batch"] = tuned

        print(f"[2/4] profile of a {CALL}-pair call ({runs} runs per graph)", flush=True)
        profiles: dict[str, dict[str, Any]] = {}
        call_pairs = Corpus(args.seed).pairs(CALL, salt=23)
        for name, d in graphs.items():
            for size in sorted({CALL, *tuned.values()}):
                label = f"{name} @{size}"
                profiles[label] = profile(
                    scorer(d, args.threads, size), call_pairs, runs, args.threads
                )
        print(profile_table(profiles), flush=True)
        result["profiles"] = profiles

        print(f"[3/4] interleaved {CALL}-pair calls against careful PyTorch", flush=True)
        scorers: dict[str, Any] = {}
        engines: list[Engine] = []
        for name, d in graphs.items():
            for size in sorted({CALL, *tuned.values()}, reverse=True):
                label = f"{name} @{size}"
                scorers[label] = scorer(d, args.threads, size)
                scorers[label].score(pairs[:CALL])
                engines.append(
                    Engine(label, "ort", lambda items, _b, s=scorers[label]: s.score(items))
                )
        ce, _info = torch_cross_encoder(work)
        careful = careful_cross_encoder(ce, args.threads)
        careful(pairs[:CALL], CALL)
        engines.append(Engine(TORCH, "torch", careful, note="sorted, inference_mode"))
        points = sweep(engines, pairs, [CALL], rounds, seconds, "32-pair calls")
        result["decisions"] = (
            decisions(scorers[f"before @{CALL}"], scorers[f"after @{CALL}"], pairs)
            if "before" in graphs
            else None
        )

        print("[4/4] dense int8 GEMM ceiling on the DeBERTa FFN shape", flush=True)
        ceiling = gemm_ceiling(args.threads, max(2, rounds // 2), seconds, m["isa"])
        flops = gemm_flops_per_token(Path(scorers[f"after @{CALL}"].manifest.model_path))
        tokens = float(np.mean([len(e.ids) for e in scorers[f"after @{CALL}"].encode(pairs)]))
        result["gemm_ceiling"] = ceiling
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows, figures = [], {}
    for e in engines:
        point = points[e.name][CALL]
        ratio = None if e.name == TORCH else round_ratios(point, points[TORCH][CALL])
        prof = profiles.get(e.name)
        dense = ceiling_fractions(ceiling, point.rate, flops, tokens, "int8")
        figures[e.name] = {
            **point.record(),
            "ratio_vs_pytorch": ratio,
            "int8_gemm_ceiling_fraction": prof["int8_gemm_share"] if prof else None,
            "dense_ceiling": dense,
        }
        rows.append(
            [
                e.name,
                f"{point.rate:.1f}" if point.rate else "-",
                f"{statistics.median(point.rates):.1f}" if point.rates else "-",
                "-"
                if ratio is None
                else f"{ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})",
                f"{prof['int8_gemm_share']:.2f}" if prof else "-",
                f"{dense['fraction']:.2f}" if dense.get("fraction") else "-",
            ]
        )
    print()
    print(
        table(
            [
                "engine",
                "pairs/s best",
                "median",
                "x PyTorch (median of rounds)",
                "of int8 GEMM ceiling",
                "of dense ceiling",
            ],
            rows,
            title=f"(2) {CALL}-pair calls, {rounds} interleaved rounds",
        )
    )
    speedups = {}
    for size in sorted({CALL, *tuned.values()}):
        if "before" not in graphs:
            break
        a, b = points[f"after @{size}"][CALL], points[f"before @{size}"][CALL]
        speedups[str(size)] = round_ratios(a, b)
        if speedups[str(size)]:
            r = speedups[str(size)]
            print(
                f"after / before at sub-batch {size}: {r['median']:.3f}x "
                f"[{r['min']:.3f}-{r['max']:.3f}] (median of {r['rounds']} same-round ratios)"
            )
    result["after_over_before"] = speedups
    d = result["decisions"] or {"pairs": 0, "max_abs_contradiction_diff": 0.0, "flips": {}}
    print(
        f"\n(3) decisions, before vs after on {d['pairs']} pairs: max |d contradiction| "
        f"{d['max_abs_contradiction_diff']:.1e}, flips {d['flips']}"
    )
    best = max(
        (n for n in figures if n.startswith("after")),
        key=lambda n: (figures[n]["ratio_vs_pytorch"] or {}).get("median", 0.0),
    )
    summary = {
        "best_trimmed_engine": best,
        "vs_pytorch_median": (figures[best]["ratio_vs_pytorch"] or {}).get("median"),
        "target_vs_pytorch": TARGET_NLI_RATIO,
        "int8_gemm_ceiling_fraction": figures[best]["int8_gemm_ceiling_fraction"],
        "target_int8_gemm_ceiling": TARGET_INT8_CEILING,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "note": shared_machine_note(),
    }
    result.update({"figures": figures, "summary": summary})
    print(
        f"\nbest trimmed: {best}: {summary['vs_pytorch_median']}x PyTorch (target "
        f"{TARGET_NLI_RATIO}x), {summary['int8_gemm_ceiling_fraction']:.2f} of the int8 GEMM "
        f"ceiling (target {TARGET_INT8_CEILING}); load {summary['load_average_at_end']}"
    )
    if summary["note"]:
        print(summary["note"])
    stamp = utc_stamp()
    png = Path(args.out) / f"{NAME}-{stamp}.png"
    plt = pyplot()
    if plt is not None:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        names = list(figures)
        ax1.bar(names, [points[n][CALL].rate or 0 for n in names], color="#4C72B0")
        ax1.set_ylabel("pairs/s (best round)")
        ax1.set_title(f"{CALL}-pair calls")
        ax1.tick_params(axis="x", rotation=30, labelsize=8)
        ops = list(next(iter(profiles.values()))["ms_by_op"])[:10]
        width = 0.8 / len(profiles)
        for k, (label, prof) in enumerate(profiles.items()):
            ax2.bar(
                [i + k * width for i in range(len(ops))],
                [prof["ms_by_op"].get(op, 0.0) for op in ops],
                width,
                label=label,
            )
        ax2.set_xticks([i + 0.4 for i in range(len(ops))], ops, rotation=45, fontsize=7)
        ax2.set_ylabel("ms a call (quiet estimate)")
        ax2.legend(fontsize=7)
        fig.tight_layout()
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, dpi=110)
        result["plot"] = str(png)
    path = write_json(Path(args.out), NAME, result, stamp=stamp)
    print(f"wrote {path}" + (f" and {png}" if "plot" in result else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
