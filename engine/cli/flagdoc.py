"""The flag tables of the docs, rendered from the commands' own parsers, so a default in the
README cannot drift from the code (``tests/unit/test_flagdoc.py`` compares them).

``python -m engine.cli.flagdoc serve`` prints the Markdown table of ``memgate serve``;
``python -m engine.cli.flagdoc --write README.md`` rewrites the table between the file's
``<!-- serve-flags:begin ... -->`` and ``<!-- serve-flags:end -->`` markers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["BEGIN", "END", "command_parser", "flag_table", "main", "with_table"]

BEGIN = "<!-- serve-flags:begin (generated: python -m engine.cli.flagdoc serve) -->"
END = "<!-- serve-flags:end -->"


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``memgate NAME``."""
    from engine.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            sub: argparse.ArgumentParser = action.choices[name]
            return sub
    raise KeyError(f"no command {name!r}")


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "off"  # the flag is not given
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if action.default else "off"
    if action.default is None or action.default == argparse.SUPPRESS:
        return "-"
    return f"`{action.default}`"


def _flag(action: argparse.Action) -> str:
    names = " / ".join(f"`{s}`" for s in action.option_strings)
    if action.choices and not isinstance(action, argparse.BooleanOptionalAction):
        names += " " + "\\|".join(str(c) for c in action.choices)
    return names


def flag_table(parser: argparse.ArgumentParser, *, skip: Sequence[str] = ("-h",)) -> str:
    """One Markdown row per option of ``parser``: flag, default, help (environment-dependent
    defaults such as the cache directory are rendered as their help says, not as this machine's
    value)."""
    rows = ["| flag | default | what it does |", "|---|---|---|"]
    for action in parser._actions:
        if not action.option_strings or set(action.option_strings) & set(skip):
            continue
        help_text = (action.help or "").replace("|", "\\|").replace("\n", " ")
        default = "see help" if "(default:" in help_text else _default(action)
        rows.append(f"| {_flag(action)} | {default} | {help_text} |")
    return "\n".join(rows) + "\n"


def between(text: str, begin: str, end: str, block: str) -> str:
    """``text`` with what lies between the markers ``begin`` and ``end`` replaced by ``block``
    (the generated blocks of the README and the docs)."""
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not (sep and sep2):
        raise ValueError(f"no {begin} ... {end} markers")
    return f"{head}{begin}\n{block}{end}{tail}"


def with_table(text: str, table: str) -> str:
    """``text`` with the block between :data:`BEGIN` and :data:`END` replaced by ``table``."""
    return between(text, BEGIN, END, table)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv) or ["serve"]
    if args[0] == "--write":
        path = Path(args[1])
        path.write_text(with_table(path.read_text("utf-8"), flag_table(command_parser("serve"))))
        return 0
    sys.stdout.write(flag_table(command_parser(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
