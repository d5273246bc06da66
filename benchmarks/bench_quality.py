"""Gate quality on labelled sets side by side: dev, heldout, heldout-2 to -16, per policy.

For every configuration and every set, each case runs in its own namespace (memories stored as
they are, the incoming fact triaged as a dry run: ``engine.tuning.evaluate``, what ``memgate eval``
runs) and the project's scorer (``engine.tuning.scoring``, the metrics of the shared eval README)
scores the predictions. The ablations switch off one step at a time (event normalisation,
attribute keys, lexical rules) and all of them together (the seed's rules).

Fitted settings (``--fit``): ``memgate calibrate``'s sweep, choice and k-fold cross-validation
on the first set (the one the thresholds may be tuned on), then the chosen setting on every
other set. The CV estimate is reported beside the held-out figures, so the optimism of the
in-sample figures shows.

    python benchmarks/bench_quality.py                     # heldout (+ heldout-2 to -16)
    python benchmarks/bench_quality.py --cases FILE.jsonl  # another first set
    python benchmarks/bench_quality.py --sets none         # the first set only
    python benchmarks/bench_quality.py --fit none          # no fitted setting

``--scorer PATH`` (the shared ``score.py``; the suite passes it) re-scores every run with that
script too and stops if any figure differs from the project's scorer.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import ROOT, add_common_args, pyplot, run_header, table, write_json  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
HELDOUT_SETS = {
    "heldout": DATA / "heldout.jsonl",
    **{f"heldout-{n}": DATA / f"heldout{n}.jsonl" for n in range(2, 25)},
}

# name -> (policy, overrides). "seed" is the published rule: floor, threshold, most similar
# passing candidate, nothing else.
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "seed": ("seed", {}),
    "strict": ("strict", {}),
    "strict -judge": ("strict", {"judge": False}),
    "strict -lexical": ("strict", {"lexical": False}),
    "review": ("review", {}),
    "review -judge": ("review", {"judge": False}),
    "review scope=all": ("review", {"review_scope": "all"}),
    "seed-review": ("seed-review", {}),
}
"""``seed`` / ``seed-review`` are the named policies of the seed's plain rule (every mechanism
off, :data:`engine.gate.policy.SEED`)."""
GROUP_CONFIGS = ("seed", "strict", "seed-review", "review")
"""The side-by-side table per set group (issue 31, item 6): the seed's rule beside strict, and
its review variant beside review."""


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


def _sets(args: argparse.Namespace) -> tuple[list[tuple[str, Path]], list[str]]:
    """(name, path) of every set to run, the first being --cases; and the skip lines."""
    first = "dev" if args.cases.name == "dev.jsonl" else args.cases.stem
    sets = [(first, args.cases)]
    skipped = []
    wanted = [] if args.sets == ["none"] else args.sets
    for name in wanted:
        path = HELDOUT_SETS.get(name, Path(name))
        label = name if name in HELDOUT_SETS else path.stem
        if path.resolve() == args.cases.resolve():
            continue
        if not path.is_file():
            skipped.append(f"{label} skipped: {path} does not exist (not in this checkout yet)")
            continue
        sets.append((label, path))
    return sets, skipped


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _traps(m: dict[str, Any]) -> int:
    return int(m["wrongful_overwrite_breakdown"]["on_trap_cases"])


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "-" if x != x else f"{x:.3f}"
    return str(x)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser)
    parser.add_argument(
        "--cases", type=Path, default=DATA / "heldout.jsonl", help="first set (default: heldout)"
    )
    parser.add_argument(
        "--sets",
        nargs="*",
        default=list(HELDOUT_SETS),
        help="more labelled sets: heldout, heldout-2, heldout-3 or paths (none: first set only)",
    )
    parser.add_argument(
        "--outside",
        nargs="*",
        type=Path,
        default=[],
        help="outside sets (public data, labelled by the datasets' own annotations): run "
        "besides --cases and --sets, and summed as their own group",
    )
    parser.add_argument(
        "--memo",
        nargs="*",
        type=Path,
        default=[],
        help="pickles of model scores written by benchmarks/ablate.py --memo (read only): "
        "pairs and texts found there are not scored again",
    )
    parser.add_argument("--scorer", type=Path, help="another score.py to cross-check against")
    parser.add_argument(
        "--configs", nargs="*", default=list(CONFIGS), help="subset of configurations"
    )
    parser.add_argument("--nli", nargs="*", default=["auto"], help="NLI artefacts to compare")
    parser.add_argument(
        "--fit",
        nargs="*",
        default=["strict"],
        help="policies to fit on the first set with memgate calibrate's default grid, "
        "choice and CV (none: no fitted setting)",
    )
    parser.add_argument("--folds", type=int, default=5, help="CV folds of a fitted setting")
    parser.add_argument(
        "--limit", type=int, default=0, help="only the first N cases of each set (plumbing)"
    )
    args = parser.parse_args()

    from engine.gate.gate import Gate
    from engine.gate.judge.store import find_judge
    from engine.index import IndexManager
    from engine.runtime.loader import ModelChoice, load_models
    from engine.runtime.session import SessionSettings
    from engine.store import SQLiteStore
    from engine.tuning.calibrate import (
        MemoEmbedder,
        MemoNLI,
        choose,
        cross_validate,
        objective_for,
        parse_grid,
        summary,
        sweep,
    )
    from engine.tuning.evaluate import decide_cases, is_labelled, load_cases, reach, stage
    from engine.tuning.scoring import REACH_STEPS, review_measures, score

    shared = load_scorer(args.scorer) if args.scorer else None
    sets, skipped = _sets(args)
    outside = {path.stem for path in args.outside}
    sets += [(path.stem, path) for path in args.outside]
    data: dict[str, list[dict[str, Any]]] = {}
    for name, path in sets:
        cases = load_cases(path)
        if args.limit:
            cases = cases[: args.limit]
        if not is_labelled(cases):
            raise SystemExit(f"bench_quality needs labelled cases; {path} has unlabelled ones")
        data[name] = cases
    for line in skipped:
        print(line, flush=True)
    fits = [] if args.fit == ["none"] else args.fit
    payload = run_header("quality", args)
    payload["cases"] = str(args.cases)
    payload["sets"] = {
        name: {"path": str(path), "sha256": _sha256(path), "cases": len(data[name])}
        for name, path in sets
    }
    payload["skipped"] = skipped
    results: list[dict[str, Any]] = []
    judge_seen: set[str] = set()  # sets a judge of this run was fitted on: reported apart
    preds_of: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    fitted: list[dict[str, Any]] = []
    first = sets[0][0]

    def record(
        config: str, set_name: str, policy: str, overrides: dict[str, Any], preds: list[Any]
    ) -> dict[str, Any]:
        cases = data[set_name]
        preds_of[(config, model, set_name)] = list(preds)
        m = score(cases, preds)
        if shared is not None:
            theirs = shared.score(cases, preds)
            if json.dumps(m, sort_keys=True) != json.dumps(theirs, sort_keys=True):
                raise SystemExit(
                    f"{config} on {set_name}: engine.tuning.scoring differs from score.py"
                )
        return {
            "config": config if set_name == first else f"{config} @{set_name}",
            "name": config,
            "set": set_name,
            "nli": model,
            "policy": policy,
            "overrides": overrides,
            "metrics": m,
            "review_measures": review_measures(cases, preds),
            "replace_recall_by_category": category_recall(cases, preds),
        }

    with tempfile.TemporaryDirectory() as tmp:
        for nli_name in args.nli:
            embedder, nli = load_models(
                args.cache_dir,
                ModelChoice(nli=nli_name),
                SessionSettings(intra_op_threads=args.threads),
            )
            model = nli.manifest.describe()
            judge = find_judge(args.cache_dir, embedder, nli)
            print(
                f"NLI: {model}; {judge.describe() if judge else 'no duplicate judge'}", flush=True
            )
            seen = judge_sets(judge, payload["sets"])
            if seen & outside:
                raise SystemExit(f"the judge was fitted on outside sets: {sorted(seen & outside)}")
            judge_seen.update(seen)
            store = SQLiteStore(Path(tmp) / f"q-{len(results)}.db")
            gate = Gate(
                store,
                IndexManager(store.iter_active_embeddings),
                *_memoised(embedder, nli, args.memo),
                judge=judge,
            )
            staged = {n: stage(gate, data[n], prefix=f"set{i}") for i, (n, _) in enumerate(sets)}
            for config in args.configs:
                policy_name, overrides = CONFIGS[config]
                policy = gate.policy(
                    policy_name, overrides
                )  # the models' settings, the judge's bars
                for set_name, _ in sets:
                    t0 = time.perf_counter()
                    rows = decide_cases(gate, staged[set_name], policy)
                    rec = record(config, set_name, policy_name, overrides, [p for p, _ in rows])
                    rec["update_reach"] = reach(staged[set_name], rows, policy)
                    rec["seconds"] = time.perf_counter() - t0
                    results.append(rec)
                    m = rec["metrics"]
                    print(
                        f"  {config} on {set_name}: overwrites {m['wrongful_overwrites']}, "
                        f"recall {m['update_recall']:.3f} (within the models' reach "
                        f"{rec['update_reach']['target_within_reach']:.3f}), "
                        f"accuracy {m['accuracy']:.3f} ({rec['seconds']:.1f}s)",
                        flush=True,
                    )
            for policy_name in fits:
                base = gate.policy(policy_name)
                grid = parse_grid([], base)
                memo = Gate(
                    gate.store, gate.index, MemoEmbedder(embedder), MemoNLI(nli), judge=judge
                )
                t0 = time.perf_counter()
                swept = sweep(memo, data[first], base, grid)
                goal = objective_for(base)
                picked = choose(grid, swept.trials, data[first], 0, objective=goal)
                if picked is None:
                    print(f"  {policy_name} fitted: no setting without wrongful overwrites")
                    continue
                setting = swept.trials[picked].setting
                cv = cross_validate(grid, swept.trials, data[first], 0, args.folds, 0, goal)
                config = f"{policy_name} fitted"
                overrides = dict(setting)
                policy = base.with_overrides(overrides)
                recs = [
                    record(
                        config,
                        first,
                        policy_name,
                        overrides,
                        list(swept.trials[picked].predictions),
                    )
                ]
                for set_name, _ in sets[1:]:
                    preds = [p for p, _ in decide_cases(gate, staged[set_name], policy)]
                    recs.append(record(config, set_name, policy_name, overrides, preds))
                for rec in recs:
                    rec["fitted_on"] = first
                    rec["seconds"] = time.perf_counter() - t0
                results += recs
                fitted.append(
                    {
                        "policy": policy_name,
                        "nli": model,
                        "fitted_on": first,
                        "grid": grid.to_json(),
                        "setting": setting,
                        "in_sample": summary(data[first], list(swept.trials[picked].predictions)),
                        "cv": {
                            "k": cv.k,
                            "seed": cv.seed,
                            "estimate": cv.estimate,
                            "folds": cv.folds,
                        },
                        "model_work": swept.model_work,
                    }
                )
                print(
                    f"  {config} on {first}: {setting}; CV estimate overwrites "
                    f"{cv.estimate['wrongful_overwrites']}, recall "
                    f"{cv.estimate['update_recall']:.3f}",
                    flush=True,
                )
            store.close()

    # One row per configuration, the sets side by side; a fitted row carries its CV estimate.
    names = [s for s, _ in sets]
    by: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in results:
        by[(r["name"], r["nli"])][r["set"]] = r["metrics"]
    cv_of = {(f"{f['policy']} fitted", f["nli"]): f["cv"]["estimate"] for f in fitted}
    headers = ["config", "nli"]
    for s in names:
        headers += [f"{s} overwr (traps)", f"{s} upd rec", f"{s} acc"]
        if s == first and cv_of:
            headers += [f"{first} CV overwr", f"{first} CV rec", f"{first} CV acc"]
    rows = []
    for (config, nli_desc), per_set in by.items():
        row = [config, nli_desc.split(" ")[0]]
        for s in names:
            m = per_set.get(s)
            row += (
                [
                    f"{m['wrongful_overwrites']} ({_traps(m)})",
                    _fmt(m["update_recall"]),
                    _fmt(m["accuracy"]),
                ]
                if m
                else ["-", "-", "-"]
            )
            if s == first and cv_of:
                est = cv_of.get((config, nli_desc))
                row += (
                    [
                        str(est["wrongful_overwrites"]),
                        _fmt(est["update_recall"]),
                        _fmt(est["accuracy"]),
                    ]
                    if est
                    else ["", "", ""]
                )
        rows.append(row)
    print()
    sizes = ", ".join(f"{s} {len(data[s])}" for s in names)
    print(table(headers, rows, title=f"gate quality side by side (cases: {sizes})"))
    for line in skipped:
        print(line)
    reach_rows = [
        [
            r["config"],
            *(_fmt(r["update_reach"][k]) for k in REACH_STEPS),
            _fmt(r["metrics"]["update_recall"]),
            _fmt(r["review_measures"]["updates_queued_right_target"]),
        ]
        for r in results
        if "update_reach" in r
    ]
    if reach_rows:
        print()
        print(
            table(
                [
                    "config",
                    "target recalled",
                    "above floor",
                    "scored",
                    "contradicted > bar",
                    "plain rule",
                    "within reach",
                    "gate recall",
                    "queued right",
                ],
                reach_rows,
                title="what the models leave the rules: shares of the true updates "
                "(engine.tuning.scoring.update_reach)",
            )
        )
    review_rows = [
        [
            r["config"],
            r["review_measures"]["wrongful_overwrites"],
            _fmt(r["review_measures"]["updates_queued_right_target"]),
            _fmt(r["review_measures"]["adds_skips_queued"]),
        ]
        for r in results
        if r["policy"] == "review"
    ]
    if review_rows:
        print()
        print(
            table(
                [
                    "config",
                    "wrongful overwrites",
                    "updates queued, right target",
                    "adds+skips queued",
                ],
                review_rows,
                title="review policy measures (issue 12, item 5)",
            )
        )
    groups = _group_table(data, preds_of, outside, judge_seen)
    payload["groups"] = groups
    payload["judge_fitted_on"] = sorted(judge_seen)
    for f in fitted:
        print(
            f"\n{f['policy']} fitted on {f['fitted_on']}: {f['setting']}; in sample "
            f"{f['in_sample']['wrongful_overwrites']} overwrites / recall "
            f"{f['in_sample']['update_recall']:.3f}; {f['cv']['k']}-fold CV estimate "
            f"{f['cv']['estimate']['wrongful_overwrites']} / "
            f"{f['cv']['estimate']['update_recall']:.3f}"
        )
    payload["results"] = results
    payload["fitted"] = fitted
    path = write_json(args.out, "quality", payload)
    print(f"\nJSON: {path}")
    plt = pyplot()
    if plt is not None:
        png = path.with_suffix(".png")
        _plot(plt, by, names, cv_of, first, png)
        print(f"plot: {png}")
    return 0


def _memoised(embedder: Any, nli: Any, memos: list[Path]) -> tuple[Any, Any]:
    """The models behind ``engine.tuning.calibrate``'s memos: every configuration scores a pair (and
    embeds a text) once; pickles from ``benchmarks/ablate.py --memo`` for these models seed
    them."""
    import pickle

    from engine.tuning.calibrate import MemoEmbedder, MemoNLI

    emb, model = MemoEmbedder(embedder), MemoNLI(nli)
    names = [nli.manifest.describe(), embedder.manifest.describe()]
    for path in memos:
        with path.open("rb") as f:
            saved = pickle.load(f)
        if saved["models"] == names:
            model._rows.update(saved["nli"])
            emb._rows.update(saved["embedder"])
    return emb, model


def judge_sets(judge: Any, sets: dict[str, dict[str, Any]]) -> set[str]:
    """The names among ``sets`` (name -> {"sha256": ...}) whose bytes the judge was fitted on,
    by the sha256 its provenance records."""
    if judge is None:
        return set()
    fitted = {s.get("sha256") for s in judge.provenance.get("sets") or ()}
    return {name for name, info in sets.items() if info["sha256"] in fitted}


GROUPS = ("ours, unseen by the judge", "ours, judge fitted on them", "outside")
"""Quality is reported on sets nothing was fitted on: the judge's own sets stand apart."""


