"""``memgate models``: build, list and verify model artefacts.

::

    memgate models build  [--cache-dir DIR] [--source auto|hub|offline] [--embedder ID|PATH]
                          [--nli ID|PATH] [--variants fp32,int8,...] [--no-aegis] [--force]
    memgate models list   [--cache-dir DIR]
    memgate models verify [--cache-dir DIR]      exit 1 when any artefact fails its hashes
    memgate models judge  [--cache-dir DIR] [--cases F.jsonl ...] [--nli NAME] ...
                          fit the judge of the served models (engine.tuning.fit_judge)

The cache default (``$MEMGATE_HOME``, else ``~/.cache/memgate``) is the one of every command:
:func:`engine.cli.common.default_cache_dir`. This module imports nothing heavy at import time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.cli.common import HOME_ENV as _ENV_HOME
from engine.cli.common import default_cache_dir
from engine.errors import MemgateError, ModelError
from engine.runtime.layout import artefact_dir, iter_artefacts

__all__ = ["artefact_dir", "default_cache_dir", "main", "register"]


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``models`` (with ``build``, ``list``, ``verify``) to a top-level ``subparsers``.

    Each leaf sets ``func``: call ``args.func(args)`` and exit with the int it returns. The
    cache directory is ``args.cache_dir`` when either the top-level parser or the subcommand
    sets it, else :func:`default_cache_dir`.
    """
    models = subparsers.add_parser("models", help="build, list and verify model artefacts")
    sub = models.add_subparsers(dest="models_command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        # SUPPRESS: a subcommand default would overwrite a top-level ``memgate --cache-dir``.
        p.add_argument(
            "--cache-dir",
            type=Path,
            default=argparse.SUPPRESS,
            help=f"artefact cache (default: ${_ENV_HOME} or ~/.cache/memgate)",
        )

    build = sub.add_parser("build", help="export, validate, quantise and write artefacts")
    common(build)
    build.add_argument(
        "--source",
        choices=("auto", "hub", "offline"),
        default="auto",
        help="auto: hub, falling back to offline sources; hub: hub only; offline: never the hub",
    )
    build.add_argument("--embedder", default=None, help="hub id or local directory of the embedder")
    build.add_argument("--nli", default=None, help="hub id or local directory of the NLI model")
    build.add_argument(
        "--variants",
        default=None,
        help="comma-separated subset of fp32,optimized,int8,fp16,imported (default: all)",
    )
    build.add_argument("--no-aegis", action="store_true", help="do not import the aegis classifier")
    build.add_argument("--force", action="store_true", help="rebuild artefacts that are up to date")
    build.set_defaults(func=_cmd_build)

    judge = sub.add_parser(
        "judge",
        help="fit the judge (duplicates, update veto) of the served models on labelled cases",
        description="Fit the judge (engine.gate.judge) for the models the engine "
        "serves with these flags, on labelled cases (default: this checkout's labelled sets), "
        "cross-validated; writes <cache>/judges/<embedder>+<nli>.json.",
    )
    judge.add_argument("--cases", nargs="*", help="labelled JSONL sets (each a fold)")
    judge.add_argument("--trees", type=int, default=200, help="boosting rounds (default 200)")
    judge.add_argument("--json", action="store_true", help="print the fit's record as JSON")
    judge.add_argument("--quiet", action="store_true", help="no progress lines")
    judge.add_argument(
        "--force", action="store_true", help="refit even when the judge is up to date"
    )
    from engine.cli.common import add_engine_flags

    add_engine_flags(judge)
    judge.set_defaults(func=_cmd_judge)

    listing = sub.add_parser("list", help="table of artefacts and whether they verify")
    common(listing)
    listing.set_defaults(func=_cmd_list)

    verify = sub.add_parser("verify", help="re-hash every artefact; exit 1 on any mismatch")
    common(verify)
    verify.set_defaults(func=_cmd_verify)
    return models


def _cache(args: argparse.Namespace) -> Path:
    given = getattr(args, "cache_dir", None)
    return Path(given).expanduser() if given else default_cache_dir()


def _cmd_build(args: argparse.Namespace) -> int:
    from engine.pipeline.build import build_models

    variants = None
    if args.variants:
        variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    try:
        build_models(
            _cache(args),
            source=args.source,
            embedder=args.embedder,
            nli=args.nli,
            variants=variants,
            include_aegis=not args.no_aegis,
            force=args.force,
            log=lambda line: print(line, flush=True),
        )
    except MemgateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_judge(args: argparse.Namespace) -> int:
    from engine.cli.common import engine_settings
    from engine.tuning.fit_judge import command

    args.cache_dir = str(_cache(args))
    try:
        return command(args, engine_settings(args))
    except MemgateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _row(directory: Path) -> tuple[list[str], bool]:
    from engine.runtime.manifest import load_manifest

    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    rel = f"{directory.parent.name}"
    try:
        manifest = load_manifest(directory, verify=False)
    except ModelError as exc:
        return [rel, directory.name, "?", "?", f"unreadable: {exc}", _mib(size), "no"], False
    try:
        load_manifest(directory, verify=True)
        ok = True
    except ModelError:
        ok = False
    src = manifest.source
    origin = f"{src.get('kind', '?')} {src.get('id', '')}".strip()
    if src.get("revision"):
        origin += f"@{str(src['revision'])[:12]}"
    if src.get("fallback"):
        origin += " (fallback)"
    cells = [
        manifest.name,
        manifest.variant,
        manifest.task,
        manifest.weights,
        origin,
        _mib(size),
        "yes" if ok else "NO",
    ]
    return cells, ok


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _table(rows: list[list[str]]) -> str:
    head = ["NAME", "VARIANT", "TASK", "WEIGHTS", "SOURCE", "SIZE", "VERIFIED"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [head, *rows]
    )


def _cmd_list(args: argparse.Namespace) -> int:
    cache = _cache(args)
    rows = [_row(d)[0] for d in iter_artefacts(cache)] + [_judge_row(p)[0] for p in _judges(cache)]
    if not rows:
        print(f"no artefacts under {cache}: build them with `memgate models build`")
        return 0
    print(_table(rows))
    return 0


def _judges(cache: Path) -> list[Path]:
    """The judges' files under ``cache`` (``memgate models judge``), sorted."""
    from engine.gate.judge.store import JUDGES_DIR

    root = cache / JUDGES_DIR
    return sorted(p for p in root.glob("*.json") if p.is_file()) if root.is_dir() else []


def _judge_row(path: Path) -> tuple[list[str], bool]:
    from engine.gate.judge.store import load_judge

    try:
        judge = load_judge(path)
    except ModelError as exc:
        return ["judge", path.stem, "judge", "fitted", f"unreadable: {exc}", _mib(0), "NO"], False
    sets = judge.provenance.get("sets") or []
    origin = f"{len(sets)} labelled sets, {sum(int(s.get('cases', 0)) for s in sets)} cases"
    return ["judge", path.stem, "judge", "fitted", origin, _mib(path.stat().st_size), "yes"], True


def _cmd_verify(args: argparse.Namespace) -> int:
    from engine.gate.judge.store import load_judge
    from engine.runtime.manifest import load_manifest

    cache = _cache(args)
    dirs, judges = list(iter_artefacts(cache)), _judges(cache)
    if not dirs and not judges:
        print(
            f"no artefacts under {cache}: build them with `memgate models build`", file=sys.stderr
        )
        return 1
    failed = 0
    checks: list[tuple[str, Path, Callable[[Path], object]]] = [
        (f"{d.parent.name}/{d.name}", d, load_manifest) for d in dirs
    ]
    checks += [(f"judges/{p.name}", p, load_judge) for p in judges]
    for label, path, load in checks:
        try:
            load(path)
        except ModelError as exc:
            failed += 1
            print(f"MISMATCH {label}: {exc}")
        else:
            print(f"ok       {label}")
    print(f"{len(checks) - failed}/{len(checks)} artefacts verify")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m engine.cli.models models build ...`` without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="memgate")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register(subparsers)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
