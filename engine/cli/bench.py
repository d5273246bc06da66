"""``memgate bench``: run the benchmark suite of a source checkout, or compare two runs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from engine.cli.common import add_cache_flag

__all__ = ["register"]


def _benchmarks_dir(explicit: str | None) -> tuple[Path | None, list[Path]]:
    """The repository's benchmarks/ folder (not part of the installed package): ``explicit``,
    else ``$MEMGATE_BENCHMARKS``, else next to the ``engine`` package in a source checkout,
    else ./benchmarks. Returns it (or None) and the places looked at."""
    candidates = [Path(explicit)] if explicit else []
    if not explicit and os.environ.get("MEMGATE_BENCHMARKS"):
        candidates.append(Path(os.environ["MEMGATE_BENCHMARKS"]))
    if not explicit:
        candidates += [Path(__file__).resolve().parents[2] / "benchmarks", Path("benchmarks")]
    for path in candidates:
        if (path / "suite.py").is_file() and (path / "compare.py").is_file():
            return path.resolve(), candidates
    return None, candidates


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib.util

    where, looked = _benchmarks_dir(args.benchmarks)
    if where is None:
        print(
            "memgate bench: no benchmarks/ folder with suite.py found (looked in: "
            + ", ".join(str(p) for p in looked)
            + "). The benchmark scripts ship with the source checkout, not the installed "
            "package: run from a clone of the repository, or pass --benchmarks DIR.",
            file=sys.stderr,
        )
        return 2
    if args.bench_command == "compare":
        name = "compare"
        argv = [args.old, args.new, "--threshold", str(args.threshold)]
        argv += ["--changed"] if args.changed else []
    else:
        name = "suite"
        argv = ["--parts", args.parts, "--threads", str(args.threads)]
        argv += ["--cache-dir", args.cache_dir, "--part-timeout", str(args.part_timeout)]
        argv += ["--quick"] if args.quick else ["--smoke"] if args.smoke else []
        argv += ["--out", args.out] if args.out else []
        argv += ["--quality-cases", args.quality_cases] if args.quality_cases else []
        argv += ["--dry-run"] if args.dry_run else []
    sys.path.insert(0, str(where))  # the scripts import their helpers (_common, report)
    spec = importlib.util.spec_from_file_location(f"memgate_bench_{name}", where / f"{name}.py")
    if spec is None or spec.loader is None:
        print(f"memgate bench: cannot load {where / name}.py", file=sys.stderr)
        return 2
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return int(module.main(argv))


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="run the benchmark suite (one JSON, one report with plots); `bench compare A B`",
        description="Run the benchmark suite: each part as a subprocess, one suite JSON and one "
        "Markdown report with plots in benchmarks/results/suite-<utc>/. Needs the source "
        "checkout (benchmarks/ is not installed) and the bench and export extras.",
    )
    add_cache_flag(p, inner=True)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="quick mode (tens of minutes)")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes; the figures mean nothing")
    p.add_argument(
        "--parts",
        default="all",
        help="comma-separated: runtime,gate,grpc,backfill,quality,gpu (default: all)",
    )
    p.add_argument("--out", help="where suite-<utc>/ goes (default: benchmarks/results)")
    p.add_argument("--threads", type=int, default=2, help="threads of every compute pool")
    p.add_argument(
        "--quality-cases",
        help="labelled cases for the quality part (default: benchmarks/data/heldout17.jsonl)",
    )
    p.add_argument(
        "--part-timeout", type=float, default=0.0, help="seconds per part before it is stopped"
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan and its duration only")
    p.add_argument("--benchmarks", help="the repository's benchmarks/ folder, if not found")
    p.set_defaults(func=cmd_bench, bench_command=None)
    bench_sub = p.add_subparsers(dest="bench_command")
    c = bench_sub.add_parser("compare", help="the ratio new/old of every figure of two runs")
    c.add_argument("old", help="the reference run: suite.json, its folder, or a script's JSON")
    c.add_argument("new", help="the run to judge")
    c.add_argument("--threshold", type=float, default=0.05, help="flag changes beyond this")
    c.add_argument("--changed", action="store_true", help="print only the flagged figures")
