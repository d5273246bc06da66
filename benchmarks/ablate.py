"""Ablation: the gate with each mechanism turned off, one at a time, on two groups of sets.

Groups: our own labelled sets (written by our helpers from one README) and the outside sets
(converted from public datasets by their own labels, issue 31); our sets the served judge was
fitted on (by the sha256 its provenance records) are a group of their own. For every arm,
strict and review run over the same staged cases; the models' scores are computed once per
distinct text or pair (``engine.tuning.calibrate``'s memos in front of the embedder and the NLI
model, the ones ``memgate calibrate`` sweeps with; ``--memo`` keeps them between runs), so an
arm costs only the gate's own logic and the pairs it newly asks for.

Per group and arm: strict ``net = correct - 3 x wrongful overwrites``, wrongful overwrites and
update recall; review's share of true updates queued with the right target and of adds and
skips queued (needless). Each arm is compared with ``on`` (every mechanism as shipped) measured
in the same run, and the retirement rule of docs/experiments/2026-12-05-gate-v3.md is applied to
the outside group: a mechanism stays only if removing it costs there.

    python benchmarks/ablate.py --outside ../outside/benchmarks/data/outside/*.jsonl
    python benchmarks/ablate.py --ours heldout2 heldout5 --arms on keys judge-veto --smoke
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._common import add_common_args, run_header, save_results, table  # noqa: E402
from benchmarks.bench_quality import judge_sets  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
OURS = ["heldout", *(f"heldout{n}" for n in range(2, 23))]
"""Our sets that may be run: heldout-23 and heldout-24 stay frozen (never run)."""
FROZEN = {"heldout23", "heldout24"}

ARMS: dict[str, dict[str, Any]] = {
    "on": {},
    "overlap": {"lexical": False},
    "claims": {"claims": False},
    "identify": {"evidence": False},
    "judge-duplicate": {"judge_duplicate": 1.0},
    "judge-veto": {"judge_veto": 0.0},
}
"""Arm -> the policy overrides that turn its mechanism off (``on``: none). ``claims`` off also
leaves identify without its parse (subject relation and frames come from it), so under strict
it adds where only identify's evidence would have let a replacement through: that is what the
parse is worth. ``overlap`` is the ``lexical`` switch (containment, claim counting, and the
parsed claims' comparisons, which it gates)."""
POLICIES = ("strict", "review")


def measures(
    cases: list[dict[str, Any]], strict: list[dict[str, Any]], review: list[dict[str, Any]]
) -> dict[str, Any]:
    from engine.tuning.scoring import review_measures, score

    m = score(cases, strict)
    correct = round(m["accuracy"] * m["cases"])
    r = review_measures(cases, review)
    by: dict[str, dict[str, int]] = {}
    for case, pred in zip(cases, strict, strict=True):
        exp = case["expected"]
        row = by.setdefault(case["category"], {"cases": 0, "right": 0, "wrongful": 0})
        row["cases"] += 1
        row["right"] += pred["action"] == exp["action"] and (
            exp["action"] == "add" or pred["target"] == exp["target"]
        )
        row["wrongful"] += pred["action"] == "replace" and not (
            exp["action"] == "replace" and pred["target"] == exp["target"]
        )
    return {
        "by_category": by,
        "cases": m["cases"],
        "correct": correct,
        "wrongful_overwrites": m["wrongful_overwrites"],
        "net": correct - 3 * m["wrongful_overwrites"],
        "update_recall": m["update_recall"],
        "accuracy": m["accuracy"],
        "review_wrongful_overwrites": r["wrongful_overwrites"],
        "queued_right": r["updates_queued_right_target"],
        "needless": r["adds_skips_queued"],
    }


def retire(on: dict[str, Any], off: dict[str, Any]) -> tuple[bool, str]:
    """The pre-registered rule (docs/experiments/2026-12-05-gate-v3.md): a mechanism stays only
    if removing it costs on the outside sets."""
    why = []
    if off["net"] <= on["net"] - 3:
        why.append(f"net {off['net']} <= {on['net']} - 3")
    if off["wrongful_overwrites"] > on["wrongful_overwrites"]:
        why.append(f"WO {off['wrongful_overwrites']} > {on['wrongful_overwrites']}")
    if on["queued_right"] - off["queued_right"] >= 0.01 and off["needless"] >= on["needless"]:
        why.append(f"queued-right {off['queued_right']:.3f} vs {on['queued_right']:.3f}")
    return bool(why), "; ".join(why) or "no cost on the outside sets"


def split_ours(
    groups: dict[str, list[tuple[str, list[dict[str, Any]]]]], seen: set[str]
) -> dict[str, list[tuple[str, list[dict[str, Any]]]]]:
    """Our sets the judge was fitted on (``seen``) as their own group, apart from the rest:
    nothing is reported on the sets it was fitted on as if they were unseen."""
    ours = groups.get("ours", [])
    if not seen or not ours:
        return groups
    split = {
        "ours, unseen by the judge": [(n, c) for n, c in ours if n not in seen],
        "ours, judge fitted on them": [(n, c) for n, c in ours if n in seen],
    }
    rest = {g: sets for g, sets in groups.items() if g != "ours"}
    return {g: sets for g, sets in {**split, **rest}.items() if sets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser)
    parser.add_argument("--ours", nargs="*", default=OURS, help="our sets (names or paths)")
    parser.add_argument("--outside", nargs="*", type=Path, default=[], help="outside sets")
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--extra", nargs="*", default=[], help="extra arms NAME=JSON overrides")
    parser.add_argument("--nli", default="aegis-nli", help="NLI artefact (default aegis-nli)")
    parser.add_argument(
        "--memo",
        type=Path,
        help="a pickle of the model scores (read when present, written at the end): a later "
        "run over the same texts computes only the pairs it newly asks for",
    )
    args = parser.parse_args(argv)

    import json

    from engine.app import EngineSettings, open_engine
    from engine.gate.gate import Gate
    from engine.runtime.loader import ModelChoice
    from engine.runtime.session import SessionSettings
    from engine.tuning.calibrate import MemoEmbedder, MemoNLI
    from engine.tuning.evaluate import decide_cases, load_cases, stage

    arms = {name: ARMS[name] for name in args.arms}
    for spec in args.extra:
        name, _, js = spec.partition("=")
        arms[name] = json.loads(js)
    if "on" not in arms:
        arms = {"on": {}, **arms}
    groups: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {"ours": [], "outside": []}
    sha_of: dict[str, dict[str, Any]] = {}  # our sets' bytes, to set the judge's own apart
    for name in args.ours:
        path = Path(name) if name.endswith(".jsonl") else DATA / f"{name}.jsonl"
        if path.stem in FROZEN:
            raise SystemExit(f"{path.stem} is frozen: it is never run")
        groups["ours"].append((path.stem, load_cases(path)))
        sha_of[path.stem] = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    for path in args.outside:
        groups["outside"].append((path.stem, load_cases(path)))
    if args.smoke:
        groups = {g: [(n, c[:12]) for n, c in sets[:2]] for g, sets in groups.items()}
    groups = {g: sets for g, sets in groups.items() if sets}

    payload = run_header("ablate", args)
    start = time.perf_counter()
    preds: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        settings = EngineSettings(
            data_dir=Path(tmp),
            cache_dir=args.cache_dir,
            models=ModelChoice(embedder_variant="fp32", nli=args.nli),
            session=SessionSettings(device="cpu", intra_op_threads=args.threads),
        )
        with open_engine(settings, db_path=Path(tmp) / "ablate.db") as eng:
            g0 = eng.gate
            nli, emb = MemoNLI(g0.nli), MemoEmbedder(g0.embedder)
            if args.memo is not None and args.memo.exists():
                with args.memo.open("rb") as f:
                    saved = pickle.load(f)
                if saved["models"] == [g0.nli.manifest.describe(), g0.embedder.manifest.describe()]:
                    nli._rows, emb._rows = saved["nli"], saved["embedder"]
            gate = Gate(g0.store, g0.index, emb, nli, g0.settings, g0.judge)
            groups = split_ours(groups, judge_sets(g0.judge, sha_of))
            payload["judge"] = None if g0.judge is None else g0.judge.describe()
            n = 0
            for group, sets in groups.items():
                for name, cases in sets:
                    t0 = time.perf_counter()
                    staged = stage(gate, cases, prefix=f"ab{n}")
                    n += 1
                    for arm, overrides in arms.items():
                        for pol in POLICIES:
                            policy = gate.policy(pol, overrides)
                            rows = decide_cases(gate, staged, policy)
                            preds[(group, arm, pol)] = preds.get((group, arm, pol), []) + [
                                p for p, _ in rows
                            ]
                    print(
                        f"{group}/{name}: {len(cases)} cases, {len(arms)} arms in "
                        f"{time.perf_counter() - t0:.0f} s (pairs scored so far {nli.computed})",
                        flush=True,
                    )
            if args.memo is not None:
                with args.memo.open("wb") as f:
                    pickle.dump(
                        {
                            "models": [g0.nli.manifest.describe(), g0.embedder.manifest.describe()],
                            "nli": nli._rows,
                            "embedder": emb._rows,
                        },
                        f,
                    )
    payload["seconds"] = round(time.perf_counter() - start, 1)
    payload["arms"] = arms
    payload["sets"] = {g: [n for n, _ in sets] for g, sets in groups.items()}
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    for group, sets in groups.items():
        cases = [c for _, cs in sets for c in cs]
        figures[group] = {
            arm: measures(cases, preds[(group, arm, "strict")], preds[(group, arm, "review")])
            for arm in arms
        }
    payload["figures"] = figures
    verdicts = {}
    if "outside" in figures:
        on = figures["outside"]["on"]
        for arm in arms:
            if arm != "on" and arm in ARMS:  # an --extra arm adds a signal: not a retirement
                stays, why = retire(on, figures["outside"][arm])
                verdicts[arm] = {"stays": stays, "why": why}
    payload["retirement"] = verdicts

    for group, per_arm in figures.items():
        on = per_arm["on"]
        rows = []
        for arm, m in per_arm.items():
            rows.append(
                [
                    arm,
                    m["cases"],
                    m["net"],
                    f"{m['net'] - on['net']:+d}" if arm != "on" else "",
                    m["wrongful_overwrites"],
                    f"{m['update_recall']:.3f}",
                    f"{m['queued_right']:.3f}",
                    f"{m['needless']:.3f}",
                    ("stays" if verdicts[arm]["stays"] else "retired")
                    if group == "outside" and arm in verdicts
                    else "",
                ]
            )
        print(
            table(
                [
                    "off",
                    "cases",
                    "strict net",
                    "vs on",
                    "strict WO",
                    "update recall",
                    "review queued right",
                    "needless",
                    "rule",
                ],
                rows,
                title=f"ablation, {group} ({', '.join(payload['sets'][group])})",
            )
        )
    for group, per_arm in figures.items():
        cats = sorted(per_arm["on"]["by_category"])
        print(
            table(
                ["arm", *(f"{c} right/WO" for c in cats)],
                [
                    [
                        arm,
                        *(
                            f"{m['by_category'][c]['right']}/{m['by_category'][c]['wrongful']}"
                            f" of {m['by_category'][c]['cases']}"
                            for c in cats
                        ),
                    ]
                    for arm, m in per_arm.items()
                ],
                title=f"strict per category, {group}",
            )
        )
    for arm, v in verdicts.items():
        print(f"{arm}: {'stays' if v['stays'] else 'RETIRED'} ({v['why']})")
    save_results(args.out, "ablate", payload, lambda plt: draw(plt, figures))
    return 0


def draw(plt: Any, figures: dict[str, dict[str, dict[str, Any]]]) -> Any:
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, key, label in (
        (axes[0], "net", "strict net - net(on)"),
        (axes[1], "wrongful_overwrites", "strict WO - WO(on)"),
    ):
        arms = [a for a in next(iter(figures.values())) if a != "on"]
        width = 0.8 / max(1, len(figures))
        for k, (group, per_arm) in enumerate(figures.items()):
            ys = [per_arm[a][key] - per_arm["on"][key] for a in arms]
            ax.bar(np.arange(len(arms)) + k * width, ys, width, label=group)
        ax.set_xticks(np.arange(len(arms)) + width / 2)
        ax.set_xticklabels(arms, rotation=60, ha="right")
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_ylabel(label)
        ax.legend()
    axes[0].set_title("mechanism off, one at a time")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    raise SystemExit(main())
