"""aegis-nli's int8 routes against the same weights in fp32: how far each moves the contradiction
probability on the pairs of real quality sets, and how many decisions it flips at the policy
bars (0.5, 0.8, 0.95). One pair per forward, so batch-mates play no part.

Arms: the served ``int8`` (rowwise unless built otherwise), ``blockwise`` (built here from the
imported graph by the pipeline's own rewrite), and ``imported`` (the graph as the package ships
it, padded to its static length, per-tensor activation scales). The reference is the imported
int8 weights dequantised to fp32 at dynamic length (the package has no fp32 graph).

    python benchmarks/int8_drift.py --cache-dir $MEMGATE_HOME
    python benchmarks/int8_drift.py --sets ../shared/eval/dev.jsonl,benchmarks/data/heldout.jsonl

Prints one row per (set, arm); writes a JSON and a plot of mean |Δp| per arm and set.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np  # noqa: E402
from _common import ROOT, add_common_args, run_header, save_results, table  # noqa: E402

DEFAULT_SETS = (
    f"{ROOT.parent / 'shared' / 'eval' / 'dev.jsonl'},{ROOT / 'benchmarks/data/heldout.jsonl'}"
)


def drift_row(got: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    """Max and mean |got - ref| and the decision flips at the policy bars (the build's
    ``decision_flips``, the same count the int8-static manifest records)."""
    from engine.pipeline.static import decision_flips

    d = np.abs(got - ref)
    return {
        "max_abs": float(d.max()),
        "mean_abs": float(d.mean()),
        "flips": decision_flips(got, ref),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser)
    parser.add_argument("--sets", default=DEFAULT_SETS, help="quality sets, comma-separated")
    parser.add_argument("--model", default="aegis-nli", help="an imported int8 NLI artefact")
    args = parser.parse_args()
    header = run_header("int8_drift", args)

    from engine.pipeline import checks, graph
    from engine.pipeline.static import STATIC_THRESHOLDS as BARS
    from engine.pipeline.static import _eval_pairs, _softmax
    from engine.runtime.layout import artefact_dir
    from engine.runtime.manifest import load_manifest
    from engine.runtime.session import OrtModel, SessionSettings

    imported = load_manifest(artefact_dir(args.cache_dir, args.model, "imported"))
    served = load_manifest(artefact_dir(args.cache_dir, args.model, "int8"))
    work = Path(tempfile.mkdtemp(prefix="memgate-drift-"))
    print("building the fp32 reference and the blockwise graph from the imported weights")
    graph.dequantize(imported.model_path, work / "fp32.onnx", dynamic_length=True)
    graph.blockwise_int8(imported.model_path, work / "blockwise.onnx", dynamic_length=True)
    method = str((served.extra.get("quantization") or {}).get("method", "?"))
    arms: dict[str, tuple[Path, int | None]] = {
        "fp32": (work / "fp32.onnx", None),
        f"int8 (served, {method})": (served.model_path, None),
        "blockwise": (work / "blockwise.onnx", None),
        "imported (as shipped)": (imported.model_path, imported.static_length),
    }
    sessions = {
        k: OrtModel(p, SessionSettings(intra_op_threads=args.threads)) for k, (p, _) in arms.items()
    }
    tok, pad = served.tokenizer_path, int(served.extra.get("pad_id", 0))
    c = served.labels.index("contradiction")
    out: dict[str, dict[str, Any]] = {}
    rows = []
    for name in [Path(x) for x in args.sets.split(",") if x]:
        pairs = _eval_pairs(name)
        probs: dict[str, np.ndarray] = {}
        encoded = {
            static: checks.encode(
                tok,
                pairs,
                max_length=served.max_length,
                pad_id=pad,
                batch_size=1,
                static_length=static,
            )
            for static in {s for _, s in arms.values()}
        }
        for k, (_, static) in arms.items():
            print(f"  {name.name}: {k}, {len(pairs)} pairs", flush=True)
            batches = encoded[static]
            logits = checks.gather(batches, lambda f, k=k: sessions[k].run(f)[0].astype(np.float64))
            probs[k] = _softmax(logits)[:, c]
        out[name.name] = {"pairs": len(pairs)}
        for k, p in probs.items():
            if k == "fp32":
                continue
            r = drift_row(p, probs["fp32"])
            out[name.name][k] = r
            flips = " / ".join(str(v) for v in r["flips"].values())
            rows.append(
                [name.name, len(pairs), k, f"{r['max_abs']:.3f}", f"{r['mean_abs']:.4f}", flips]
            )
    print()
    print(
        table(
            [
                "set",
                "pairs",
                "arm",
                "max |Δp|",
                "mean |Δp|",
                "flips at " + " / ".join(map(str, BARS)),
            ],
            rows,
            title=f"{args.model}: contradiction probability against its weights in fp32",
        )
    )

    def draw(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(8, 4))
        sets = list(out)
        names = [k for k in arms if k != "fp32"]
        width = 0.8 / len(names)
        for i, k in enumerate(names):
            xs = [j + i * width for j in range(len(sets))]
            ax.bar(xs, [out[s][k]["mean_abs"] for s in sets], width, label=k)
        ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(sets))], sets)
        ax.set_yscale("log")
        ax.set_ylabel("mean |Δ contradiction prob| vs fp32")
        ax.set_title(f"{args.model} int8 routes, one pair per forward")
        ax.legend()
        fig.tight_layout()
        return fig

    save_results(args.out, "int8_drift", {**header, "bars": list(BARS), "sets": out}, draw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