def group_of(name: str, outside: set[str], judge_seen: set[str]) -> str:
    if name in outside:
        return GROUPS[2]
    return GROUPS[1] if name in judge_seen else GROUPS[0]


def _group_table(
    data: dict[str, list[dict[str, Any]]],
    preds_of: dict[tuple[str, str, str], list[dict[str, Any]]],
    outside: set[str],
    judge_seen: set[str],
) -> list[dict[str, Any]]:
    """Per set group (ours unseen by the judge / ours the judge was fitted on / outside),
    :data:`GROUP_CONFIGS` side by side over the group's cases pooled: printed, and returned
    for the JSON."""
    from engine.tuning.scoring import review_measures, score

    out = []
    for (config, model, _), _preds in preds_of.items():
        if config not in GROUP_CONFIGS:
            continue
        if any(r["config"] == config and r["nli"] == model for r in out):
            continue
        for group in GROUPS:
            names = [n for (c, m, n) in preds_of if c == config and m == model]
            names = [n for n in names if group_of(n, outside, judge_seen) == group]
            if not names:
                continue
            cases = [c for n in names for c in data[n]]
            preds = [p for n in names for p in preds_of[(config, model, n)]]
            m, r = score(cases, preds), review_measures(cases, preds)
            correct = round(m["accuracy"] * m["cases"])
            out.append(
                {
                    "group": group,
                    "sets": names,
                    "config": config,
                    "nli": model,
                    "cases": m["cases"],
                    "wrongful_overwrites": m["wrongful_overwrites"],
                    "update_recall": m["update_recall"],
                    "accuracy": m["accuracy"],
                    "net": correct - 3 * m["wrongful_overwrites"],
                    "updates_queued_right_target": r["updates_queued_right_target"],
                    "adds_skips_queued": r["adds_skips_queued"],
                }
            )
    out.sort(key=lambda g: (GROUPS.index(g["group"]), g["nli"], GROUP_CONFIGS.index(g["config"])))
    rows = [
        [
            g["group"],
            g["config"],
            g["nli"].split(" ")[0],
            g["cases"],
            f"{g['wrongful_overwrites']} ({g['wrongful_overwrites'] / g['cases']:.1%})",
            _fmt(g["update_recall"]),
            _fmt(g["accuracy"]),
            g["net"],
            _fmt(g["updates_queued_right_target"]),
            _fmt(g["adds_skips_queued"]),
        ]
        for g in out
    ]
    if rows:
        print()
        print(
            table(
                [
                    "group",
                    "policy",
                    "nli",
                    "cases",
                    "wrongful overwrites",
                    "update recall",
                    "accuracy",
                    "net (correct - 3 WO)",
                    "review: updates queued right",
                    "adds+skips queued",
                ],
                rows,
                title="per set group: the seed's rule beside strict, its review beside review",
            )
        )
    return out


