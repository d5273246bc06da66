"""What the judge costs a fact, in one process: the gate with it and without it.

The same store, models and facts for both arms (bench_gate's corpus, one namespace of N
memories, M facts in batches of 100, ``--policy`` strict or review, dry run), interleaved
rounds, the gate's memo caches cleared before each pass (so both arms pay the parser). The
judge is the one fitted for the served models (``memgate models judge``); its features need
the claims of the judged candidates and one walk down one set of its trees per fact (the update
trees for a rule's replacement, which may be held back, and for a conflict review queues, which
may be stored instead; both sets for a rule's add under review, which may be skipped or
queued), inside the ``decide`` phase.

    python benchmarks/bench_judge.py --cache-dir $MEMGATE_HOME                 # N = 1,000
    python benchmarks/bench_judge.py --sizes 1000,10000 --rounds 3
    python benchmarks/bench_judge.py --sizes 1000 --rounds 3 --policy review
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from benchmarks import _common as common  # noqa: E402

ARMS = ("rule alone", "rule + judge")


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench_gate import memgate_pass, one_namespace
    from bench_gate_cost import cleared_passes, per_round

    from engine.gate.gate import Gate
    from engine.gate.judge.store import find_judge
    from engine.runtime.loader import ModelChoice, load_models
    from engine.runtime.session import SessionSettings

    session = SessionSettings(intra_op_threads=args.threads)
    choice = ModelChoice(embedder_variant="fp32", nli="aegis-nli")
    embedder, scorer = load_models(args.cache_dir, choice, session)
    embedder.warmup()
    scorer.warmup()
    judge = find_judge(args.cache_dir, embedder, scorer)
    if judge is None:
        raise SystemExit(
            f"no duplicate judge for these models in {args.cache_dir}: run "
            "`memgate models judge` first"
        )
    corpus = common.Corpus(args.seed)
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        with one_namespace(embedder, scorer, corpus, n, args.facts) as (store, index, facts):
            gates = {
                "rule alone": Gate(store, index, embedder, scorer),
                "rule + judge": Gate(store, index, embedder, scorer, judge=judge),
            }
            memgate_pass(gates["rule alone"], facts, args.batch)  # indexes loaded, models warm
            passes = cleared_passes(
                {
                    arm: partial(memgate_pass, gates[arm], facts, args.batch, args.policy)
                    for arm in ARMS
                },
                args.rounds,
                f"N = {n:,}",
                "decide",
            )
            per_fact, decide = per_round(passes), per_round(passes, "decide")
            actions = {a: dict(sorted(ps[0].actions.items())) for a, ps in passes.items()}
            rows.append(
                {
                    "memories": n,
                    "policy": args.policy,
                    "facts": len(facts),
                    "ms_per_fact": {a: float(np.median(v)) for a, v in per_fact.items()},
                    "decide_ms_per_fact": {a: float(np.median(v)) for a, v in decide.items()},
                    "rounds_ms_per_fact": per_fact,
                    **common.ratio_stats(per_fact["rule + judge"], per_fact["rule alone"], "cost"),
                    "actions": actions,
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
        title="Gate time per fact: the rule alone and with the judge",
        label="{}",
    )


def cells(r: dict[str, Any]) -> list[str]:
    skips = {a: r["actions"][a].get("skip", 0) for a in ARMS}
    return [
        f"{r['memories']:,}",
        f"{r['ms_per_fact']['rule alone']:.1f}",
        f"{r['ms_per_fact']['rule + judge']:.1f}",
        f"{r['decide_ms_per_fact']['rule alone']:.2f} / "
        f"{r['decide_ms_per_fact']['rule + judge']:.2f}",
        f"{r['cost']:.2f}x [{r['cost_min']:.2f}-{r['cost_max']:.2f}]",
        f"{skips['rule alone']} / {skips['rule + judge']}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    return common.ab_main(
        "bench_judge",
        __doc__ or "",
        argv,
        measure,
        smoke=("200", 20, 1),
        headers=["N", "rule ms/fact", "+judge ms/fact", "decide r / +j", "cost", "skips r / +j"],
        cells=cells,
        title=lambda payload, args: (
            f"{payload['machine']['cpu']}, {args.threads} threads, aegis int8, {args.policy}"
        ),
        draw=draw,
        extra_args=lambda parser: parser.add_argument(
            "--policy", choices=("strict", "review"), default="strict", help="named policy"
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
