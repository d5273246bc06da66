"""``memgate demo``: the Denver -> Chicago and cello examples, in process."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from engine.cli.common import add_engine_flags, engine_settings, print_decision

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="triage the Denver -> Chicago and cello examples")
    add_engine_flags(p)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from engine.app import open_engine
    from engine.types import Fact

    with (
        tempfile.TemporaryDirectory() as tmp,
        open_engine(engine_settings(args), db_path=Path(tmp) / "demo.db") as eng,
    ):
        print(f"models: {eng.gate.embedder.manifest.describe()}")  # type: ignore[attr-defined]
        print(f"        {eng.gate.nli.manifest.describe()}")  # type: ignore[attr-defined]
        ns = "demo/acme"
        seed = [
            "The customer's office is in Denver.",
            "The customer prefers email over phone calls.",
            "The customer's account manager is Priya.",
        ]
        eng.gate.ingest([Fact(ns, t) for t in seed])
        print("stored:", *(f"  {t}" for t in seed), sep="\n")
        incoming = [
            Fact(ns, "The customer's office is in Chicago."),
            Fact(ns, "The customer is learning to play the cello."),
        ]
        for policy in ("strict", "review"):
            print(f"\npolicy {policy} (dry run):")
            for d in eng.gate.triage(incoming, policy).decisions:
                print_decision(d)
    return 0
