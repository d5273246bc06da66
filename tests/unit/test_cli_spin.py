"""`--spin` / `--no-spin`: ONNX Runtime's intra-op spinning, set from the command line for every
command that opens the engine (the served default is `memgate serve`'s own)."""

from __future__ import annotations

import pytest

from engine.cli import build_parser
from engine.cli.common import engine_settings


def _spinning(*argv: str) -> bool:
    args = build_parser().parse_args(list(argv))
    if args.command == "serve":
        from engine.cli.serve import settings_from_args

        return bool(settings_from_args(args)[0].session.allow_spinning)
    return bool(engine_settings(args).session.allow_spinning)


@pytest.mark.parametrize(
    "command", [["serve"], ["mcp", "--namespace", "users/alice"], ["triage", "x"], ["demo"]]
)
def test_the_flag_sets_the_sessions_spinning_either_way(command: list[str]) -> None:
    assert _spinning(*command, "--spin") is True
    assert _spinning(*command, "--no-spin") is False


def test_serve_sleeps_between_model_calls_by_default_and_the_batch_commands_spin() -> None:
    # The served default was adopted by measurement (docs/experiments, 2026-12-05-spinning-default):
    # a server's parse and commit stages need the cores spinning threads would take.
    assert _spinning("serve") is False
    assert _spinning("mcp", "--namespace", "users/alice") is False  # the same server core
    assert _spinning("triage", "x") is True
    assert _spinning("demo") is True


def test_backfill_settles_spinning_by_engine_unless_the_flag_says() -> None:
    from engine.cli.backfill import LOCAL_SPIN

    args = build_parser().parse_args(["backfill", "--input", "facts.jsonl"])
    assert args.spin is None  # unset: the local job and Ray settle it
    assert engine_settings(args, spin=LOCAL_SPIN).session.allow_spinning is False
    assert engine_settings(args).session.allow_spinning is True  # Ray's bare triage calls
    flagged = build_parser().parse_args(["backfill", "--input", "facts.jsonl", "--spin"])
    assert engine_settings(flagged, spin=LOCAL_SPIN).session.allow_spinning is True
    flagged = build_parser().parse_args(["backfill", "--input", "facts.jsonl", "--no-spin"])
    assert engine_settings(flagged).session.allow_spinning is False
