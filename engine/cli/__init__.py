"""``memgate``: the one console script.

One module per command, the flags they share in :mod:`engine.cli.common`::

    engine.cli._main     build_parser / main: registers every command, in one list
      -> engine.cli.{demo, triage, evaluate, serve, client, backfill, bench}, engine.cli.models
           -> engine.cli.common (flags, cache default, client factory; imports no command)

This package's ``__init__`` imports nothing at import time (``main`` and ``build_parser`` load
``engine.cli._main`` when called), so any module may import :mod:`engine.cli.common` without
pulling in every command, and no import here is circular.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from engine.cli._main import build_parser as build

    return build()


def main(argv: Sequence[str] | None = None) -> int:
    from engine.cli._main import main as run

    return run(argv)
