"""What narrowing DeBERTa's relative-position attention buys (issue 16): each NLI artefact in the
cache against the same graph widened back to the full ``2 x 256`` position rows (the graph the
pipeline published before ``engine.pipeline.span``), in one process, interleaved rounds.

The pairs are a labelled set's (memory, fact) pairs (``benchmarks/data/heldout.jsonl``;
synthetic ones when it is absent), length-sorted and cut into batches of 1, 8 and 32, each
padded to its own longest: the engine's batching. Both arms score the same batches; the logits
must agree (printed: max |delta|), and each point is the median of the per-round ratios
[min-max].

    python benchmarks/bench_span.py --cache-dir $MEMGATE_HOME           # 5 rounds of 0.6 s
    python benchmarks/bench_span.py --quick                             # 3 rounds of 0.4 s
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from benchmarks._common import (  # noqa: E402
    add_common_args,
    interleaved,
    ratio_stats,
    run_header,
    save_results,
    table,
)
from engine.pipeline.span import PREFIX  # noqa: E402

MODELS = (("aegis-nli", "int8"), ("nli-deberta-v3-small", "int8"), ("nli-deberta-v3-small", "fp32"))
SIZES = (1, 8, 32)
DEV = Path(__file__).resolve().parents[1] / "data" / "heldout.jsonl"


def widen(model_in: Path, model_out: Path) -> int:
    """The inverse of ``engine.pipeline.span.narrow_relative_span``: every node it added is
    removed and its consumers read the tensors it read. Returns how many products it widened."""
    import onnx

    model = onnx.load(str(model_in))
    g = model.graph
    alias = {}
    for node in g.node:
        if node.output[0].startswith(PREFIX) and node.op_type in ("Slice", "Sub"):
            if not node.input[0].startswith(PREFIX):
                alias[node.output[0]] = node.input[0]
        elif node.op_type == "Sub" and node.input[1].startswith(PREFIX):
            # engine.pipeline.trim shifts its own [L, L] index by the span's start
            alias[node.output[0]] = node.input[0]
    keep = [n for n in g.node if not n.output[0].startswith(PREFIX) and n.output[0] not in alias]
    for node in keep:
        for i, name in enumerate(node.input):
            node.input[i] = alias.get(name, name)
    del g.node[:]
    g.node.extend(keep)
    inits = [i for i in g.initializer if not i.name.startswith(PREFIX)]
    del g.initializer[:]
    g.initializer.extend(inits)
    onnx.save(model, str(model_out))
    return sum(1 for k in alias if k.endswith("/rows"))


def dev_pairs(limit: int) -> list[tuple[str, str]]:
    if DEV.is_file():
        pairs = []
        for line in DEV.read_text(encoding="utf-8").splitlines():
            if line.strip():
                case = json.loads(line)
                pairs += [(m["text"], case["incoming"]) for m in case["memories"]]
        return pairs[:limit]
    from benchmarks.bench_runtime import Corpus

    return Corpus(0).pairs(limit, salt=3)


def batches(manifest: Any, pairs: Sequence[tuple[str, str]], size: int) -> list[Any]:
    """``pairs`` tokenised as the runtime does (truncated at the model's max length), sorted by
    length and cut into padded batches of ``size``."""
    from engine.pipeline import checks

    pad = int(manifest.extra.get("pad_id", 0))
    return checks.encode(
        manifest.tokenizer_path, pairs, max_length=manifest.max_length, pad_id=pad, batch_size=size
    )


def rate(model: Any, feeds: Sequence[dict[str, np.ndarray]], slice_s: float, start: int) -> float:
    """Pairs per second over ``slice_s``, running ``feeds`` in turn from ``start``."""
    done, t0, i = 0, time.perf_counter(), start
    while True:
        f = feeds[i % len(feeds)]
        model.run(f)
        done += len(f["input_ids"])
        i += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= slice_s:
            return done / elapsed


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from engine.runtime.manifest import load_manifest
    from engine.runtime.session import OrtModel, SessionSettings

    rounds, slice_s = (1, 0.05) if args.smoke else (3, 0.4) if args.quick else (5, 0.6)
    rounds, slice_s = args.rounds or rounds, args.slice or slice_s
    pairs = dev_pairs(64 if args.smoke else 512)
    settings = SessionSettings(intra_op_threads=args.threads)
    work = Path(tempfile.mkdtemp(prefix="memgate-span-"))
    out: dict[str, Any] = {}
    for name, variant in MODELS:
        directory = args.cache_dir / "models" / name / variant
        if not (directory / "manifest.json").is_file():
            print(f"  {name}/{variant}: not built, skipped")
            continue
        manifest = load_manifest(directory)
        wide_path = work / f"{name}-{variant}-wide.onnx"
        widened = widen(manifest.model_path, wide_path)
        if not widened:
            print(f"  {name}/{variant}: not narrowed (built before the span rewrite), skipped")
            continue
        arms = {
            "narrowed": OrtModel(manifest.model_path, settings),
            "wide": OrtModel(wide_path, settings),
        }
        feeds = {}
        shuffle = np.random.default_rng(args.seed)
        for size in SIZES:
            # batches are length-sorted inside; their order is shuffled, so that the part of
            # them a slice gets through is a fair sample of the lengths
            made = batches(manifest, pairs, size)
            feeds[size] = [
                {k: made[j].feeds[k] for k in arms["wide"].input_names}
                for j in shuffle.permutation(len(made))
            ]
        check = feeds[32]
        diff = max(
            float(np.abs(arms["narrowed"].run(f)[0] - arms["wide"].run(f)[0]).max()) for f in check
        )
        tokens = float(np.mean([f["input_ids"].shape[1] for f in feeds[32]]))
        points = {}
        for size in SIZES:
            rates: dict[str, list[float]] = {"narrowed": [], "wide": []}
            for r, order in interleaved(list(arms), rounds):
                start = r * len(feeds[size]) // rounds  # both arms start at the same batch
                for arm in order:
                    rates[arm].append(rate(arms[arm], feeds[size], slice_s, start))
            points[size] = {
                "narrowed_pairs_s": float(np.median(rates["narrowed"])),
                "wide_pairs_s": float(np.median(rates["wide"])),
                **ratio_stats(rates["narrowed"], rates["wide"]),
            }
            print(
                f"  {name}/{variant} batch {size}: {points[size]['ratio']:.2f}x "
                f"[{points[size]['ratio_min']:.2f}-{points[size]['ratio_max']:.2f}]",
                flush=True,
            )
        out[f"{name}/{variant}"] = {
            "products_narrowed": widened,
            "max_abs_logit_diff": diff,
            "mean_padded_tokens_batch32": round(tokens, 1),
            "pairs": len(pairs),
            "points": points,
        }
        del arms
    return {"rounds": rounds, "slice_s": slice_s, "models": out}


def draw(plt: Any, models: dict[str, Any]) -> Any:
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(models))
    for k, (label, m) in enumerate(models.items()):
        xs = [i + k * width for i in range(len(SIZES))]
        pts = [m["points"][s] for s in SIZES]
        ys = [p["ratio"] for p in pts]
        low = [y - p["ratio_min"] for y, p in zip(ys, pts, strict=True)]
        high = [p["ratio_max"] - y for y, p in zip(ys, pts, strict=True)]
        ax.bar(xs, ys, width, yerr=[low, high], capsize=3, label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([i + width * (len(models) - 1) / 2 for i in range(len(SIZES))])
    ax.set_xticklabels([f"batch {s}" for s in SIZES])
    ax.set_ylabel("narrowed / wide pairs/s (median, min-max)")
    ax.set_title("Relative-position attention narrowed to the padded length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser)
    parser.add_argument("--rounds", type=int, default=0, help="interleaved rounds per point")
    parser.add_argument("--slice", type=float, default=0.0, help="seconds per arm per round")
    args = parser.parse_args(argv)
    payload = run_header("bench_span", args)
    payload.update(measure(args))
    rows = []
    for label, m in payload["models"].items():
        for size, p in m["points"].items():
            rows.append(
                [
                    label,
                    size,
                    f"{p['wide_pairs_s']:.1f}",
                    f"{p['narrowed_pairs_s']:.1f}",
                    f"{p['ratio']:.2f}x [{p['ratio_min']:.2f}-{p['ratio_max']:.2f}]",
                    f"{m['max_abs_logit_diff']:.1e}",
                ]
            )
    print(
        table(
            ["model", "batch", "wide pairs/s", "narrowed pairs/s", "ratio", "max |d logit|"],
            rows,
            title=f"{payload['machine']['cpu']}, {payload['rounds']} rounds of "
            f"{payload['slice_s']} s, dev pairs",
        )
    )
    if payload["models"]:
        save_results(args.out, "bench_span", payload, lambda plt: draw(plt, payload["models"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
