"""Gate quality on labelled cases: both policies, each available NLI model, and ablations.

For every configuration, ``engine.evaluate.predict`` runs each case in a fresh namespace (memories
stored as they are, the incoming fact triaged as a dry run) and the shared scorer
(``../shared/eval/score.py``) scores the predictions. The ablations switch off one step at a time
(event normalisation, attribute keys, lexical rules) and all of them together (the seed's rules),
so each step's effect is measured on the same cases in the same run.

    python benchmarks/bench_quality.py                    # dev set, all configurations
    python benchmarks/bench_quality.py --cases FILE.jsonl  # another labelled set
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import ROOT, add_common_args, pyplot, run_header, table, write_json  # noqa: E402

SHARED_EVAL = ROOT.parent / "shared" / "eval"

# name -> (policy, overrides). "seed" is the published rule: floor, threshold, most similar
# passing candidate, nothing else.
SEED = {
    "normalize": False,
    "keys": False,
    "lexical": False,
    "duplicate_similarity": 1.0,
    "dominance_margin": 0.5,
    "ambiguity_margin": 0.0,
    "key_ambiguity_margin": 0.0,
}
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "strict": ("strict", {}),
    "strict -normalize": ("strict", {"normalize": False}),
    "strict -keys": ("strict", {"keys": False}),
    "strict -lexical": ("strict", {"lexical": False}),
    "strict -normalize -keys": ("strict", {"normalize": False, "keys": False}),
    "strict seed rules": ("strict", SEED),
    "review": ("review", {}),
    "review scope=all": ("review", {"review_scope": "all"}),
    "review seed rules": ("review", {**SEED, "review_scope": "all"}),
}


def load_scorer(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("shared_eval_score", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load the scorer at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def category_recall(cases: list[dict[str, Any]], preds: list[dict[str, Any]]) -> dict[str, float]:
    """Correct replaces / expected replaces, per category."""
    hit: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    for case, pred in zip(cases, preds, strict=True):
        exp = case["expected"]
        if exp["action"] != "replace":
            continue
        total[case["category"]] += 1
        if pred["action"] == "replace" and pred["target"] == exp["target"]:
            hit[case["category"]] += 1
    return {cat: hit[cat] / n for cat, n in total.items()}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser)
    parser.add_argument("--cases", type=Path, default=SHARED_EVAL / "dev.jsonl")
    parser.add_argument("--scorer", type=Path, default=SHARED_EVAL / "score.py")
    parser.add_argument(
        "--configs", nargs="*", default=list(CONFIGS), help="subset of configurations"
    )
    parser.add_argument("--nli", nargs="*", default=["auto"], help="NLI artefacts to compare")
    parser.add_argument(
        "--limit", type=int, default=0, help="only the first N cases (plumbing checks)"
    )
    args = parser.parse_args()

    from engine.evaluate import load_cases, predict
    from engine.gate.gate import Gate
    from engine.gate.policy import policy_by_name
    from engine.index import IndexManager
    from engine.runtime.loader import ModelChoice, load_models
    from engine.runtime.session import SessionSettings
    from engine.store import SQLiteStore

    scorer = load_scorer(args.scorer)
    cases = load_cases(args.cases)
    if args.limit:
        cases = cases[: args.limit]
    labelled = all("expected" in c for c in cases)
    if not labelled:
        raise SystemExit(
            "bench_quality needs labelled cases (use `memgate eval` for unlabelled ones)"
        )
    payload = run_header("quality", args)
    results: list[dict[str, Any]] = []
    rows = []
    for nli_name in args.nli:
        embedder, nli = load_models(
            args.cache_dir,
            ModelChoice(nli=nli_name),
            SessionSettings(intra_op_threads=args.threads),
        )
        model = nli.manifest.describe()
        print(f"NLI: {model}", flush=True)
        for name in args.configs:
            policy_name, overrides = CONFIGS[name]
            policy = policy_by_name(policy_name).with_overrides(overrides)
            with tempfile.TemporaryDirectory() as tmp:
                store = SQLiteStore(Path(tmp) / "q.db")
                gate = Gate(store, IndexManager(store.iter_active_embeddings), embedder, nli)
                t0 = time.perf_counter()
                preds = [p for p, _ in predict(gate, cases, policy)]
                seconds = time.perf_counter() - t0
                store.close()
            m = scorer.score(cases, preds)
            rec = category_recall(cases, preds)
            wo = m["wrongful_overwrite_breakdown"]
            results.append(
                {
                    "config": name,
                    "nli": model,
                    "policy": policy_name,
                    "overrides": overrides,
                    "metrics": m,
                    "replace_recall_by_category": rec,
                    "seconds": seconds,
                }
            )
            rows.append(
                [
                    name,
                    nli.manifest.name,
                    m["wrongful_overwrites"],
                    wo["on_trap_cases"],
                    m["update_recall"],
                    rec.get("event_update", float("nan")),
                    rec.get("state_update", float("nan")),
                    m["duplicate_precision"],
                    m["review_rate"],
                    m["accuracy"],
                ]
            )
            print(
                f"  {name}: overwrites {m['wrongful_overwrites']}, recall {m['update_recall']:.3f} "
                f"({seconds:.1f}s)",
                flush=True,
            )
    headers = [
        "config",
        "nli",
        "overwrites",
        "on traps",
        "update rec",
        "event_upd rec",
        "state_upd rec",
        "dup prec",
        "review rate",
        "accuracy",
    ]
    print()
    cells = [
        [r[0], r[1], *[x if isinstance(x, int) else f"{float(x):.3f}" for x in r[2:]]] for r in rows
    ]
    print(table(headers, cells, title=f"gate quality on {args.cases.name} ({len(cases)} cases)"))
    payload["cases"] = str(args.cases)
    payload["results"] = results
    path = write_json(args.out, "quality", payload)
    print(f"\nJSON: {path}")
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
        labels = [f"{r[0]}\n{r[1]}" if len(args.nli) > 1 else r[0] for r in rows]
        ax[0].barh(labels, [r[2] for r in rows], color="#c0392b")
        ax[0].set_title("wrongful overwrites (lower is better)")
        ax[0].invert_yaxis()
        ax[1].barh(labels, [r[4] for r in rows], color="#2980b9", label="update recall")
        ax[1].barh(
            labels, [r[5] for r in rows], color="#8e44ad", alpha=0.5, label="event_update recall"
        )
        ax[1].set_xlim(0, 1)
        ax[1].set_title("update recall (higher is better)")
        ax[1].invert_yaxis()
        ax[1].legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        png = path.with_suffix(".png")
        fig.savefig(png, dpi=110)
        print(f"plot: {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