def _plot(
    plt: Any,
    by: dict[tuple[str, str], dict[str, dict[str, Any]]],
    names: list[str],
    cv_of: dict[tuple[str, str], dict[str, Any]],
    first: str,
    png: Path,
) -> None:
    """Per configuration, one bar per set (and the CV estimate of a fitted one, hatched)."""
    keys = list(by)
    many = len({n for _, n in keys}) > 1
    labels = [f"{c}\n{n.split(' ')[0]}" if many else c for c, n in keys]
    panels = [
        ("wrongful_overwrites", "wrongful overwrites (lower is better)"),
        ("update_recall", "update recall (higher is better)"),
        ("accuracy", "accuracy"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(16, 0.5 * len(keys) + 2.5), layout="constrained")
    bars = [first, f"{first} CV", *names[1:]] if cv_of else names  # the estimate by its set
    height = 0.8 / len(bars)
    for ax, (metric, title) in zip(axes, panels, strict=True):
        for j, s in enumerate(bars):
            ys = [i + (j - (len(bars) - 1) / 2) * height for i in range(len(keys))]
            if s.endswith(" CV"):
                vals = [float((cv_of.get(k) or {}).get(metric) or 0.0) for k in keys]
                ax.barh(ys, vals, height, label=s, hatch="//", fill=False, edgecolor="#555")
            else:
                vals = [float((by[k].get(s) or {}).get(metric) or 0.0) for k in keys]
                ax.barh(ys, vals, height, label=s)
        ax.set_yticks(range(len(keys)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
        if metric != "wrongful_overwrites":
            ax.set_xlim(0, 1)
        else:
            ax.set_xlim(left=0, right=max(1.0, ax.get_xlim()[1]))
            ax.xaxis.get_major_locator().set_params(integer=True)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
