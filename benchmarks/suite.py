"""The benchmark suite: every benchmark (or the chosen ones) in one command, one JSON, one report.

    memgate bench --quick                       # the whole suite, quick mode
    memgate bench --parts runtime,quality       # chosen parts, full mode
    python benchmarks/suite.py --smoke          # tiny sizes: checks the plumbing only
    memgate bench compare OLD/suite.json NEW/suite.json

Each part is its benchmark script run as a subprocess with the same flags (``--quick`` /
``--smoke``, ``--threads``, ``--cache-dir``) and its own output folder, so a crash, a timeout or
the OOM killer ends that part only: the suite records why and goes on. Their output is streamed
with a ``[part]`` prefix and kept in ``<part>/log.txt``. At the end the suite writes

* ``benchmarks/results/suite-<utc>/suite.json``: git sha and dirty flag, date, machine (CPU model,
  cores, ISA flags, memory, library versions, load), the model manifests' hashes, the settings,
  then per part its status, duration, command and the script's whole JSON (or the reason it was
  skipped or failed), and the summary figures;
* ``benchmarks/results/suite-<utc>/report.md``: the summary table (headline figure of each part,
  its target, met or missed, same-run ratio or absolute), then tables and plots per part.

Parts: ``runtime`` (bench_runtime.py), ``gate`` (bench_gate.py), ``grpc`` (bench_grpc.py),
``backfill`` (bench_backfill.py; in quick mode on 1,000 facts), ``quality`` (bench_quality.py:
both policies for each real NLI model on a held-out set of benchmarks/data), ``scale``
(bench_scale.py: PostgreSQL vs SQLite) and ``gpu`` (bench_runtime.py
``--device cuda``; skipped with a line saying why when onnxruntime has no CUDA provider).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    RESULTS,
    ROOT,
    default_cache_dir,
    dump_json,
    manifest_summary,
    others_cpu,
    run_header,
    table,
    utc_stamp,
)

__all__ = ["PARTS", "Plan", "main", "parse_args", "plan_part", "select_parts"]

BENCH = Path(__file__).resolve().parent
PARTS = ("runtime", "gate", "grpc", "backfill", "quality", "scale", "gpu")
SCRIPTS = {
    "runtime": "bench_runtime.py",
    "gate": "bench_gate.py",
    "grpc": "bench_grpc.py",
    "backfill": "bench_backfill.py",
    "quality": "bench_quality.py",
    "scale": "bench_scale.py",
    "gpu": "bench_runtime.py",
}
# Rough seconds per part on a quiet 2-core machine, used until a run of the same mode has been
# measured in the output folder (then that run's durations are used).
TYPICAL_S = {
    "smoke": {
        "runtime": 120,
        "gate": 150,
        "grpc": 60,
        "backfill": 60,
        "quality": 45,
        "scale": 90,
        "gpu": 120,
    },
    "quick": {
        "runtime": 240,
        "gate": 480,
        "grpc": 120,
        "backfill": 240,
        "quality": 180,
        "scale": 600,
        "gpu": 180,
    },
    "full": {
        "runtime": 600,
        "gate": 5400,
        "grpc": 360,
        "backfill": 14400,
        "quality": 180,
        "scale": 1200,
        "gpu": 600,
    },
}
# Quick mode's backfill: the script's own --quick (10,000 facts) takes most of an hour on 2 cores.
QUICK_BACKFILL = ["--facts", "1000", "--namespaces", "10"]
SMOKE_CASES = 12
NEEDS_TORCH = ("runtime", "gate", "gpu")
ARTEFACTS: dict[str, list[tuple[str, str]]] = {
    "runtime": [("minilm", v) for v in ("fp32", "optimized", "int8")]
    + [("nli-deberta-v3-small", v) for v in ("fp32", "int8")],
    "gate": [("minilm", "fp32"), ("aegis-nli", "imported"), ("nli-deberta-v3-small", "int8")],
    "scale": [("minilm", "fp32"), ("aegis-nli", "imported")],
    "gpu": [("minilm", v) for v in ("fp32", "fp16")]
    + [("nli-deberta-v3-small", v) for v in ("fp32", "fp16")],
    "grpc": [("minilm", "fp32")],
    "backfill": [("minilm", "fp32")],
    "quality": [("minilm", "fp32")],
}


@dataclass
class Plan:
    """What the suite will do for one part."""

    part: str
    command: list[str] | None
    """None: the part is skipped (``reason`` says why)."""
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    estimate_s: float = 0.0


# -- arguments ------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="memgate bench",
        description=__doc__.split("\n\n")[0],
        epilog="Compare two runs: memgate bench compare OLD.json NEW.json",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="quick mode: tens of minutes on 2 cores")
    mode.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes to check the plumbing; figures mean nothing",
    )
    p.add_argument(
        "--parts",
        default="all",
        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)",
    )
    p.add_argument("--out", type=Path, default=RESULTS, help="where suite-<utc>/ is written")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache_dir(),
        help="model cache (default: $MEMGATE_HOME or ~/.cache/memgate)",
    )
    p.add_argument("--threads", type=int, default=2, help="threads of every compute pool")
    p.add_argument(
        "--quality-cases",
        type=Path,
        default=ROOT / "benchmarks" / "data" / "heldout17.jsonl",
        help="labelled cases for the quality part (default: heldout17, never fitted on)",
    )
    p.add_argument(
        "--part-timeout",
        type=float,
        default=0.0,
        help="seconds before a part is stopped and reported as timed out (0: no limit)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan and its expected duration only"
    )
    return p.parse_args(argv)


def mode_of(args: argparse.Namespace) -> str:
    return "smoke" if args.smoke else "quick" if args.quick else "full"


def select_parts(spec: str) -> list[str]:
    """``"runtime,quality"`` -> the parts in suite order; ``all`` -> every part."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names or names == ["all"]:
        return list(PARTS)
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")
    return [p for p in PARTS if p in names]


