"""The judge (duplicates and the update veto), cross-validated per labelled set: what it is worth
on wording it was not fitted on, beside the rule alone.

Every set's cases are captured once (``engine.tuning.fit_judge.capture``: the evidence the rule saw,
review's floor). Each set in turn is then scored with trees fitted on the other sets (leave one
set out) and with bars chosen on the other sets' out-of-fold probabilities (the bars never see
the set they are scored on either; ``memgate models judge`` chooses them on all sets at once).
Strict and review are each replayed over the same evidence, with the judge and without it.

    python benchmarks/cv_judge.py                      # the sets `memgate models judge` uses
    python benchmarks/cv_judge.py --sets a.jsonl b.jsonl c.jsonl --trees 100
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import add_common_args, run_header, save_results, table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser)
    parser.add_argument("--sets", nargs="*", type=Path, help="labelled sets (default: the fit's)")
    parser.add_argument("--nli", default="aegis-nli", help="NLI artefact (default aegis-nli)")
    parser.add_argument("--trees", type=int, default=200, help="boosting rounds")
    args = parser.parse_args(argv)

    from engine.app import EngineSettings, open_engine
    from engine.gate.gate import policy_for
    from engine.gate.policy import REVIEW
    from engine.runtime.loader import ModelChoice
    from engine.runtime.session import SessionSettings
    from engine.tuning.boost import BoostSettings
    from engine.tuning.evaluate import load_cases
    from engine.tuning.fit_judge import (
        capture,
        choose_bars,
        default_sets,
        figures,
        labelled_rows,
        replay,
        with_bars,
    )
    from engine.tuning.fit_judge import out_of_fold as oof
    from engine.tuning.scoring import review_measures

    paths = args.sets or default_sets()
    sets = [(p.stem, load_cases(p)) for p in paths]
    if args.smoke:
        sets = [(name, cases[:15]) for name, cases in sets]
    payload = run_header("cv_judge", args)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        settings = EngineSettings(
            data_dir=Path(tmp),
            cache_dir=args.cache_dir,
            judge=False,
            models=ModelChoice(embedder_variant="fp32", nli=args.nli),
            session=SessionSettings(device="cpu", intra_op_threads=args.threads),
        )
        with open_engine(settings, db_path=Path(tmp) / "cv.db") as eng:
            items = capture(eng.gate, sets)
            strict = replace(policy_for("strict", eng.gate.nli, eng.gate.embedder), judge=True)
            review0 = replace(policy_for("review", eng.gate.nli, eng.gate.embedder), judge=True)
            model = eng.gate.nli.manifest.describe()
    print(f"captured {len(items)} cases in {time.perf_counter() - start:.0f} s ({model})")
    boost = BoostSettings(trees=3 if args.smoke else args.trees)
    rows = labelled_rows(items, REVIEW.floor)
    judged = oof(items, rows, boost, lambda line: print(line, flush=True))
    updates = oof(items, rows, boost, lambda line: print(line, flush=True), "update")

    rows, per_set = [], []
    totals: dict[str, list[dict[str, Any]]] = {"alone": [], "judge": []}
    review_totals: dict[str, list[dict[str, Any]]] = {"alone": [], "judge": []}
    for name, _ in sets:
        held = [i for i, it in enumerate(items) if it.group == name]
        rest = [i for i, it in enumerate(items) if it.group != name]
        r_items, r_judged = [items[i] for i in rest], [judged[i] for i in rest]
        r_updates = [updates[i] for i in rest]
        bars, _ = choose_bars(r_items, strict, r_judged, r_updates)
        # every bar on both policies, as the gate serves a fitted judge (Judge.policy)
        pol, review = with_bars(strict, bars), with_bars(review0, bars)
        its, js = [items[i] for i in held], [judged[i] for i in held]
        us = [updates[i] for i in held]
        rec: dict[str, Any] = {"set": name, "bars": bars}
        for arm, jj, uu in (("alone", None, None), ("judge", js, us)):
            preds = replay(its, pol, jj, uu)
            rpreds = replay(its, review, jj, uu)
            rec[arm] = {
                "strict": figures(its, preds),
                "review": {
                    **figures(its, rpreds),
                    **review_measures([i.case for i in its], rpreds),
                },
                "predictions": preds,
            }
            totals[arm] += preds
            review_totals[arm] += rpreds
        per_set.append(rec)
        a, j = rec["alone"]["strict"], rec["judge"]["strict"]
        rows.append(
            [
                name,
                a["cases"],
                f"{bars['duplicate_bar']:.2f}/{bars['veto_bar']:.1f}",
                a["wrongful_overwrites"],
                j["wrongful_overwrites"],
                f"{a['update_recall']:.3f}",
                f"{j['update_recall']:.3f}",
                _pr(a),
                _pr(j),
                a["lost_information"],
                j["lost_information"],
                f"{a['accuracy']:.3f}",
                f"{j['accuracy']:.3f}",
            ]
        )
    all_a = figures(items, totals["alone"])
    all_j = figures(items, totals["judge"])
    rows.append(
        [
            "all",
            all_a["cases"],
            "",
            all_a["wrongful_overwrites"],
            all_j["wrongful_overwrites"],
            f"{all_a['update_recall']:.3f}",
            f"{all_j['update_recall']:.3f}",
            _pr(all_a),
            _pr(all_j),
            all_a["lost_information"],
            all_j["lost_information"],
            f"{all_a['accuracy']:.3f}",
            f"{all_j['accuracy']:.3f}",
        ]
    )
    print(
        table(
            [
                "held set",
                "cases",
                "bars dup/veto",
                "WO rule",
                "WO +judge",
                "recall rule",
                "recall +judge",
                "dup P/R rule",
                "dup P/R +judge",
                "lost rule",
                "lost +judge",
                "acc rule",
                "acc +judge",
            ],
            rows,
            title=f"strict, judge and bars fitted without the held set ({model})",
        )
    )
    cases = [it.case for it in items]
    review_all = {arm: review_measures(cases, review_totals[arm]) for arm in review_totals}
    rrows = [
        [
            rec["set"],
            f"{rec['alone']['review']['updates_queued_right_target']:.3f}",
            f"{rec['judge']['review']['updates_queued_right_target']:.3f}",
            f"{rec['alone']['review']['adds_skips_queued']:.3f}",
            f"{rec['judge']['review']['adds_skips_queued']:.3f}",
        ]
        for rec in per_set
    ]
    rrows.append(
        [
            "all",
            *(
                f"{review_all[arm][k]:.3f}"
                for k in ("updates_queued_right_target", "adds_skips_queued")
                for arm in ("alone", "judge")
            ),
        ]
    )
    print(
        table(
            [
                "held set",
                "queued right, rule",
                "queued right, +judge",
                "needless, rule",
                "needless, +judge",
            ],
            rrows,
            title="review: true updates queued with the right target, adds and skips queued",
        )
    )
    for rec in per_set:
        for arm in ("alone", "judge"):
            del rec[arm]["predictions"]
    payload.update(
        model=model,
        trees=boost.trees,
        sets=per_set,
        all={"alone": all_a, "judge": all_j},
        review_all=review_all,
    )
    save_results(args.out, "cv_judge", payload, lambda plt: draw(plt, per_set))
    return 0


def _pr(m: dict[str, Any]) -> str:
    p, r = m["duplicate_precision"], m["duplicate_recall"]
    return f"{'-' if p is None else f'{p:.2f}'}/{'-' if r is None else f'{r:.2f}'}"


def draw(plt: Any, per_set: list[dict[str, Any]]) -> Any:
    """Wrongful overwrites, update recall, duplicate recall and accuracy per held set, the rule
    alone beside the rule + judge."""
    fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
    x = range(len(per_set))
    panels = (
        ("wrongful_overwrites", "wrongful overwrites"),
        ("update_recall", "update recall"),
        ("duplicate_recall", "duplicate recall"),
        ("accuracy", "accuracy"),
    )
    for ax, (key, label) in zip(axes, panels, strict=True):
        for k, (arm, name) in enumerate((("alone", "rule alone"), ("judge", "rule + judge"))):
            vals = [r[arm]["strict"][key] or 0.0 for r in per_set]
            ax.bar([i - 0.2 + 0.4 * k for i in x], vals, 0.4, label=name)
        ax.set_xticks(list(x), [r["set"] for r in per_set], rotation=45, ha="right")
        ax.set_ylabel(f"strict {label}")
        if key != "wrongful_overwrites":
            ax.set_ylim(0, 1)
    axes[0].legend()
    fig.suptitle("judge, leave-one-set-out (trees and bars fitted without the held set)")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    raise SystemExit(main())
