"""Compare two benchmark runs: the ratio new / old of every figure, so a change is judged by its
effect.

    python benchmarks/compare.py OLD.json NEW.json [--threshold 0.05] [--changed]
    memgate bench compare OLD.json NEW.json

Either file is a suite JSON (``suite-<utc>/suite.json``, or the directory holding it) or one
script's JSON (``bench_runtime-<utc>.json`` ...). Both are flattened to their numeric leaves
under stable keys (``runtime.nli.ort int8 (all).32.items_per_s``: list items are keyed by their
label, name or config, not their position) and every key found in both is printed with
``new / old``. Each figure is marked with its kind:

* ``ratio``: a same-run ratio (memgate / PyTorch, served / in-process, x batch 32): both sides
  were measured minutes apart on the same machine, so it survives a noisy machine;
* ``abs``: an absolute figure (items/s, ms, MB): it moves with the machine and its load;
* ``exact``: deterministic for given code, models and data (quality metrics, NLI pairs per
  fact, int8 drift, action counts): any change is a change of behaviour, not noise.

Changes beyond ``--threshold`` (default 5%) are flagged with ``*``. The exit status is 0 unless
an input cannot be read.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Row",
    "Unreadable",
    "classify",
    "compare",
    "cpu_mismatch",
    "flatten",
    "flatten_run",
    "headline_rows",
    "load_run",
    "main",
    "render",
]

# Run metadata and settings: not figures.
SKIP = {
    "machine",
    "settings",
    "git",
    "manifests",
    "models",
    "started_at",
    "finished_at",
    "time",
    "load_average_at_start",
    "load_average_at_end",
    "cpu_used_during_run",
    "command",
    "overrides",
    "notes",
    "note",
    "plot",
    "plots",
    "summary",
    "estimate_s",
    "reference_pytorch_facts_per_s",
    "quantisation",
    "scale",
    "runs",  # every warm pass; the best one is the headline
    "pytorch_runs",
    "incoming_kinds",
}
# Sizes and counters that a run is set to, not figures it measures.
BOOKKEEPING = {
    "items",
    "seconds",
    "facts",
    "memories",
    "namespaces",
    "per_namespace",
    "queries",
    "sentences",
    "floor",
    "target",
    "batch",
    "cases",
    "trap_cases",
    "threads",
    "allow_spinning",
    "calls",
    "ok_calls",
    "ok_facts",
    "overload_offered_x",
    "offered",
    "chunk",
    "padded_tokens",
    "start_rss_mb",
    "skipped_batch_sizes",
    "seed",
}
# Keys that identify an item of a list of records, in order of preference.
ID_FIELDS = (("config", "nli"), ("label",), ("name",), ("way",), ("config",), ("phase",))
# The benchmark name of a script's JSON -> the suite's part name.
PARTS = {
    "bench_runtime": "runtime",
    "bench_gate": "gate",
    "bench_grpc": "grpc",
    "bench_backfill": "backfill",
    "quality": "quality",
}
_RATIO = re.compile(r"ratio|(^|[^a-z])vs([^a-z]|$)|_over_|share|ceiling")
_EXACT = re.compile(
    r"(^|\.)(drift[^.]*|actions|pairs_per_fact|nli_pairs|padding_overhead|max_abs_prob_diff[^.]*"
    r"|pytorch_vs_stored_min_cosine)(\.|$)"
)


class Unreadable(Exception):
    """An input that is not a readable benchmark JSON."""


def _item_keys(items: list[dict[str, Any]]) -> list[str]:
    for fields in ID_FIELDS:
        values = []
        for item in items:
            parts = [item.get(f) for f in fields]
            if not all(isinstance(p, str | int) and not isinstance(p, bool) for p in parts):
                break
            values.append("|".join(str(p) for p in parts))
        else:
            # "aegis-nli/imported (nli, pretrained weights, ...)" -> "aegis-nli/imported"
            short = [v.split(" (")[0] for v in values]
            for candidate in (short, values):
                if len(set(candidate)) == len(candidate):
                    return candidate
    # Thread/spinning records and the like: their scalar settings identify them.
    values = []
    for item in items:
        ident = [f"{k}={v}" for k, v in item.items() if k in ("threads", "allow_spinning")]
        values.append(",".join(ident))
    if all(values) and len(set(values)) == len(values):
        return values
    return [str(i) for i in range(len(items))]


def flatten(obj: Any, prefix: str = "") -> dict[str, float | bool]:
    """Numeric and boolean leaves of ``obj`` under dotted keys; metadata, settings and lists of
    plain numbers (raw samples) are left out."""
    out: dict[str, float | bool] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            key = str(key)
            if key in SKIP or key in BOOKKEEPING:
                continue
            out.update(flatten(value, f"{prefix}.{key}" if prefix else key))
    elif isinstance(obj, list):
        if obj and all(isinstance(x, dict) for x in obj):
            for ident, item in zip(_item_keys(obj), obj, strict=True):
                out.update(flatten(item, f"{prefix}[{ident}]"))
    elif isinstance(obj, bool):
        out[prefix] = obj
    elif isinstance(obj, int | float):
        out[prefix] = float(obj)
    return out


def classify(key: str) -> str:
    """``ratio`` (same-run), ``exact`` (deterministic) or ``abs`` (absolute)."""
    low = key.lower()
    if low.startswith("grpc."):  # its phases are time-bounded: even counts follow the speed
        return "ratio" if _RATIO.search(low) else "abs"
    if low.startswith("quality.") or _EXACT.search(low):
        return "exact"
    if _RATIO.search(low):
        return "ratio"
    return "abs"


def load_run(path: Path) -> dict[str, Any]:
    """A suite or script JSON (a directory stands for its ``suite.json``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "suite.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise Unreadable(f"{path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise Unreadable(f"{path}: not a JSON object")
    return doc


def flatten_run(doc: dict[str, Any]) -> dict[str, float | bool]:
    """Per part of a suite JSON (or the one part of a script's JSON), its figures' leaves."""
    if isinstance(doc.get("parts"), dict):
        out: dict[str, float | bool] = {}
        for part, rec in doc["parts"].items():
            if not isinstance(rec, dict):
                continue
            if isinstance(rec.get("result"), dict):
                out.update(flatten(rec["result"], part))
            if isinstance(rec.get("seconds"), int | float) and rec.get("status") == "ok":
                out[f"{part}.duration_s"] = float(rec["seconds"])
        return out
    name = str(doc.get("benchmark", "run"))
    return flatten(doc, PARTS.get(name, name))


@dataclass(frozen=True)
class Row:
    key: str
    old: float | bool
    new: float | bool
    kind: str

    @property
    def ratio(self) -> float | None:
        if isinstance(self.old, bool) or isinstance(self.new, bool):
            return None
        if math.isnan(self.old) or math.isnan(self.new):
            return None
        if self.old == 0:
            return 1.0 if self.new == 0 else math.inf
        return self.new / self.old

    def changed(self, threshold: float) -> bool:
        if isinstance(self.old, bool) or isinstance(self.new, bool):
            return self.old != self.new
        r = self.ratio
        if r is None:
            return math.isnan(self.old) != math.isnan(self.new)
        return abs(r - 1.0) > threshold


def headline_rows(old: dict[str, Any], new: dict[str, Any]) -> list[Row]:
    """The suite's summary figures found in both runs (none for a script's JSON)."""

    def index(doc: dict[str, Any]) -> dict[str, tuple[float, str]]:
        out = {}
        for h in doc.get("summary") or []:
            value = h.get("value") if isinstance(h, dict) else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[f"{h.get('part')}: {h.get('figure')}"] = (float(value), str(h.get("kind")))
        return out

    a, b = index(old), index(new)
    return [Row(k, a[k][0], b[k][0], b[k][1]) for k in b if k in a]


def compare(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[Row], list[str], list[str]]:
    """Rows for the keys of both runs (in the new run's order), and the keys only in one."""
    a, b = flatten_run(old), flatten_run(new)
    rows = [Row(k, a[k], b[k], classify(k)) for k in b if k in a]
    return rows, [k for k in a if k not in b], [k for k in b if k not in a]


def _num(value: float | bool) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if math.isnan(value):
        return "-"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.3g}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def _describe(label: str, path: Path, doc: dict[str, Any]) -> str:
    git = doc.get("git")
    sha = git.get("sha", "?") if isinstance(git, dict) else str(git or "?")
    dirty = "+dirty" if isinstance(git, dict) and git.get("dirty") else ""
    settings = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
    mode = settings.get("mode") or ("quick" if settings.get("quick") else "")
    machine = doc.get("machine") if isinstance(doc.get("machine"), dict) else {}
    cpu = doc.get("cpu_used_during_run")
    others = ""
    if isinstance(cpu, dict) and "other_processes_cores" in cpu:
        others = f"; other processes used {cpu['other_processes_cores']} cores"
    when = doc.get("started_at") or doc.get("time") or "?"
    return (
        f"{label}: {path}  git {str(sha)[:10]}{dirty}  {when}  {mode or '-'} mode  "
        f"{machine.get('cpu', '?')}{others}"
    )


def _machine_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The run's machine record: top level, or the first part's (a suite holds one per part)."""
    machine = doc.get("machine")
    if isinstance(machine, dict):
        return machine
    for value in doc.values():
        if isinstance(value, dict) and isinstance(value.get("machine"), dict):
            return dict(value["machine"])
    return {}


def cpu_mismatch(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """A warning when the two runs come from different CPUs (model, usable cores or ISA flags):
    then even a same-run ratio may move (AMX or VNNI changes which kernel wins), and absolute
    figures are not comparable at all. None when both match or either run does not say."""
    a, b = _machine_of(old), _machine_of(new)
    if not a or not b:
        return None
    differences = []
    if a.get("cpu") != b.get("cpu"):
        differences.append(f"CPU {a.get('cpu')!r} -> {b.get('cpu')!r}")
    if a.get("usable_cores") != b.get("usable_cores"):
        differences.append(f"usable cores {a.get('usable_cores')} -> {b.get('usable_cores')}")
    isa_a, isa_b = set(a.get("isa") or ()), set(b.get("isa") or ())
    if isa_a != isa_b:
        gone, added = sorted(isa_a - isa_b), sorted(isa_b - isa_a)
        differences.append(
            "ISA flags"
            + (f" lost {' '.join(gone)}" if gone else "")
            + (f" gained {' '.join(added)}" if added else "")
        )
    if not differences:
        return None
    return (
        "WARNING: the two runs come from different machines ("
        + "; ".join(differences)
        + "): absolute figures are not comparable, and same-run ratios may move with the "
        "kernels each CPU offers"
    )


def render(
    rows: Sequence[Row],
    only_old: Sequence[str],
    only_new: Sequence[str],
    threshold: float,
    changed_only: bool = False,
) -> str:
    lines = []
    shown = [r for r in rows if not changed_only or r.changed(threshold)]
    lines.append(f"{'old':>10}  {'new':>10}  {'new/old':>8}    {'kind':<5}  figure")
    lines.append("-" * 100)
    for r in shown:
        ratio = r.ratio
        if ratio is None:
            cell = "-" if not r.changed(threshold) else "changed"
        elif math.isinf(ratio):
            cell = "new"
        else:
            cell = f"{ratio:.3f}"
        flag = "*" if r.changed(threshold) else " "
        lines.append(
            f"{_num(r.old):>10}  {_num(r.new):>10}  {cell:>8} {flag}  {r.kind:<5}  {r.key}"
        )
    flipped = [r for r in rows if isinstance(r.new, bool) and r.changed(threshold)]
    if flipped:
        lines.append("")
        lines.append("verdicts that changed:")
        lines += [f"  {r.key}: {_num(r.old)} -> {_num(r.new)}" for r in flipped]
    if only_old:
        lines.append("")
        lines.append(f"only in the old run ({len(only_old)}): " + ", ".join(only_old[:20]))
    if only_new:
        lines.append("")
        lines.append(f"only in the new run ({len(only_new)}): " + ", ".join(only_new[:20]))
    counts = {
        kind: sum(1 for r in rows if r.kind == kind and r.changed(threshold))
        for kind in ("ratio", "abs", "exact")
    }
    lines.append("")
    lines.append(
        f"{len(rows)} figures in both runs; beyond {threshold:.0%}: "
        f"{counts['ratio']} same-run ratios, {counts['abs']} absolute, {counts['exact']} exact"
    )
    return "\n".join(lines)


LEGEND = (
    "new/old per figure; * = changed by more than the threshold. kind: ratio = same-run ratio "
    "(trustworthy on a noisy machine), abs = absolute (depends on the machine and its load), "
    "exact = deterministic (a change means behaviour changed)"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="memgate bench compare",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("old", type=Path, help="the reference run (suite.json or a script JSON)")
    parser.add_argument("new", type=Path, help="the run to judge")
    parser.add_argument(
        "--threshold", type=float, default=0.05, help="flag changes beyond this (default 0.05)"
    )
    parser.add_argument("--changed", action="store_true", help="print only flagged figures")
    args = parser.parse_args(argv)
    try:
        old, new = load_run(args.old), load_run(args.new)
    except Unreadable as exc:
        print(f"memgate bench compare: cannot read {exc}", file=sys.stderr)
        return 2
    rows, only_old, only_new = compare(old, new)
    print(_describe("old", args.old, old))
    print(_describe("new", args.new, new))
    warning = cpu_mismatch(old, new)
    if warning:
        print(warning)
    print(LEGEND)
    heads = headline_rows(old, new)
    if heads:
        print("\nHeadline figures (the reports' summary tables):\n")
        print(render(heads, [], [], args.threshold, False))
        print("\nEvery figure:")
    print()
    print(render(rows, only_old, only_new, args.threshold, args.changed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
