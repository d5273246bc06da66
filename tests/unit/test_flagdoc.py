"""The README's `memgate serve` flag table is the parser's own (issue 32: defaults drifted)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.cli.flagdoc import BEGIN, END, command_parser, flag_table, with_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_serve_table_is_the_generated_one() -> None:
    text = README.read_text("utf-8")
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].lstrip("\n")
    assert table == flag_table(command_parser("serve")), (
        "README's serve flags are stale: run `python -m engine.cli.flagdoc --write README.md`"
    )


def test_every_serve_flag_has_a_row_and_a_help_text() -> None:
    parser = command_parser("serve")
    rows = flag_table(parser).splitlines()[2:]
    options = [a for a in parser._actions if a.option_strings and "-h" not in a.option_strings]
    assert len(rows) == len(options)
    assert all(a.help for a in options), [a.option_strings for a in options if not a.help]


def test_defaults_render_as_the_parser_holds_them() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=7, help="a number")
    p.add_argument("--on", action="store_true", help="a switch")
    p.add_argument("--mode", choices=["a", "b"], default="a", help="x | y")
    p.add_argument("--env", help="where (default: $X or y)")
    rows = flag_table(p).splitlines()
    assert rows[2] == "| `--n` | `7` | a number |"
    assert rows[3] == "| `--on` | off | a switch |"
    assert rows[4] == "| `--mode` a\\|b | `a` | x \\| y |"
    assert rows[5] == "| `--env` | see help | where (default: $X or y) |"


def test_with_table_replaces_only_the_marked_block() -> None:
    text = f"head\n{BEGIN}\nold\n{END}\ntail\n"
    assert with_table(text, "new\n") == f"head\n{BEGIN}\nnew\n{END}\ntail\n"
    with pytest.raises(ValueError):
        with_table("no markers", "new\n")


def test_the_delay_door_default_is_one_across_the_flag_and_both_settings() -> None:
    """Off (0 ms / None) in the serve flag, ServerSettings and CoreSettings alike
    (docs/experiments/2026-12-05-default-door.md)."""
    from engine.core.engine import CoreSettings
    from engine.server.server import ServerSettings

    flag_ms = command_parser("serve").parse_args([]).max_queue_delay_ms
    shipped = ServerSettings().max_queue_delay_s
    assert flag_ms == (shipped or 0.0) * 1000
    assert CoreSettings().max_queue_delay_s == shipped