# -- what each part needs -------------------------------------------------------------------
def _manifest(cache: Path, name: str, variant: str) -> dict[str, Any] | None:
    try:
        raw = json.loads((cache / "models" / name / variant / "manifest.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def artefacts(cache: Path) -> list[tuple[str, str]]:
    root = cache / "models"
    if not root.is_dir():
        return []
    return sorted((m.parent.parent.name, m.parent.name) for m in root.glob("*/*/manifest.json"))


def nli_models(cache: Path) -> tuple[list[str], list[str]]:
    """(NLI artefact names with real weights, names built only from random weights)."""
    weights: dict[str, set[str]] = {}
    for name, variant in artefacts(cache):
        raw = _manifest(cache, name, variant)
        if raw is not None and raw.get("task") == "nli":
            weights.setdefault(name, set()).add(str(raw.get("weights", "pretrained")))
    real = sorted(n for n, w in weights.items() if "pretrained" in w)
    random = sorted(n for n, w in weights.items() if "pretrained" not in w)
    return real, random


def cuda_providers() -> tuple[bool, list[str]]:
    try:
        import onnxruntime as ort
    except ImportError:
        return False, []
    providers = list(ort.get_available_providers())
    return "CUDAExecutionProvider" in providers, providers


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def plan_part(
    part: str,
    args: argparse.Namespace,
    part_dir: Path,
    *,
    cuda: tuple[bool, list[str]] | None = None,
) -> Plan:
    """The command for ``part``, or why it is skipped. ``cuda`` (available, providers) is
    looked up when not given."""
    mode = mode_of(args)
    cache = Path(args.cache_dir)
    script = [sys.executable, str(BENCH / SCRIPTS[part])]
    flags = {"smoke": ["--smoke"], "quick": ["--quick"], "full": []}[mode]
    out = ["--out", str(part_dir), "--cache-dir", str(cache)]
    threads = ["--threads", str(args.threads)]
    plan = Plan(part, None)

    if part == "gpu":
        available, providers = cuda if cuda is not None else cuda_providers()
        if not available:
            listed = ", ".join(providers) or "none"
            plan.reason = f"GPU section skipped: no CUDA provider (providers: {listed})"
            return plan
    missing = [f"{n}/{v}" for n, v in ARTEFACTS.get(part, []) if not _manifest(cache, n, v)]
    if missing:
        plan.reason = (
            f"{part} skipped: model artefacts missing in {cache}: {', '.join(missing)} "
            "(run `make models`)"
        )
        return plan
    if part in NEEDS_TORCH and not (_has("torch") and _has("sentence_transformers")):
        plan.reason = (
            f"{part} skipped: its PyTorch baseline needs the export extra "
            "(torch, sentence-transformers): make setup"
        )
        return plan
    real, random = nli_models(cache)
    if part in ("grpc", "backfill", "quality") and not real:
        plan.reason = (
            f"{part} skipped: no NLI model with real weights in {cache} "
            f"(random-weight ones: {', '.join(random) or 'none'})"
        )
        return plan

    if part == "runtime":
        plan.command = [*script, *flags, *threads, *out]
    elif part == "gpu":
        plan.command = [*script, "--device", "cuda", *flags, *threads, *out]
    elif part == "gate":
        plan.command = [*script, *flags, *threads, *out]
    elif part == "scale":
        if not (_has("psycopg") and _has("psycopg_pool")):
            plan.reason = "scale skipped: the PostgreSQL store needs the postgres extra"
            return plan
        plan.command = [*script, *flags, *threads, *out]
    elif part == "grpc":
        plan.command = [*script, *flags, *out]
        plan.notes.append("the server uses every usable core (bench_grpc has no --threads)")
    elif part == "backfill":
        size = QUICK_BACKFILL if mode == "quick" else []
        plan.command = [*script, *flags, *size, *threads, *out]
        if size:
            plan.notes.append(
                "quick mode runs the backfill on 1,000 facts over 10 namespaces (the script's own "
                "--quick is 10,000 facts)"
            )
    elif part == "quality":
        cases = Path(args.quality_cases)
        if not cases.is_file():
            plan.reason = f"quality skipped: no labelled cases at {cases} (--quality-cases FILE)"
            return plan
        limit = ["--limit", str(SMOKE_CASES)] if mode == "smoke" else []
        plan.command = [
            *script,
            "--configs",
            "strict",
            "review",
            "--nli",
            *real,
            "--cases",
            str(cases),
            *limit,
            *threads,
            *out,
        ]
        plan.notes += [
            f"{name}: random-initialised weights only, skipped: quality is meaningless for it"
            for name in random
        ]
        if limit:
            plan.notes.append(f"smoke mode: the first {SMOKE_CASES} cases only")
    return plan


# -- estimate -------------------------------------------------------------------------------
def previous_durations(out: Path, mode: str) -> tuple[dict[str, float], str]:
    """Durations of the parts of the latest suite run of ``mode`` in ``out`` (and its date)."""
    for path in sorted(Path(out).glob("suite-*/suite.json"), reverse=True):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (doc.get("settings") or {}).get("mode") != mode:
            continue
        got = {
            name: float(rec["seconds"])
            for name, rec in (doc.get("parts") or {}).items()
            if rec.get("status") == "ok" and isinstance(rec.get("seconds"), int | float)
        }
        if got:
            return got, str(doc.get("started_at", path.parent.name))
    return {}, ""


def _show(command: Sequence[str]) -> str:
    """A command line for people: the interpreter left out, paths under the repository short."""
    return shlex.join(command[1:]).replace(f"{ROOT}{os.sep}", "")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


# -- running a part -------------------------------------------------------------------------
def _stop(proc: subprocess.Popen[str]) -> None:
    """End the part and everything it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 15.0)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def run_part(
    plan: Plan, part_dir: Path, cache: Path, timeout: float
) -> tuple[dict[str, Any], bool]:
    """Run one part, streaming its output; returns its record and whether it was interrupted."""
    assert plan.command is not None
    part_dir.mkdir(parents=True, exist_ok=True)
    log = part_dir / "log.txt"
    env = dict(os.environ)
    env.update(
        PYTHONUNBUFFERED="1",
        MEMGATE_HOME=str(cache),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")])),
    )
    tail: deque[str] = deque(maxlen=20)
    interrupted = False
    status, reason = "ok", ""
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as logf:
        logf.write(f"$ {shlex.join(plan.command)}\n")
        proc = subprocess.Popen(
            plan.command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            env=env,
            start_new_session=True,  # a group of its own: stopping it stops its servers too
        )
        assert proc.stdout is not None
        stream = proc.stdout

        def pump() -> None:
            with contextlib.suppress(ValueError, OSError):  # the pipe closed under it
                for line in stream:
                    logf.write(line)
                    logf.flush()
                    text = line.rstrip("\n").split("\r")[-1]
                    tail.append(text)
                    print(f"[{plan.part}] {text}", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc: int | None = proc.wait(timeout=timeout or None)
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc, status = None, "timeout"
            reason = f"stopped after the part timeout of {timeout:.0f} s"
        except KeyboardInterrupt:
            _stop(proc)
            rc, status, interrupted = None, "interrupted", True
            reason = "interrupted (Ctrl-C)"
        reader.join(10)
        if reader.is_alive():  # something the part started still holds its output open
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            reader.join(5)
        stream.close()
    seconds = time.monotonic() - t0
    if rc is not None and rc < 0:
        status = "failed"
        reason = f"killed by {_signal_name(rc)}" + (
            " (out of memory? the kernel's OOM killer sends SIGKILL)"
            if rc == -signal.SIGKILL
            else ""
        )
    elif rc:
        status, reason = "failed", f"exited with status {rc}"
    rec: dict[str, Any] = {
        "status": status,
        "seconds": round(seconds, 1),
        "command": plan.command,
        "log": str(log.relative_to(part_dir.parent)),
        "notes": plan.notes,
    }
    if status == "ok":
        found = sorted(
            (p for p in part_dir.glob("*.json")), key=lambda p: p.stat().st_mtime, reverse=True
        )
        if not found:
            status, reason = "failed", "exited normally but wrote no JSON"
        else:
            try:
                rec["result"] = json.loads(found[0].read_text(encoding="utf-8"))
                rec["json"] = str(found[0].relative_to(part_dir.parent))
            except (OSError, ValueError) as exc:
                status, reason = "failed", f"its JSON {found[0].name} is unreadable: {exc}"
        rec["plots"] = sorted(str(p.relative_to(part_dir.parent)) for p in part_dir.glob("*.png"))
    rec["status"] = status
    if status != "ok":
        rec["reason"] = reason
        rec["log_tail"] = list(tail)
    return rec, interrupted


# -- the suite ------------------------------------------------------------------------------
def _command_line(argv: Sequence[str] | None) -> str:
    prog = Path(sys.argv[0]).name
    if prog in ("memgate", "__main__.py"):  # called by `memgate bench`: what the user typed
        return shlex.join(["memgate", *sys.argv[1:]])
    return shlex.join(["python", "benchmarks/suite.py", *(sys.argv[1:] if argv is None else argv)])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        parts = select_parts(args.parts)
    except ValueError as exc:
        print(f"memgate bench: {exc}", file=sys.stderr)
        return 2
    try:
        import psutil  # noqa: F401 - the machine record needs it
    except ImportError:
        print("memgate bench needs the bench extra: pip install 'memgate[bench]'", file=sys.stderr)
        return 2
    import report

    mode = mode_of(args)
    cache = Path(args.cache_dir)
    stamp = utc_stamp()
    suite_dir = Path(args.out) / f"suite-{stamp}"
    cuda = cuda_providers()
    plans = [plan_part(p, args, suite_dir / p, cuda=cuda) for p in parts]
    before, when = previous_durations(Path(args.out), mode)
    for plan in plans:
        if plan.command is not None:
            plan.estimate_s = before.get(plan.part, TYPICAL_S[mode][plan.part])
    total = sum(p.estimate_s for p in plans)
    source = (
        f"durations of the {mode} run of {when} where measured, else typical quiet 2-core figures"
        if before
        else "typical figures on a quiet 2-core machine"
    )
    print(f"memgate bench: {mode} mode, {len(parts)} part(s), output {suite_dir}")
    for plan in plans:
        if plan.command is None:
            print(f"  {plan.part:<9} {plan.reason}")
        else:
            print(f"  {plan.part:<9} ~{_minutes(plan.estimate_s):>7}  {_show(plan.command)}")
        for note in plan.notes:
            print(f"  {'':<9} note: {note}")
    print(f"expected duration: about {_minutes(total)} ({source}); a busy machine takes longer")
    if args.dry_run:
        return 0

    header = run_header("suite", args)
    header["settings"] = {
        "mode": mode,
        "parts": parts,
        "threads": args.threads,
        "cache_dir": str(cache),
        "out": str(args.out),
        "quality_cases": str(args.quality_cases),
        "part_timeout_s": args.part_timeout,
        "command": _command_line(argv),
    }
    header["manifests"] = manifest_summary(cache, artefacts(cache))
    header["estimate_s"] = {p.part: p.estimate_s for p in plans if p.command is not None}
    suite_dir.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict[str, Any]] = {}
    interrupted = False
    runnable = [p for p in plans if p.command is not None]
    for plan in plans:
        if plan.command is None:
            records[plan.part] = {"status": "skipped", "reason": plan.reason, "notes": plan.notes}
            continue
        if interrupted:
            records[plan.part] = {"status": "not run", "reason": "the suite was interrupted"}
            continue
        n = runnable.index(plan) + 1
        print(
            f"\n== [{n}/{len(runnable)}] {plan.part} (expected ~{_minutes(plan.estimate_s)}) ==",
            flush=True,
        )
        rec, interrupted = run_part(plan, suite_dir / plan.part, cache, args.part_timeout)
        records[plan.part] = rec
        verdict = rec["status"] + (f": {rec['reason']}" if rec.get("reason") else "")
        print(f"== {plan.part}: {verdict} in {_minutes(rec['seconds'])}", flush=True)

    summary = [
        h.record()
        for name, rec in records.items()
        if rec.get("status") == "ok"
        for h in report.headlines(name, rec.get("result") or {})
    ]
    suite = {
        "suite_format": 1,
        **header,
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "cpu_used_during_run": others_cpu(),
        "summary": summary,
        "parts": records,
    }
    path = suite_dir / "suite.json"
    dump_json(path, suite)
    md = report.render(suite, suite_dir)

    not_ok = [(name, rec) for name, rec in records.items() if rec.get("status") != "ok"]
    rows = [
        [
            h["part"],
            h["figure"],
            h["text"],
            h["target"],
            "" if h["met"] is None else "met" if h["met"] else "MISSED",
            report.KINDS.get(h["kind"], h["kind"]),
        ]
        for h in summary
    ] + [[name, f"({rec.get('status')}: see below)", "", "", "", ""] for name, rec in not_ok]
    print()
    print(table(["part", "figure", "value", "target", "verdict", "kind"], rows, title="Summary"))
    for name, rec in not_ok:
        print(f"{name}: {rec.get('status')}: {rec.get('reason', '')}")
    print(f"\nreport: {md}\nJSON:   {path}")
    print(f"compare with another run: memgate bench compare OTHER/suite.json {path}")
    if interrupted:
        return 130
    return 1 if any(r.get("status") in ("failed", "timeout") for r in records.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
