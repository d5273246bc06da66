"""``memgate triage FILE``: decide a JSON Lines file of facts in process (dry run by default)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from engine.cli.common import (
    add_engine_flags,
    add_policy_file_flag,
    engine_settings,
    facts_from_arg,
    print_decision,
)
from engine.gate.policy import POLICY_NAMES

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("triage", help="decide a JSON Lines file of facts (dry run by default)")
    p.add_argument("file", help="JSON Lines of facts, or - for stdin")
    p.add_argument("--policy", choices=list(POLICY_NAMES), help="default: strict")
    add_policy_file_flag(p)
    p.add_argument("--apply", action="store_true", help="commit the decisions to the store")
    p.add_argument("--json", action="store_true")
    add_engine_flags(p)
    p.set_defaults(func=cmd_triage)


def cmd_triage(args: argparse.Namespace) -> int:
    from engine.app import open_engine
    from engine.tuning.policy_file import resolve_overrides

    name, overrides = resolve_overrides(args.policy, args.policy_file)
    facts = list(facts_from_arg("memgate triage", args.file))
    with open_engine(engine_settings(args)) as eng:
        result = eng.gate.triage(facts, name, apply=args.apply, overrides=overrides)
    for d in result.decisions:
        if args.json:
            record = {
                "action": d.action,
                "target": d.target_id,
                "rule": d.rule,
                "memory_id": d.memory_id,
                "text": d.fact.text,
            }
            print(json.dumps(record))
        else:
            print_decision(d)
    return 0
