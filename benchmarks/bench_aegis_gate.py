"""aegis-nli in the gate: the served int8 graph against the graph as shipped, same run (issue 16's
"aegis gate facts/s at least 2x today's, at unchanged quality").

- ``int8``, what the gate serves now: row-invariant int8 (rowwise by default), symbolic
  sequence axis, relative positions narrowed to the padded length, batched;
- ``imported``, what it served when the issue was filed: the shipped graph, padded to 160
  tokens, per-tensor int8 activations, so ``row_invariant="auto"`` runs one pair per forward.

One store of N synthetic memories (bench_gate's corpus and ingest), the same M facts through
``Gate.triage`` (dry run) with each variant, interleaved rounds, the gate's memo caches warm
(both arms alike). It prints facts/s per round and the median ratio [min-max], and how many
decisions (action and target) the two variants share.

    python benchmarks/bench_aegis_gate.py --cache-dir $MEMGATE_HOME            # N = 1,000, M = 100
    python benchmarks/bench_aegis_gate.py --sizes 1000,10000 --facts 200 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from benchmarks import _common as common  # noqa: E402

VARIANTS = ("int8", "imported")


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench_gate import memgate_pass, one_namespace

    from engine.gate.gate import Gate
    from engine.runtime.loader import ModelChoice, load_models, resolve_nli
    from engine.runtime.nli import NLIScorer
    from engine.runtime.session import SessionSettings

    session = SessionSettings(intra_op_threads=args.threads)
    embedder, _ = load_models(args.cache_dir, ModelChoice(embedder_variant="fp32"), session)
    embedder.warmup()
    scorers = {}
    for variant in VARIANTS:
        choice = ModelChoice(nli="aegis-nli", nli_variant=variant)
        manifest = resolve_nli(args.cache_dir, choice, "cpu")
        scorers[variant] = NLIScorer(manifest, session)
        scorers[variant].warmup()
        print(
            f"  aegis-nli/{variant}: static length {manifest.static_length}, "
            f"{'one pair per forward' if scorers[variant].row_invariant else 'batched'}",
            flush=True,
        )
    corpus = common.Corpus(args.seed)
    out = []
    for n in (int(x) for x in args.sizes.split(",")):
        with one_namespace(embedder, scorers["int8"], corpus, n, args.facts) as (
            store,
            index,
            facts,
        ):
            gates = {v: Gate(store, index, embedder, s) for v, s in scorers.items()}
            decided = {}
            for v, gate in gates.items():  # warms the caches and records the decisions
                res = gate.triage(facts, "strict", apply=False)
                decided[v] = [(d.action, d.target_id) for d in res.decisions]
            rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for r, order in common.interleaved(list(VARIANTS), args.rounds):
                for v in order:
                    p = memgate_pass(gates[v], facts, args.batch)
                    rates[v].append(p.facts_per_s)
                    print(f"  N = {n:,} round {r + 1} {v}: {p.facts_per_s:.1f} facts/s", flush=True)
            same = sum(a == b for a, b in zip(decided["int8"], decided["imported"], strict=True))
            out.append(
                {
                    "memories": n,
                    "facts": len(facts),
                    "facts_per_s": {v: float(np.median(x)) for v, x in rates.items()},
                    "rounds": rates,
                    **common.ratio_stats(rates["int8"], rates["imported"]),
                    "same_decisions": same,
                }
            )
    return out


def draw(plt: Any, rows: list[dict[str, Any]]) -> Any:
    return common.paired_bars(
        plt,
        rows,
        VARIANTS,
        lambda r, v: r["facts_per_s"][v],
        ylabel="facts/s (median of rounds)",
        title="Gate facts/s: served aegis int8 vs the graph as shipped",
        label="aegis {}",
    )


def cells(r: dict[str, Any]) -> list[str]:
    return [
        f"{r['memories']:,}",
        f"{r['facts_per_s']['int8']:.1f}",
        f"{r['facts_per_s']['imported']:.1f}",
        f"{r['ratio']:.2f}x [{r['ratio_min']:.2f}-{r['ratio_max']:.2f}]",
        f"{r['same_decisions']} / {r['facts']}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    return common.ab_main(
        "bench_aegis_gate",
        __doc__ or "",
        argv,
        measure,
        smoke=("200", 10, 1),
        headers=["N", "int8 facts/s", "imported facts/s", "int8 / imported", "same decisions"],
        cells=cells,
        title=lambda payload, args: (
            f"{payload['machine']['cpu']}, {args.threads} threads, caches warm"
        ),
        draw=draw,
    )


if __name__ == "__main__":
    raise SystemExit(main())
