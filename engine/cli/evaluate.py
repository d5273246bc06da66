"""``memgate eval`` (predict gate cases; score them when labelled) and ``memgate calibrate``
(sweep thresholds on labelled cases, write the chosen ones as a policy file)."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli.common import add_engine_flags, add_policy_file_flag, engine_settings
from engine.gate.policy import POLICY_NAMES

__all__ = ["register"]


def register(sub: Any) -> None:
    from engine.tuning.calibrate import add_arguments as add_calibrate_arguments

    p = sub.add_parser(
        "eval", help="predict gate cases (shared eval format); score them when labelled"
    )
    p.add_argument("--cases", required=True)
    p.add_argument("--policy", choices=list(POLICY_NAMES), help="default: strict")
    add_policy_file_flag(p)
    p.add_argument("--out", help="predictions.jsonl (default: stdout when unlabelled)")
    p.add_argument("--json", action="store_true", help="the scores as one JSON object")
    p.add_argument("--overrides", help='JSON of policy overrides, e.g. {"floor": 0.7}')
    p.add_argument("--explain", action="store_true", help="add rule and candidates to each line")
    add_engine_flags(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "calibrate",
        help="sweep thresholds on labelled cases; write the chosen ones as a policy file",
    )
    add_calibrate_arguments(p)
    add_engine_flags(p)
    p.set_defaults(func=cmd_calibrate)


def cmd_eval(args: argparse.Namespace) -> int:
    from engine.tuning.evaluate import command

    return command(args, engine_settings(args))


def cmd_calibrate(args: argparse.Namespace) -> int:
    from engine.tuning.calibrate import command

    return command(args, engine_settings(args))
