"""Leave-one-set-out cross-validation of strict's thresholds over the tuned-on labelled sets.

Each set in turn is judged with the setting chosen on the others: that is the estimate of what
choosing the thresholds is worth on wording they were not chosen on, to report beside the
held-out figure (issue 12, item 1). The held-out sets themselves (``HELD_OUT``) are never
read here.

How. Every case's memories are stored and its fact triaged once, as ``memgate eval`` does
(``engine.tuning.evaluate``), under the base policy, while the evidence the policy rule is handed is
recorded (``engine.gate.decide.rule`` wrapped for that one run). The rule
(:func:`engine.gate.policy.decide`) is pure, so each setting of the grid is then the rule
replayed over the same evidence: thousands of settings in a minute, every one seeing the same
model outputs. Only settings at least as strict as the base are valid this way (the base run
measured what they need: no lower floor, no lower contradiction bar than the base's).

The objective per fold: correct decisions less wrongful overwrites (a wrongful overwrite counts
twice), summed over the training sets; ties go to the setting nearest the defaults.

    python benchmarks/cv_thresholds.py                 # the eight tuned-on sets, default grid
    python benchmarks/cv_thresholds.py --grid contradiction=0.95,0.98 --smoke
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import add_common_args, run_header, save_results, table  # noqa: E402
from benchmarks.bench_quality import HELDOUT_SETS  # noqa: E402

TUNED_ON = [  # the sets the thresholds were chosen on (dev, outside the repository, too)
    "heldout",
    "heldout-2",
    "heldout-3",
    "heldout-4",
    "heldout-5",
    "heldout-6",
    "heldout-7",
]
HELD_OUT = tuple(f"heldout-{n}" for n in range(8, 25))
GRID: dict[str, list[float]] = {
    "contradiction": [0.95, 0.97, 0.98],
    "dated_contradiction": [0.80, 0.90, 0.95],
    "ambiguity_margin": [0.02, 0.05, 0.08],
    "dominance_margin": [0.03, 0.06, 0.09],
    "attribute_margin": [0.10, 0.20, 0.30],
    "attribute_similarity": [0.10, 0.20, 0.30],
    "value_change_similarity": [0.80, 0.85, 0.90],
}

Setting = tuple[float, ...]
Tally = tuple[int, int, int]
"""(correct decisions, wrongful overwrites, cases) of one set."""


def capture(gate: Any, cases: Sequence[dict[str, Any]], policy: Any) -> tuple[list[Any], dict]:
    """The evidence list the policy rule saw for each case (in case order), and the store id ->
    case memory id map; one dry-run triage, as ``memgate eval`` runs it."""
    import engine.gate.decide as decide_step
    from engine.tuning.evaluate import decide_cases, stage

    staged = stage(gate, cases)
    seen: list[list[Any]] = []
    rule = decide_step.rule

    def recording(evidence: Sequence[Any], pol: Any) -> Any:
        seen.append(list(evidence))
        return rule(evidence, pol)

    decide_step.rule = recording
    try:
        decide_cases(gate, staged, policy)
    finally:
        decide_step.rule = rule
    if len(seen) != len(cases):  # a keyed or episodic fact never reaches the rule
        raise SystemExit(f"captured {len(seen)} evidence lists for {len(cases)} cases")
    return seen, staged.owners


def replay(
    evidence: Sequence[Sequence[Any]],
    ids: Sequence[str],
    owners: Mapping[str, str],
    policy: Any,
    decide: Callable[..., Any],
) -> list[dict[str, Any]]:
    """Predictions (eval format) of ``policy`` over the captured evidence."""
    out = []
    for cid, ev in zip(ids, evidence, strict=True):
        v = decide(ev, policy)
        target = owners.get(v.target_id) if v.target_id else None
        out.append({"id": cid, "action": v.action, "target": target if v.action != "add" else None})
    return out


def tally(cases: Sequence[dict[str, Any]], preds: Sequence[dict[str, Any]]) -> Tally:
    from engine.tuning.scoring import score

    m = score(list(cases), list(preds))
    return round(m["accuracy"] * len(cases)), int(m["wrongful_overwrites"]), len(cases)


def leave_one_out(
    results: Mapping[Setting, Mapping[str, Tally]], sets: Sequence[str], default: Setting
) -> list[tuple[str, Setting]]:
    """(held set, the setting chosen on the others) per set. Chosen: the most correct decisions
    less wrongful overwrites over the other sets; ties to the setting nearest ``default``."""

    def distance(s: Setting) -> float:
        return sum(abs(a - b) for a, b in zip(s, default, strict=True))

    out = []
    for held in sets:
        train = [s for s in sets if s != held]
        best = max(
            results,
            key=lambda s: (sum(results[s][t][0] - results[s][t][1] for t in train), -distance(s)),
        )
        out.append((held, best))
    return out


def parse_grid(specs: Sequence[str]) -> dict[str, list[float]]:
    grid = dict(GRID)
    for spec in specs:
        name, _, values = spec.partition("=")
        if not values:
            raise SystemExit(f"--grid wants NAME=a,b,c, got {spec!r}")
        grid[name] = [float(v) for v in values.split(",")]
    return grid


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser)
    parser.add_argument("--sets", nargs="*", default=TUNED_ON, help="labelled sets (folds)")
    parser.add_argument("--nli", default="aegis-nli", help="NLI artefact (default aegis-nli)")
    parser.add_argument("--grid", action="append", default=[], metavar="NAME=a,b,c")
    args = parser.parse_args(argv)

    from engine.app import EngineSettings, open_engine
    from engine.gate.policy import STRICT
    from engine.gate.policy import apply_rule as rule
    from engine.runtime.loader import ModelChoice
    from engine.runtime.session import SessionSettings
    from engine.tuning.evaluate import load_cases

    paths = dict(HELDOUT_SETS)
    held = [name for name in args.sets if name in HELD_OUT]
    if held:
        raise SystemExit(f"{', '.join(held)}: held out, never choose thresholds on it")
    by_set = {name: load_cases(paths.get(name, Path(name))) for name in args.sets}
    if args.smoke:
        by_set = {name: cases[:12] for name, cases in by_set.items()}
    cases = [c for name in args.sets for c in by_set[name]]
    where = [name for name in args.sets for _ in by_set[name]]
    ids = [c["id"] for c in cases]
    grid = parse_grid(args.grid)
    names = list(grid)
    default = tuple(float(getattr(STRICT, n)) for n in names)
    payload = run_header("cv_thresholds", args)

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        settings = EngineSettings(
            data_dir=Path(tmp),
            cache_dir=args.cache_dir,
            models=ModelChoice(embedder_variant="fp32", nli=args.nli, nli_variant="auto"),
            session=SessionSettings(device="cpu", intra_op_threads=args.threads),
        )
        with open_engine(settings, db_path=Path(tmp) / "cv.db") as eng:
            evidence, owners = capture(eng.gate, cases, STRICT)
    print(f"captured {len(cases)} cases in {time.perf_counter() - start:.0f} s", flush=True)

    combos = list(itertools.product(*grid.values()))
    members = {name: [i for i, w in enumerate(where) if w == name] for name in args.sets}
    results: dict[Setting, dict[str, Tally]] = {}
    for n, combo in enumerate(combos, 1):
        policy = STRICT.with_overrides(dict(zip(names, combo, strict=True)))
        preds = replay(evidence, ids, owners, policy, rule)
        results[combo] = {
            name: tally([cases[i] for i in idx], [preds[i] for i in idx])
            for name, idx in members.items()
        }
        if n % 250 == 0 or n == len(combos):
            print(f"  {n}/{len(combos)} settings replayed", flush=True)
    if default not in results:
        raise SystemExit("the grid must contain the default setting")

    rows, folds = [], []
    for held, chosen in leave_one_out(results, args.sets, default):
        c, d = results[chosen][held], results[default][held]
        changed = {k: v for k, v, w in zip(names, chosen, default, strict=True) if v != w}
        rows.append([held, c[2], c[1], f"{c[0] / c[2]:.3f}", d[1], f"{d[0] / d[2]:.3f}", changed])
        folds.append(
            {"held": held, "chosen": dict(zip(names, chosen, strict=True)), "cv": c, "default": d}
        )
    n_all = sum(r[2] for r in (f["cv"] for f in folds))
    cv_wo, cv_ok = sum(f["cv"][1] for f in folds), sum(f["cv"][0] for f in folds)
    d_wo, d_ok = sum(f["default"][1] for f in folds), sum(f["default"][0] for f in folds)
    rows.append(["all", n_all, cv_wo, f"{cv_ok / n_all:.3f}", d_wo, f"{d_ok / n_all:.3f}", ""])
    print(
        table(
            [
                "held set",
                "cases",
                "CV WO",
                "CV acc",
                "default WO",
                "default acc",
                "chosen != default",
            ],
            rows,
            title=f"leave-one-set-out CV over {len(combos)} settings ({args.nli})",
        )
    )
    payload.update(
        grid=grid,
        default=dict(zip(names, default, strict=True)),
        folds=folds,
        cv={"wrongful_overwrites": cv_wo, "accuracy": cv_ok / n_all, "cases": n_all},
        defaults={"wrongful_overwrites": d_wo, "accuracy": d_ok / n_all, "cases": n_all},
    )
    save_results(args.out, "cv_thresholds", payload, lambda plt: draw(plt, folds))
    return 0


def draw(plt: Any, folds: Sequence[dict[str, Any]]) -> Any:
    """Wrongful overwrites on each held set: the CV-chosen setting beside the defaults."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = range(len(folds))
    ax.bar([i - 0.2 for i in x], [f["cv"][1] for f in folds], 0.4, label="CV-chosen")
    ax.bar([i + 0.2 for i in x], [f["default"][1] for f in folds], 0.4, label="defaults")
    ax.set_xticks(list(x), [f["held"] for f in folds])
    ax.set_ylabel("wrongful overwrites on the held set")
    ax.set_title("strict thresholds: leave-one-set-out CV")
    ax.legend()
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    raise SystemExit(main())
