"""NLI sub-batch benchmark (issue 34): a 32-pair call cut into forward passes of the size this
machine runs fastest, against one pass of 32 and against careful PyTorch, in the same run.

1. The tuner's own measurement (``engine.runtime.tuning.measure``): pairs/s of a 32-pair call at
   sub-batch 1, 2, 4, 8, 16, 32 on nli-deberta-v3-small int8, and the size it chooses.
2. Interleaved rounds at call sizes 1, 8, 32 (each round visits every engine and size): ONNX
   Runtime int8 with one forward pass per call (the engine before issue 34), int8 with the
   tuned sub-batch, and sentence-transformers' CrossEncoder on the same random-initialised
   weights in the careful user's loop (bench_runtime's baseline). Figures are the best round;
   ratios ``engine / PyTorch`` are the median of per-round ratios (min-max shown).

Prints tables; writes JSON and a PNG to ``--out`` (default benchmarks/results/).

    python benchmarks/bench_sub_batch.py --quick     # ~2 minutes on 2 cores
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

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
    TARGET_NLI_RATIO,
    TORCH,
    careful_cross_encoder,
    load,
    ort_nli,
    round_ratios,
    sweep,
)

from engine.runtime import tuning  # noqa: E402

NAME = "bench_sub_batch"
SIZES = (1, 8, 32)
ONE_PASS = "ort int8, one pass per call"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(parser)
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    rounds, seconds, pool_n = (
        (1, 0.2, 64)
        if args.smoke
        else (6, 0.4, 512)
        if args.quick
        else (
            6,
            1.5,
            1024,
        )
    )
    result: dict[str, Any] = run_header(NAME, args)
    result["settings"].update({"sizes": list(SIZES), "rounds": rounds, "slice_s": seconds})
    pairs = Corpus(args.seed).pairs(pool_n, salt=3)

    print("[1/2] the tuner's measurement (32-pair call)", flush=True)
    probe = ort_nli(args.cache_dir, "int8", args.threads, 32, tokens=BIG)
    rates = tuning.measure(probe, rounds=max(2, rounds // 2))
    chosen = tuning.choose(rates)
    print(
        table(
            ["sub-batch", "pairs/s", "x sub-batch 32"],
            [[k, f"{v:.1f}", f"{v / rates[32]:.2f}"] for k, v in sorted(rates.items())],
            title=f"NLI int8, 32-pair call: chosen sub-batch {chosen}",
        )
    )
    del probe

    print("[2/2] interleaved rounds against careful PyTorch", flush=True)
    scorers: dict[str, Any] = {}
    tuned = f"ort int8, sub-batch {chosen}"

    def build(label: str, size: int) -> Any:
        def make() -> Any:
            scorers[label] = ort_nli(args.cache_dir, "int8", args.threads, size, tokens=BIG)
            return lambda items, _b: scorers[label].score(items)

        return make

    engines = [
        load(ONE_PASS, "ort", build(ONE_PASS, 4096), pairs[:32]),
        load(tuned, "ort", build(tuned, chosen), pairs[:32]),
    ]
    work = Path(tempfile.mkdtemp(prefix="memgate-bench-"))

    def build_ce() -> Any:
        ce, _info = torch_cross_encoder(work)
        return careful_cross_encoder(ce, args.threads)

    engines.append(load(TORCH, "torch", build_ce, pairs[:32]))
    points = sweep(engines, pairs, SIZES, rounds, seconds, "NLI sweep")
    shutil.rmtree(work, ignore_errors=True)

    rows, figures = [], {}
    for e in engines:
        by = points[e.name]
        figures[e.name] = {str(b): by[b].record() for b in SIZES}
        ratio = {b: round_ratios(by[b], points[TORCH][b]) for b in SIZES}
        rows.append(
            [e.name]
            + [f"{by[b].rate:.1f}" if by[b].rate else "-" for b in SIZES]
            + [
                "-" if e.name == TORCH or ratio[b] is None else f"{ratio[b]['median']:.2f}x"
                for b in SIZES
            ]
        )
        figures[e.name]["ratio_vs_pytorch"] = {str(b): ratio[b] for b in SIZES}
    headers = ["engine", *(f"pairs/s @{b}" for b in SIZES), *(f"x torch @{b}" for b in SIZES)]
    print(table(headers, rows, title="NLI pairs/s by call size (best round)"))
    r32 = figures[tuned]["ratio_vs_pytorch"]["32"]
    one32 = figures[ONE_PASS]["ratio_vs_pytorch"]["32"]
    summary = {
        "chosen_sub_batch": chosen,
        "tuner_pairs_per_s": {str(k): round(v, 1) for k, v in sorted(rates.items())},
        "tuned_vs_pytorch_at_32": r32,
        "one_pass_vs_pytorch_at_32": one32,
        "target_vs_pytorch_at_32": TARGET_NLI_RATIO,
        "tuned_over_one_pass_at_32": round(
            (points[tuned][32].rate or 0) / max(points[ONE_PASS][32].rate or 1e-9, 1e-9), 3
        ),
        "note": shared_machine_note(),
    }
    result.update({"figures": figures, "summary": summary})
    print(
        f"\nat 32: tuned {r32['median'] if r32 else '-'}x PyTorch, one pass "
        f"{one32['median'] if one32 else '-'}x (target {TARGET_NLI_RATIO}x); tuned / one pass "
        f"{summary['tuned_over_one_pass_at_32']}x"
    )
    stamp = utc_stamp()
    png = Path(args.out) / f"{NAME}-{stamp}.png"
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for e in engines:
            ax.plot(SIZES, [points[e.name][b].rate or 0 for b in SIZES], marker="o", label=e.name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("pairs per call")
        ax.set_ylabel("pairs/s")
        ax.set_title(f"NLI int8 sub-batch {chosen} vs one pass vs PyTorch")
        ax.legend(fontsize=8)
        fig.tight_layout()
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, dpi=110)
        result["plot"] = str(png)
    path = write_json(Path(args.out), NAME, result, stamp=stamp)
    print(f"wrote {path}" + (f" and {png}" if "plot" in result else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
