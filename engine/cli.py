"""``memgate``: the one console script. The only module that reads the environment."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.errors import MemgateError
from engine.gate.policy import POLICY_NAMES

__all__ = ["main"]


def _default_cache() -> Path:
    return Path(os.environ.get("MEMGATE_HOME", Path.home() / ".cache" / "memgate"))


def _engine_settings(args: argparse.Namespace) -> Any:
    from engine.app import EngineSettings
    from engine.runtime.loader import ModelChoice
    from engine.runtime.session import SessionSettings

    return EngineSettings(
        data_dir=Path(args.data_dir),
        cache_dir=Path(args.cache_dir),
        models=ModelChoice(
            embedder_variant=args.embedder_variant,
            nli=args.nli,
            nli_variant=args.nli_variant,
            allow_random_weights=args.allow_random_weights,
        ),
        session=SessionSettings(device=args.device, intra_op_threads=args.threads),
    )


def _add_engine_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        default=os.environ.get("MEMGATE_DATA", "memgate-data"),
        help="directory of the store (default: $MEMGATE_DATA or ./memgate-data)",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0 = all cores)")
    p.add_argument("--nli", default="auto", help="NLI artefact name, or auto")
    p.add_argument("--nli-variant", default="auto")
    p.add_argument("--embedder-variant", default="fp32")
    p.add_argument(
        "--allow-random-weights",
        action="store_true",
        help="serve a random-initialised NLI model (speed work only)",
    )


def _print_decision(d: Any, show_candidates: int = 3) -> None:
    target = f" -> {d.target_id}" if d.target_id else ""
    print(f"[{d.action.upper():7}] {d.fact.text!r}{target}  (rule: {d.rule})")
    if d.hypothesis:
        print(f"          NLI hypothesis: {d.hypothesis!r}")
    for c in d.candidates[:show_candidates]:
        contra = "  -  " if c.contradiction is None else f"{c.contradiction:.3f}"
        print(
            f"          sim {c.similarity:.3f}  contradiction {contra}  {c.reason:<22} {c.text!r}"
        )


def cmd_demo(args: argparse.Namespace) -> int:
    from engine.app import open_engine
    from engine.types import Fact

    with (
        tempfile.TemporaryDirectory() as tmp,
        open_engine(_engine_settings(args), db_path=Path(tmp) / "demo.db") as eng,
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
                _print_decision(d)
    return 0


def cmd_triage(args: argparse.Namespace) -> int:
    from engine.app import open_engine
    from engine.facts import read_facts

    facts = list(read_facts(args.file))
    with open_engine(_engine_settings(args)) as eng:
        result = eng.gate.triage(facts, args.policy, apply=args.apply)
    for d in result.decisions:
        if args.json:
            print(
                json.dumps(
                    {
                        "action": d.action,
                        "target": d.target_id,
                        "rule": d.rule,
                        "memory_id": d.memory_id,
                        "text": d.fact.text,
                    }
                )
            )
        else:
            _print_decision(d)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from engine.app import open_engine
    from engine.evaluate import load_cases, predict

    cases = load_cases(Path(args.cases))
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_engine(_engine_settings(args), db_path=Path(tmp) / "eval.db") as eng,
    ):
        overrides = json.loads(args.overrides) if args.overrides else None
        from engine.gate.policy import policy_by_name

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


def _benchmarks_dir(explicit: str | None) -> tuple[Path | None, list[Path]]:
    """The repository's benchmarks/ folder (not part of the installed package): ``explicit``,
    else ``$MEMGATE_BENCHMARKS``, else next to the ``engine`` package in a source checkout,
    else ./benchmarks. Returns it (or None) and the places looked at."""
    candidates = [Path(explicit)] if explicit else []
    if not explicit and os.environ.get("MEMGATE_BENCHMARKS"):
        candidates.append(Path(os.environ["MEMGATE_BENCHMARKS"]))
    if not explicit:
        candidates += [Path(__file__).resolve().parent.parent / "benchmarks", Path("benchmarks")]
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
        argv += ["--eval-dir", args.eval_dir] if args.eval_dir else []
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


def _add_bench_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="run the benchmark suite (one JSON, one report with plots); `bench compare A B`",
        description="Run the benchmark suite: each part as a subprocess, one suite JSON and one "
        "Markdown report with plots in benchmarks/results/suite-<utc>/. Needs the source "
        "checkout (benchmarks/ is not installed) and the bench and export extras.",
    )
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
    p.add_argument("--eval-dir", help="the shared eval set (default: ../shared/eval)")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memgate", description=__doc__)
    parser.add_argument(
        "--cache-dir",
        default=str(_default_cache()),
        help="model artefact cache (default: $MEMGATE_HOME or ~/.cache/memgate)",
    )
    parser.add_argument("--log-level", default=os.environ.get("MEMGATE_LOG", "WARNING"))
    sub = parser.add_subparsers(dest="command", required=True)

    from engine.pipeline.cli import register as register_models

    register_models(sub)
    from engine.server.cli import register as register_server

    register_server(sub)
    from engine.backfill.cli import register as register_backfill

    register_backfill(sub)

    p = sub.add_parser("demo", help="triage the Denver -> Chicago and cello examples")
    _add_engine_flags(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("triage", help="decide a JSON Lines file of facts (dry run by default)")
    p.add_argument("file")
    p.add_argument("--policy", choices=list(POLICY_NAMES), default="strict")
    p.add_argument("--apply", action="store_true", help="commit the decisions to the store")
    p.add_argument("--json", action="store_true")
    _add_engine_flags(p)
    p.set_defaults(func=cmd_triage)

    p = sub.add_parser("eval", help="predict labelled/unlabelled gate cases (shared eval format)")
    p.add_argument("--cases", required=True)
    p.add_argument("--policy", choices=list(POLICY_NAMES), default="strict")
    p.add_argument("--out", help="predictions.jsonl (default: stdout)")
    p.add_argument("--overrides", help='JSON of policy overrides, e.g. {"normalize": false}')
    p.add_argument("--explain", action="store_true", help="add rule and candidates to each line")
    _add_engine_flags(p)
    p.set_defaults(func=cmd_eval)

    _add_bench_parser(sub)
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
