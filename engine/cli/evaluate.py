"""``memgate eval``: predictions for labelled or unlabelled gate cases (shared eval format)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from engine.cli.common import add_engine_flags, engine_settings

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("eval", help="predict labelled/unlabelled gate cases (shared eval format)")
    p.add_argument("--cases", required=True)
    p.add_argument("--policy", choices=["strict", "review"], default="strict")
    p.add_argument("--out", help="predictions.jsonl (default: stdout)")
    p.add_argument("--overrides", help='JSON of policy overrides, e.g. {"normalize": false}')
    p.add_argument("--explain", action="store_true", help="add rule and candidates to each line")
    add_engine_flags(p)
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from engine.app import open_engine
    from engine.evaluate import load_cases, predict
    from engine.gate.policy import policy_by_name

    cases = load_cases(Path(args.cases))
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_engine(engine_settings(args), db_path=Path(tmp) / "eval.db") as eng,
    ):
        overrides = json.loads(args.overrides) if args.overrides else None
        policy = policy_by_name(args.policy).with_overrides(overrides)
        rows = predict(eng.gate, cases, policy)
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
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        print(*lines, sep="\n")
    print(
        f"wrote {len(rows)} predictions ({args.policy})" + (f" to {args.out}" if args.out else ""),
        file=sys.stderr,
    )
    return 0
