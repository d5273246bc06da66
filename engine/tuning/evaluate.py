"""``memgate eval``: run labelled or unlabelled write-gate cases through the gate.

Each case gets its own namespace: its memories are stored as they are, then its incoming fact is
triaged as a dry run. Only ``id``, ``memories`` and ``incoming`` are shown to the gate, so
unlabelled cases work too; labelled ones are scored by :mod:`engine.tuning.scoring`. Predictions use
the format of the shared evaluation README.

A dry run changes nothing, so :func:`stage` stores the memories once and :func:`decide_cases`
can be called again with other policies on the same staged cases (``memgate calibrate`` does).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import InvalidInput
from engine.gate.policy import Policy, policy_by_name
from engine.types import Decision, Fact

if TYPE_CHECKING:
    from engine.gate.gate import Gate

__all__ = [
    "Staged",
    "command",
    "decide_cases",
    "is_labelled",
    "load_cases",
    "predict",
    "reach",
    "stage",
]


def load_cases(path: Path) -> list[dict[str, Any]]:
    """The cases of a JSON Lines file; each needs ``id``, ``memories`` and ``incoming``."""
    cases = []
    try:
        with Path(path).open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    case = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InvalidInput(f"{path}:{n}: not JSON ({exc.msg})") from None
                if not isinstance(case, dict) or not {"id", "memories", "incoming"} <= case.keys():
                    raise InvalidInput(f"{path}:{n}: a case needs id, memories and incoming")
                cases.append(case)
    except OSError as exc:
        raise InvalidInput(f"cannot read cases {path}: {exc.strerror}") from None
    return cases


def is_labelled(cases: Sequence[dict[str, Any]]) -> bool:
    """Every case carries ``category`` and ``expected`` (``action``, ``target``)."""
    return bool(cases) and all(
        "category" in c and isinstance(c.get("expected"), dict) and "action" in c["expected"]
        for c in cases
    )


@dataclass(frozen=True)
class Staged:
    """Cases whose memories are stored, one namespace per case."""

    cases: tuple[dict[str, Any], ...]
    incoming: tuple[Fact, ...]
    owners: dict[str, str]
    """Store memory id -> the case's own memory id (``m1``...)."""


def stage(gate: Gate, cases: Iterable[dict[str, Any]], *, prefix: str = "eval") -> Staged:
    """Store every case's memories as they are (no gate decision), each case in a namespace of
    its own."""
    cases = tuple(cases)
    facts, owners = [], []
    for n, case in enumerate(cases):
        for mem in case["memories"]:
            facts.append(Fact(namespace=f"{prefix}-{n}", text=mem["text"]))
            owners.append(mem["id"])
    stored = gate.ingest(facts)
    to_case = {d.memory_id: owner for d, owner in zip(stored, owners, strict=True) if d.memory_id}
    incoming = tuple(
        Fact(namespace=f"{prefix}-{n}", text=c["incoming"]) for n, c in enumerate(cases)
    )
    return Staged(cases, incoming, to_case)


def decide_cases(
    gate: Gate, staged: Staged, policy: Policy | str
) -> list[tuple[dict[str, Any], Decision]]:
    """(prediction, decision) per staged case, in order: one dry-run triage of every incoming
    fact (each in its own namespace, so no case sees another's)."""
    decisions: list[Decision] = []
    step = gate.settings.max_batch  # each case has its own namespace: chunks decide the same
    for start in range(0, len(staged.incoming), step):
        chunk = list(staged.incoming[start : start + step])
        decisions += gate.triage(chunk, policy, apply=False).decisions
    out = []
    for case, d in zip(staged.cases, decisions, strict=True):
        target = staged.owners.get(d.target_id) if d.target_id else None
        pred = {
            "id": case["id"],
            "action": d.action,
            "target": target if d.action != "add" else None,
        }
        out.append((pred, d))
    return out


def predict(
    gate: Gate, cases: Iterable[dict[str, Any]], policy: Policy | str, *, prefix: str = "eval"
) -> list[tuple[dict[str, Any], Decision]]:
    """Return (prediction, decision) per case, in order."""
    return decide_cases(gate, stage(gate, cases, prefix=prefix), policy)


def reach(
    staged: Staged, rows: Sequence[tuple[dict[str, Any], Decision]], policy: Policy
) -> dict[str, Any]:
    """``update_reach`` (:mod:`engine.tuning.scoring`) of decided cases at ``policy``'s bars."""
    from engine.tuning.scoring import Seen, update_reach

    seen = {
        pred["id"]: [
            Seen(staged.owners.get(c.memory_id), c.similarity, c.contradiction)
            for c in d.candidates
        ]
        for pred, d in rows
    }
    return update_reach(
        staged.cases,
        seen,
        floor=policy.floor,
        contradiction=policy.contradiction,
        lowest_bar=min(
            policy.dated_contradiction if policy.time_order and policy.claims else 1.0,
            policy.value_change_contradiction if policy.lexical and policy.claims else 1.0,
        ),
    )


# -- the command ----------------------------------------------------------------------------------
def command(args: Any, engine_settings: Any) -> int:
    """Run ``memgate eval``: predict every case; score them when every case is labelled.

    Predictions go to ``--out`` (or stdout when nothing is scored); the scores go to stdout,
    as aligned lines or, with ``--json``, one JSON object (the shared ``score.py``'s names plus
    ``review_measures``)."""
    import sys
    import tempfile
    import textwrap

    from engine.app import open_engine
    from engine.tuning.policy_file import resolve_overrides
    from engine.tuning.scoring import format_scores, headline, review_measures, score

    cases = load_cases(Path(args.cases))
    name, from_file = resolve_overrides(args.policy, args.policy_file)
    try:
        overrides = json.loads(args.overrides) if args.overrides else None
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--overrides is not JSON ({exc.msg})") from None
    if overrides is not None and not isinstance(overrides, dict):
        raise InvalidInput("--overrides must be a JSON object")
    overrides = {**from_file, **(overrides or {})}
    policy_by_name(name).with_overrides(overrides)  # a bad override fails before models load
    labelled = is_labelled(cases)
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_engine(engine_settings, db_path=Path(tmp) / "eval.db") as eng,
    ):
        # the named policy with these models' thresholds and their judge's bars
        policy = eng.gate.policy(name, overrides)
        staged = stage(eng.gate, cases)
        rows = decide_cases(eng.gate, staged, policy)
    lines = []
    for pred, d in rows:
        rec = dict(pred)
        if args.explain:
            rec["rule"] = d.rule
            rec["candidates"] = [
                (
                    c.text[:60],
                    round(c.similarity, 3),
                    None if c.contradiction is None else round(c.contradiction, 3),
                    c.reason,
                )
                for c in d.candidates[:4]
            ]
        lines.append(json.dumps(rec))
    where = f" to {args.out}" if args.out else ""
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif not labelled:
        print(*lines, sep="\n")
    else:
        where = " (not written: pass --out to keep them)"
    print(f"{len(rows)} predictions ({name}){where}", file=sys.stderr)
    if not labelled:
        return 0
    preds = [p for p, _ in rows]
    m, review = score(cases, preds), review_measures(cases, preds)
    ceiling = reach(staged, rows, policy)
    if args.json:
        print(json.dumps({**m, "review_measures": review, "update_reach": ceiling}, indent=2))
    else:
        print(f"{name} on {Path(args.cases).name}: {headline(m)}")
        print(format_scores(m, review))
        print("update reach (what the models leave any rule, of the true updates):")
        print(textwrap.indent(format_scores(ceiling), "  "))
    return 0
