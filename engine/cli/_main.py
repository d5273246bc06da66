"""The ``memgate`` parser: every command registered in one list, and the error boundary."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from engine.cli import backfill, bench, client, demo, evaluate, mcp, models, serve, triage
from engine.cli.common import add_global_flags
from engine.errors import MemgateError

__all__ = ["build_parser", "main"]

# One line per command: ``register(subparsers)`` adds its parser and sets ``func``.
COMMANDS = (
    models.register,
    serve.register,
    mcp.register,
    client.register,
    backfill.register,
    demo.register,
    triage.register,
    evaluate.register,
    bench.register,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memgate", description="memgate: a write gate for AI memory."
    )
    add_global_flags(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    for register in COMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except MemgateError as exc:
        print(f"memgate: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file named on the command line: no traceback for a typo
        if exc.filename is None:
            raise
        print(f"memgate: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
