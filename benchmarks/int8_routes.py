"""NLI int8 routes in one run: the shipped ``int8`` (rowwise) vs blockwise (built here from the
fp32 artefact by the pipeline's own rewrite) vs static (``int8-static``, when built) vs ONNX fp32
vs the careful PyTorch fp32 baseline, with bench_runtime's engines and interleaved sweep, batch
1 / 8 / 32 (no 128: on a loaded 2-core machine one fp32 call at 128 takes over a minute).

    python benchmarks/int8_routes.py --cache-dir $MEMGATE_HOME --rounds 3 --slice 0.4

Prints pairs/s and each per-round ratio (median [min-max]) against PyTorch and against the
shipped int8; writes the figures as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "2")

import bench_runtime as br  # noqa: E402

from engine.pipeline.static import STATIC_VARIANT  # noqa: E402
from engine.runtime.layout import artefact_dir  # noqa: E402

SHIPPED = "ort int8 (all)"
BLOCKWISE = "ort blockwise (all)"
ROUTES = (
    ("ort fp32 (all)", "fp32"),
    (SHIPPED, "int8"),
    (BLOCKWISE, "blockwise"),
    ("ort int8-static (all)", "int8-static"),
)
SIZES = (1, 8, 32)


def blockwise_scorer(cache: Path, work: Path, threads: int) -> Any:
    """nli-deberta-v3-small's fp32 artefact rewritten by ``graph.blockwise_int8`` (MatMulNBits,
    a scale per row and 32-wide K-block), served with the shipped int8's tokenizer and manifest
    fields (both routes are row-invariant, so it batches alike)."""
    import dataclasses
    import shutil

    from engine.pipeline import graph
    from engine.runtime.base import BatchSettings
    from engine.runtime.manifest import load_manifest
    from engine.runtime.nli import NLIScorer
    from engine.runtime.session import SessionSettings

    fp32 = load_manifest(artefact_dir(cache, "nli-deberta-v3-small", "fp32"))
    shipped = load_manifest(artefact_dir(cache, "nli-deberta-v3-small", "int8"))
    graph.blockwise_int8(fp32.model_path, work / "blockwise.onnx")
    shutil.copy(shipped.tokenizer_path, work / "tokenizer.json")
    manifest = dataclasses.replace(
        shipped, directory=work, model_file="blockwise.onnx", tokenizer_file="tokenizer.json"
    )
    return NLIScorer(
        manifest,
        SessionSettings(intra_op_threads=threads),
        BatchSettings(max_batch=max(SIZES), max_batch_tokens=br.BIG),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("MEMGATE_HOME", "~/.cache/memgate")).expanduser(),
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slice", type=float, default=0.4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    pairs = br.Corpus(0).pairs(512, salt=3)
    scorers: dict[str, Any] = {}
    engines = []
    work = Path(tempfile.mkdtemp(prefix="memgate-routes-"))
    static = artefact_dir(args.cache_dir, "nli-deberta-v3-small", STATIC_VARIANT)
    for label, variant in ROUTES:
        if variant == "int8-static" and not (static / "manifest.json").is_file():
            print(f"{label}: not built in {args.cache_dir}, skipped")
            continue

        def build(variant: str = variant, label: str = label) -> Any:
            if variant == "blockwise":
                scorers[label] = blockwise_scorer(args.cache_dir, work, args.threads)
            else:
                scorers[label] = br.ort_nli(args.cache_dir, variant, args.threads, max(SIZES))
            return lambda items, _b, label=label: scorers[label].score(items)

        engines.append(br.load(label, "ort", build, pairs[: max(SIZES)]))

    def build_ce() -> Any:
        ce, _ = br.torch_cross_encoder(work, device="cpu")
        return br.careful_cross_encoder(ce, args.threads)

    engines.append(br.load(br.TORCH, "torch", build_ce, pairs[: max(SIZES)]))
    points = br.sweep(engines, pairs, SIZES, args.rounds, args.slice, "NLI routes")
    out: dict[str, Any] = {"load_at_end": os.getloadavg()}

    def fmt(r: dict[str, Any] | None) -> str:
        return f"{r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]" if r else "-"

    for name, by_size in points.items():
        for b in SIZES:
            p = by_size[b]
            vs_torch = br.round_ratios(p, points[br.TORCH][b])
            vs_shipped = br.round_ratios(p, points[SHIPPED][b])
            out[f"{name} batch {b}"] = {
                "pairs_per_s": p.rate,
                "rounds": p.rates,
                "vs_pytorch": vs_torch,
                "vs_shipped_int8": vs_shipped,
            }
            print(
                f"{name:<24} batch {b:>2}: {p.rate or 0:7.2f} pairs/s  "
                f"vs PyTorch {fmt(vs_torch)}  vs shipped int8 {fmt(vs_shipped)}"
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
