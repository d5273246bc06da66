"""The gate's claim parser batched or not, in one process (issue 16: a fact's time outside NLI).

``identify`` hands every text a triage batch will weigh to ``claims.nlp.parse.many``, which
parses the ones not memoised yet in one spaCy ``nlp.pipe`` call. The other arm turns that call
into a no-op, so each text is parsed on its own when first read, as before. Same gate, store,
models and facts for both arms (bench_gate's corpus, one namespace of N memories, M facts in
batches of 100, dry run), interleaved rounds, the gate's memo caches cleared before each pass.

    python benchmarks/bench_parse.py --cache-dir $MEMGATE_HOME                 # N = 1,000
    python benchmarks/bench_parse.py --sizes 1000,10000 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from benchmarks import _common as common  # noqa: E402

ARMS = ("batched", "one by one")


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench_gate import memgate_pass, one_namespace
    from bench_gate_cost import cleared_passes, per_round

    from engine.gate.claims import nlp
    from engine.gate.gate import Gate
    from engine.runtime.loader import ModelChoice, load_models
    from engine.runtime.session import SessionSettings

    session = SessionSettings(intra_op_threads=args.threads)
    choice = ModelChoice(embedder_variant="fp32", nli="aegis-nli")
    embedder, scorer = load_models(args.cache_dir, choice, session)
    embedder.warmup()
    scorer.warmup()
    corpus = common.Corpus(args.seed)
    batched = nlp._Docs.many

    def one_by_one(self: Any, texts: Iterable[str]) -> int:
        return 0

    def parser_off(run: Callable[[], Any]) -> Any:
        """``run()`` with the batch parse a no-op: each text parsed on its own when read."""
        nlp._Docs.many = one_by_one  # type: ignore[method-assign]
        try:
            return run()
        finally:
            nlp._Docs.many = batched  # type: ignore[method-assign]

    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        with one_namespace(embedder, scorer, corpus, n, args.facts) as (store, index, facts):
            gate = Gate(store, index, embedder, scorer)
            memgate_pass(gate, facts, args.batch)  # indexes loaded, models warm
            run = partial(memgate_pass, gate, facts, args.batch)
            passes = cleared_passes(
                {"batched": run, "one by one": partial(parser_off, run)},
                args.rounds,
                f"N = {n:,}",
                "identify",
            )
            per_fact, identify = per_round(passes), per_round(passes, "identify")
            decisions = {a: sorted(ps[0].actions.items()) for a, ps in passes.items()}
            rows.append(
                {
                    "memories": n,
                    "facts": len(facts),
                    "ms_per_fact": {a: float(np.median(v)) for a, v in per_fact.items()},
                    "identify_ms_per_fact": {a: float(np.median(v)) for a, v in identify.items()},
                    "rounds_ms_per_fact": per_fact,
                    **common.ratio_stats(per_fact["one by one"], per_fact["batched"], "speedup"),
                    "same_actions": decisions["batched"] == decisions["one by one"],
                }
            )
    return rows


def draw(plt: Any, rows: list[dict[str, Any]]) -> Any:
    return common.paired_bars(
        plt,
        rows,
        ARMS,
        lambda r, arm: r["ms_per_fact"][arm],
        ylabel="ms per fact, caches cleared (median of rounds)",
        title="Gate time per fact: claims parsed in one batch or one by one",
        label="parser {}",
    )


def cells(r: dict[str, Any]) -> list[str]:
    return [
        f"{r['memories']:,}",
        f"{r['ms_per_fact']['batched']:.1f}",
        f"{r['ms_per_fact']['one by one']:.1f}",
        f"{r['identify_ms_per_fact']['batched']:.1f} / "
        f"{r['identify_ms_per_fact']['one by one']:.1f}",
        f"{r['speedup']:.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}]",
        "yes" if r["same_actions"] else "NO",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    return common.ab_main(
        "bench_parse",
        __doc__ or "",
        argv,
        measure,
        smoke=("200", 20, 1),
        headers=["N", "batched ms/fact", "one by one ms/fact", "identify b / 1", "speedup", "same"],
        cells=cells,
        title=lambda payload, args: (
            f"{payload['machine']['cpu']}, {args.threads} threads, aegis int8"
        ),
        draw=draw,
    )


if __name__ == "__main__":
    raise SystemExit(main())
