"""The suite's Markdown report: a summary table of headline figures, then a section per part.

``render(suite, out_dir)`` writes ``report.md`` (and the plots the scripts do not draw:
quality by policy and category, backfill rates) from a suite JSON; the scripts' own PNGs are
linked where they are. Every section is read defensively: a part whose JSON lacks a figure says
so in its section instead of breaking the report.

    python benchmarks/report.py benchmarks/results/suite-<utc>/suite.json   # render it again
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt, pyplot  # noqa: E402

__all__ = ["KINDS", "Headline", "headlines", "main", "render", "short_model"]

KINDS = {
    "ratio": "same-run ratio",
    "abs": "absolute",
    "exact": "exact (deterministic)",
}
PART_TITLES = {
    "runtime": "Runtime: embedder and NLI throughput by batch size (CPU)",
    "gate": "Gate: batch-triage facts/s against store size",
    "grpc": "gRPC service under load",
    "backfill": "Backfill",
    "quality": "Quality on the labelled dev set",
    "gpu": "GPU: fp16 and fp32 on the CUDA provider, IO binding",
}


@dataclass(frozen=True)
class Headline:
    """One figure of the summary table."""

    part: str
    figure: str
    value: float | None
    unit: str = ""
    target: str = ""
    met: bool | None = None
    kind: str = "abs"
    note: str = ""

    def text(self) -> str:
        """The value with its unit, and the note in brackets (the note alone if no value)."""
        if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
            return self.note or "-"
        if self.unit == "x":
            text = f"{self.value:.2f}x"
        elif self.unit == "ratio":
            text = f"{self.value:.3f}"
        elif self.unit == "count":
            text = f"{self.value:,.0f}"
        else:
            text = f"{fmt(float(self.value))}{' ' + self.unit if self.unit else ''}"
        return f"{text} ({self.note})" if self.note else text

    def verdict(self) -> str:
        return "" if self.met is None else "met" if self.met else "**missed**"

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text()}


def short_model(describe: str) -> str:
    """``aegis-nli/imported (nli, pretrained weights, ...)`` -> ``aegis-nli/imported``."""
    return str(describe).split(" (")[0]


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# -- headline figures per part --------------------------------------------------------------
def _runtime(result: dict[str, Any], part: str = "runtime") -> list[Headline]:
    out = []
    for label, rec in (result.get("targets") or {}).items():
        ratio = " vs " in label
        unit = "x" if ratio else "pairs/s"
        span = ""
        if rec.get("round_min") is not None:
            span = f", rounds {rec['round_min']:.2f}-{rec['round_max']:.2f}"
        out.append(
            Headline(
                part,
                f"{label} (batch {rec.get('batch', '?')}{span})",
                _num(rec.get("value")),
                unit,
                f">= {rec.get('target'):g}{'x' if ratio else ''}",
                bool(rec.get("met")),
                "ratio" if ratio else "abs",
            )
        )
    return out


def _batch_key(by_size: dict[str, Any]) -> str | None:
    sizes = sorted(by_size, key=lambda s: int(s))
    return "32" if "32" in by_size else (sizes[-1] if sizes else None)


def _gpu(result: dict[str, Any]) -> list[Headline]:
    out = []
    torch_dev = (result.get("settings") or {}).get("torch_device", "?")
    for section, what, unit in (("nli", "NLI", "pairs/s"), ("embedder", "embedder", "emb/s")):
        points = result.get(section) or {}
        ratios = (result.get("ratios_vs_pytorch") or {}).get(section) or {}
        for engine in [e for e in points if "fp16" in e]:
            b = _batch_key(points[engine])
            if b is None:
                continue
            rate = _num(points[engine][b].get("items_per_s"))
            out.append(
                Headline(part="gpu", figure=f"{what} {engine} (batch {b})", value=rate, unit=unit)
            )
            ratio = _num((ratios.get(engine) or {}).get(b))
            out.append(
                Headline(
                    "gpu",
                    f"{what} {engine} vs PyTorch on {torch_dev} (batch {b})",
                    ratio,
                    "x",
                    kind="ratio",
                )
            )
    return out


def _gate(result: dict[str, Any]) -> list[Headline]:
    scenarios = result.get("scenarios") or []
    out = []
    ratios = [(s["ratio_deberta"], s["label"]) for s in scenarios if _num(s.get("ratio_deberta"))]
    target = _num((result.get("target") or {}).get("ratio")) or 4.0
    if ratios:
        low, label = min(ratios)
        out.append(
            Headline(
                "gate",
                "memgate deberta / PyTorch facts/s, lowest over the scenarios",
                low,
                "x",
                f">= {target:g}x at every N",
                low >= target,
                "ratio",
                note=label,
            )
        )
    single = [s for s in scenarios if s.get("namespaces") == 1]
    if single:
        big = max(single, key=lambda s: s.get("memories", 0))
        out.append(
            Headline(
                "gate",
                f"memgate aegis facts/s, {big['label']} (real NLI model)",
                _num(big.get("memgate_aegis")),
                "facts/s",
            )
        )
    return out


def _grpc(result: dict[str, Any]) -> list[Headline]:
    f = result.get("figures") or {}
    ratio = _num(f.get("ratio_served_to_in_process"))
    p99 = _num(f.get("overload_p99_over_unloaded_p99"))
    over = f.get("overload_offered_x", 2)
    clients = (result.get("settings") or {}).get("clients", 32)
    return [
        Headline(
            "grpc",
            f"served / in-process facts/s ({clients} single-fact clients)",
            ratio,
            "ratio",
            ">= 0.8",
            None if ratio is None else ratio >= 0.8,
            "ratio",
        ),
        Headline(
            "grpc",
            f"p99 at {over:g}x capacity / unloaded p99",
            p99,
            "x",
            "<= 2x",
            None if p99 is None else p99 <= 2.0,
            "ratio",
        ),
        Headline(
            "grpc",
            f"served facts/s ({clients} clients)",
            _num(f.get("served_facts_per_s_32_clients")),
            "facts/s",
        ),
    ]


def _backfill(result: dict[str, Any]) -> list[Headline]:
    f = result.get("figures") or {}
    out = []
    for name, label, target in (("in-process", "in process", 0.9), ("grpc", "over gRPC", 0.8)):
        rec = f.get(name)
        if isinstance(rec, dict):
            ratio = _num(rec.get("ratio"))
            out.append(
                Headline(
                    "backfill",
                    f"backfill {label} / plain batch triage",
                    ratio,
                    "ratio",
                    f">= {target:g}",
                    None if ratio is None else ratio >= target,
                    "ratio",
                )
            )
        elif rec is not None:
            out.append(
                Headline(
                    "backfill",
                    f"backfill {label}",
                    None,
                    target=f">= {target:g}",
                    note=f"skipped: {rec}",
                )
            )
    out.append(
        Headline(
            "backfill",
            "plain batch triage, apply=True (baseline)",
            _num(result.get("baseline_facts_per_s")),
            "facts/s",
        )
    )
    return out


def _quality(result: dict[str, Any]) -> list[Headline]:
    out = []
    for r in result.get("results") or []:
        if r.get("config") not in ("strict", "review"):
            continue
        m = r.get("metrics") or {}
        who = f"{r['config']}, {short_model(r.get('nli', '?'))}"
        wo = _num(m.get("wrongful_overwrites"))
        traps = (m.get("wrongful_overwrite_breakdown") or {}).get("on_trap_cases")
        out.append(
            Headline(
                "quality",
                f"{who}: wrongful overwrites",
                wo,
                "count",
                "0",
                None if wo is None else wo == 0,
                "exact",
                note=f"{traps} on traps",
            )
        )
        out.append(
            Headline(
                "quality",
                f"{who}: update recall",
                _num(m.get("update_recall")),
                "ratio",
                kind="exact",
            )
        )
        out.append(
            Headline("quality", f"{who}: accuracy", _num(m.get("accuracy")), "ratio", kind="exact")
        )
    return out


HEADLINES: dict[str, Callable[[dict[str, Any]], list[Headline]]] = {
    "runtime": _runtime,
    "gate": _gate,
    "grpc": _grpc,
    "backfill": _backfill,
    "quality": _quality,
    "gpu": _gpu,
}


def headlines(part: str, result: dict[str, Any]) -> list[Headline]:
    """The summary figures of one part's JSON (a line saying why, if they cannot be read)."""
    fn = HEADLINES.get(part)
    if fn is None:
        return []
    try:
        return fn(result)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return [Headline(part, "headline figures", None, note=f"unreadable: {exc!r}")]


# -- Markdown helpers -----------------------------------------------------------------------
def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        text = v if isinstance(v, str) else fmt(v, 2) if isinstance(v, float) else fmt(v)
        return str(text).replace("|", "\\|").replace("\n", " ")

    def number(v: Any) -> bool:
        return not isinstance(v, str) or v[:1].isdigit()

    numeric = [
        any(number(r[i]) for r in rows) and all(number(r[i]) or r[i] in ("-", "") for r in rows)
        for i in range(len(headers))
    ]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _f(value: Any, digits: int = 3) -> str:
    v = _num(value)
    return "-" if v is None or math.isnan(v) else f"{v:.{digits}f}"


def _rate(value: Any) -> str:
    v = _num(value)
    return "-" if v is None else fmt(v)


# -- sections -------------------------------------------------------------------------------
def _sweep_table(result: dict[str, Any], section: str) -> str:
    points = result.get(section) or {}
    ratios = (result.get("ratios_vs_pytorch") or {}).get(section) or {}
    sizes = sorted({b for by in points.values() for b in by}, key=int)
    rows = []
    for engine, by_size in points.items():
        row = [engine]
        for b in sizes:
            rate = _num((by_size.get(b) or {}).get("items_per_s"))
            ratio = _num((ratios.get(engine) or {}).get(b))
            if rate is None:
                row.append("skipped")
            elif engine == "pytorch" or ratio is None:
                row.append(fmt(rate))
            else:
                row.append(f"{fmt(rate)} ({ratio:.2f}x)")
        rows.append(row)
    return md_table(["engine", *(f"batch {b}" for b in sizes)], rows)


def _ceiling_lines(result: dict[str, Any]) -> list[str]:
    """Each model's rate as a fraction of what the measured GEMM throughput allows."""
    ceiling, fractions = result.get("gemm_ceiling"), result.get("ceiling_fractions")
    if not isinstance(ceiling, dict) or not isinstance(fractions, dict):
        return []
    gops = ceiling.get("gops") or {}
    out = [
        "",
        f"GEMM ceiling on {ceiling.get('shape_mkn')} ({ceiling.get('int8_kernel_isa')}, AMX "
        f"{'yes' if ceiling.get('amx') else 'no'}): fp32 {_rate(gops.get('fp32'))}, int8 "
        f"{_rate(gops.get('int8'))}, blockwise {_rate(gops.get('blockwise'))}, rowwise (shipped) "
        f"{_rate(gops.get('rowwise'))} GOPS. At batch "
        f"{fractions.get('batch')}, each engine as a fraction of the ceiling of its kernel:",
        "",
    ]
    rows = []
    for what, unit in (("nli", "pairs/s"), ("embedder", "embeddings/s")):
        for name, f in (fractions.get(what) or {}).items():
            if isinstance(f, dict) and f.get("fraction") is not None:
                rows.append(
                    [
                        f"{what}: {name}",
                        f"{_rate(f.get('items_per_s'))} {unit}",
                        f"{_rate(f.get('ceiling_items_per_s'))} ({f.get('kernel')})",
                        f"{f['fraction']:.1%}",
                    ]
                )
    return out + [md_table(["engine", "rate", "ceiling", "fraction"], rows)] if rows else []


def _runtime_section(result: dict[str, Any]) -> list[str]:
    out = [
        "Embeddings/s (x = ratio to PyTorch at the same batch size, same run):",
        "",
        _sweep_table(result, "embedder"),
        "",
        "NLI pairs/s:",
        "",
        _sweep_table(result, "nli"),
    ]
    out += _ceiling_lines(result)
    drift_key = next((k for k in result if k.startswith("drift_minilm_")), None)
    if drift_key:
        d = result[drift_key]
        top = d.get("jaccard_top20_above_floor") or {}
        out += [
            "",
            f"Drift ({drift_key.removeprefix('drift_minilm_').replace('_', ' ')}): cosine mean "
            f"{_f(d.get('cosine_mean'), 4)}, min {_f(d.get('cosine_min'), 4)}; the gate's "
            f"candidates (top-20 above the floor) overlap {_f(top.get('mean'))} on average "
            f"(Jaccard), identical for {_f(top.get('identical_share'), 2)} of queries; top-1 "
            f"agreement {_f(d.get('top1_agreement'), 2)}.",
        ]
    notes = result.get("notes") or []
    out += [f"\nnote: {str(n).removeprefix('note: ')}" for n in notes]
    return out


def _gate_section(result: dict[str, Any]) -> list[str]:
    rows = []
    for s in result.get("scenarios") or []:
        ppf = s.get("pairs_per_fact") or {}
        rows.append(
            [
                s.get("label", "?"),
                _rate(s.get("memgate_deberta")),
                f"{_f(s.get('ratio_deberta'), 2)}x",
                _rate(s.get("memgate_aegis")),
                f"{_f(s.get('ratio_aegis'), 2)}x",
                _rate(s.get("memgate_cold_aegis")),
                _rate(s.get("pytorch")),
                _f(s.get("seed")),
                f"{_f(ppf.get('memgate_deberta'), 1)} / {_f(ppf.get('pytorch'), 1)}",
            ]
        )
    settings = result.get("settings") or {}
    return [
        f"Facts/s, M = {settings.get('facts', '?')} incoming facts in batches of "
        f"{settings.get('batch', '?')}, dry run, strict policy; memgate and PyTorch are the best "
        "warm pass; x = ratio to PyTorch in the same run; seed = the published code, "
        "extrapolated from N = 200.",
        "",
        md_table(
            [
                "scenario",
                "memgate deberta",
                "x PyTorch",
                "memgate aegis",
                "x PyTorch",
                "cold aegis",
                "PyTorch",
                "seed (extrap.)",
                "NLI pairs/fact mg / pt",
            ],
            rows,
        ),
    ]


def _grpc_section(result: dict[str, Any]) -> list[str]:
    base = result.get("baseline") or {}
    rows = []
    for p in result.get("phases") or []:
        offered = p.get("offered")
        rows.append(
            [
                p.get("name", "?"),
                "closed loop" if offered is None else _rate(offered),
                _rate(p.get("throughput")),
                _rate(p.get("p50_ms")),
                _rate(p.get("p95_ms")),
                _rate(p.get("p99_ms")),
                f"{_num(p.get('shed_share')) or 0.0:.1%}",
                _f(p.get("mean_batch_facts"), 1),
            ]
        )
    return [
        f"In-process batch triage (the baseline): {_rate(base.get('facts_per_s'))} facts/s "
        f"(before the load {_rate(base.get('facts_per_s_before'))}, after "
        f"{_rate(base.get('facts_per_s_after'))}: their gap shows how busy the machine was).",
        "",
        md_table(
            [
                "phase",
                "offered facts/s",
                "served facts/s",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "shed",
                "mean batch",
            ],
            rows,
        ),
    ]


def _backfill_section(result: dict[str, Any]) -> list[str]:
    f = result.get("figures") or {}
    scale = result.get("scale") or {}
    rows = []
    for name, label in (
        ("baseline", "plain batch triage"),
        ("baseline-after", "plain batch triage, again"),
        ("in-process", "backfill, in process"),
        ("grpc", "backfill, gRPC stream"),
        ("plumbing", "backfill plumbing alone (no model)"),
    ):
        rec = f.get(name)
        if isinstance(rec, str):
            rows.append([label, "-", "-", f"skipped: {rec}"])
        elif isinstance(rec, dict):
            target = rec.get("target")
            rows.append(
                [
                    label,
                    _rate(rec.get("facts_per_s")),
                    _f(rec.get("ratio")),
                    f">= {target:g}" if isinstance(target, int | float) else "",
                ]
            )
    return [
        f"{fmt(scale.get('facts'))} facts over {fmt(scale.get('namespaces'))} namespaces, "
        f"batches of {fmt(scale.get('batch'))}; ratio = to the mean of both baselines "
        f"({_rate(result.get('baseline_facts_per_s'))} facts/s; they differ by "
        f"{(_num(result.get('baseline_drift')) or 0.0):.0%}).",
        "",
        md_table(["run", "facts/s", "ratio", "target"], rows),
    ]


def _quality_section(result: dict[str, Any]) -> list[str]:
    results = result.get("results") or []
    rows = []
    for r in results:
        m = r.get("metrics") or {}
        traps = (m.get("wrongful_overwrite_breakdown") or {}).get("on_trap_cases", "-")
        rows.append(
            [
                short_model(r.get("nli", "?")),
                r.get("config", "?"),
                f"{m.get('wrongful_overwrites', '-')} ({traps})",
                _f(m.get("update_recall")),
                _f(m.get("update_precision")),
                _f(m.get("duplicate_precision")),
                str(m.get("lost_information", "-")),
                _f(m.get("review_rate")),
                _f(m.get("accuracy")),
            ]
        )
    categories = sorted(
        {c for r in results for c in ((r.get("metrics") or {}).get("accuracy_by_category") or {})}
    )
    cat_rows = []
    for c in categories:
        row: list[Any] = [c]
        for r in results:
            acc = ((r.get("metrics") or {}).get("accuracy_by_category") or {}).get(c)
            rec = (r.get("replace_recall_by_category") or {}).get(c)
            row.append(_f(acc) + (f" (recall {_f(rec)})" if rec is not None else ""))
        cat_rows.append(row)
    cases = result.get("cases", "?")
    n = (results[0].get("metrics") or {}).get("cases", "?") if results else "?"
    return [
        f"{n} cases from `{Path(str(cases)).name}`, scored with the rules of "
        "`../shared/eval/README.md` (`score.py`). Overwrites: wrongful overwrites (on `[trap]` "
        "cases); lost = skips of a new fact or an update.",
        "",
        md_table(
            [
                "NLI model",
                "policy",
                "wrongful overwrites (traps)",
                "update recall",
                "update precision",
                "duplicate precision",
                "lost",
                "review rate",
                "accuracy",
            ],
            rows,
        ),
        "",
        "Accuracy by category (replace recall in brackets where the category has replaces):",
        "",
        md_table(
            [
                "category",
                *(f"{r.get('config')}, {short_model(r.get('nli', '?'))}" for r in results),
            ],
            cat_rows,
        ),
    ]


SECTIONS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "runtime": _runtime_section,
    "gpu": _runtime_section,
    "gate": _gate_section,
    "grpc": _grpc_section,
    "backfill": _backfill_section,
    "quality": _quality_section,
}


# -- plots drawn here -----------------------------------------------------------------------
def plot_quality(result: dict[str, Any], path: Path) -> bool:
    """Headline metrics per policy, and accuracy per category per policy."""
    results = result.get("results") or []
    plt = pyplot() if results else None
    if plt is None:
        return False
    metrics = [
        ("update_recall", "update\nrecall"),
        ("update_precision", "update\nprecision"),
        ("duplicate_precision", "duplicate\nprecision"),
        ("add_recall", "add\nrecall"),
        ("review_rate", "review\nrate"),
        ("accuracy", "accuracy"),
    ]
    categories = sorted(
        {c for r in results for c in ((r.get("metrics") or {}).get("accuracy_by_category") or {})}
    )
    fig, axes = plt.subplots(
        1, 2, figsize=(14, 4.8), layout="constrained", gridspec_kw={"width_ratios": [2, 3]}
    )
    width = 0.8 / max(1, len(results))

    def value(v: Any) -> float:
        x = _num(v)
        return 0.0 if x is None or math.isnan(x) else x

    for i, r in enumerate(results):
        m = r.get("metrics") or {}
        label = (
            f"{r.get('config')}, {short_model(r.get('nli', '?'))}: "
            f"{m.get('wrongful_overwrites', '?')} wrongful overwrites"
        )
        xs = [j + (i - (len(results) - 1) / 2) * width for j in range(len(metrics))]
        axes[0].bar(xs, [value(m.get(k)) for k, _ in metrics], width, label=label)
        by_cat = m.get("accuracy_by_category") or {}
        xs = [j + (i - (len(results) - 1) / 2) * width for j in range(len(categories))]
        axes[1].bar(xs, [value(by_cat.get(c)) for c in categories], width, label=label)
    axes[0].set_xticks(range(len(metrics)), [t for _, t in metrics], fontsize=8)
    axes[0].set_ylim(0, 1.05)
    axes[0].set_title("metrics per policy")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(labels)), fontsize=8)
    axes[1].set_xticks(range(len(categories)), categories, rotation=30, ha="right", fontsize=8)
    axes[1].set_ylim(0, 1.05)
    axes[1].set_title("accuracy per category")
    for ax in axes:
        ax.grid(True, axis="y", alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_backfill(result: dict[str, Any], path: Path) -> bool:
    f = result.get("figures") or {}
    runs = [
        (label, _num(f[name].get("facts_per_s")))
        for name, label in (
            ("baseline", "baseline"),
            ("in-process", "backfill\nin process"),
            ("grpc", "backfill\ngRPC"),
            ("baseline-after", "baseline\nagain"),
        )
        if isinstance(f.get(name), dict)
    ]
    runs = [(label, v) for label, v in runs if v is not None]
    plt = pyplot() if runs else None
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    ax.bar([r[0] for r in runs], [r[1] for r in runs], color="#2980b9")
    base = _num(result.get("baseline_facts_per_s"))
    if base:
        ax.axhline(base, color="k", ls="--", lw=1, label="mean baseline")
        ax.legend(fontsize=8)
    ax.set_ylabel("facts/s")
    ax.set_title("backfill against plain batch triage")
    ax.grid(True, axis="y", alpha=0.3)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


DRAWN: dict[str, Callable[[dict[str, Any], Path], bool]] = {
    "quality": plot_quality,
    "backfill": plot_backfill,
}


# -- the report -----------------------------------------------------------------------------
def _header(suite: dict[str, Any]) -> list[str]:
    git = suite.get("git") or {}
    m = suite.get("machine") or {}
    settings = suite.get("settings") or {}
    cpu = suite.get("cpu_used_during_run") or {}
    versions = m.get("versions") or {}
    soft = ", ".join(f"{k} {v}" for k, v in versions.items() if v != "absent")
    dirty = " + uncommitted changes" if git.get("dirty") else ""
    load0 = m.get("load_average_at_start") or ["?"]
    load1 = suite.get("load_average_at_end") or ["?"]
    rows = [
        ["git", f"`{str(git.get('sha', 'unknown'))[:12]}`{dirty}"],
        ["date (UTC)", f"{suite.get('started_at', '?')} to {suite.get('finished_at', '?')}"],
        [
            "machine",
            f"{m.get('cpu', '?')}; {m.get('usable_cores', '?')} usable cores "
            f"({m.get('logical_cores', '?')} logical, {m.get('physical_cores', '?')} physical); "
            f"{m.get('memory_gib', '?')} GiB",
        ],
        ["ISA", " ".join(m.get("isa") or []) or "-"],
        ["software", f"Python {m.get('python', '?')}, {soft}"],
        ["platform", str(m.get("platform", "?"))],
        [
            "load",
            f"load average {load0[0]} at start, {load1[0]} at end; other processes used "
            f"{cpu.get('other_processes_cores', '?')} cores on average",
        ],
        ["command", f"`{settings.get('command', '?')}`"],
    ]
    out = [
        f"# memgate benchmark suite: {settings.get('mode', '?')} mode",
        "",
        md_table(["", ""], rows),
    ]
    others = _num(cpu.get("other_processes_cores"))
    if others is not None and others >= 0.15:
        out += [
            "",
            f"**The machine was shared** ({others:.2f} cores used by other processes on "
            "average): absolute figures are low and noisy; same-run ratios less so.",
        ]
    if settings.get("mode") == "smoke":
        out += ["", "**Smoke mode: tiny sizes to check the plumbing; the figures mean nothing.**"]
    return out


def render(suite: dict[str, Any], out_dir: Path) -> Path:
    """Write ``report.md`` (and the plots drawn here) into ``out_dir``; return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts: dict[str, dict[str, Any]] = suite.get("parts") or {}
    lines = _header(suite)

    summary_rows = []
    for name, rec in parts.items():
        status = rec.get("status")
        if status != "ok":
            reason = str(rec.get("reason", "")).splitlines()[0] if rec.get("reason") else ""
            summary_rows.append([name, f"*{status}*", reason, "", "", ""])
            continue
        for h in headlines(name, rec.get("result") or {}):
            summary_rows.append(
                [name, h.figure, h.text(), h.target, h.verdict(), KINDS.get(h.kind, h.kind)]
            )
    lines += [
        "",
        "## Summary",
        "",
        md_table(["part", "figure", "value", "target", "verdict", "kind"], summary_rows),
        "",
        "*kind*: a **same-run ratio** compares two systems measured minutes apart in one run on "
        "this machine (the figure to compare between machines and commits); an **absolute** "
        "figure depends on the machine and on what else ran on it; **exact** figures are "
        "deterministic for given code, models and data. See benchmarks/README.md.",
        "",
        "## Parts",
        "",
    ]
    part_rows = []
    for name, rec in parts.items():
        secs = _num(rec.get("seconds"))
        part_rows.append(
            [
                name,
                str(rec.get("status", "?")),
                "-" if secs is None else f"{secs / 60:.1f} min",
                f"[{rec['json']}]({rec['json']})" if rec.get("json") else "-",
                f"[{rec['log']}]({rec['log']})" if rec.get("log") else "-",
            ]
        )
    lines.append(md_table(["part", "status", "duration", "JSON", "log"], part_rows))

    for name, rec in parts.items():
        lines += ["", f"## {PART_TITLES.get(name, name)}", ""]
        for note in rec.get("notes") or []:
            lines += [f"* {note}"]
        if rec.get("notes"):
            lines.append("")
        status = rec.get("status")
        if status != "ok":
            lines.append(f"**{status}**: {rec.get('reason', '')}".rstrip())
            tail = rec.get("log_tail")
            if tail:
                lines += ["", "```", *tail, "```"]
            continue
        result = rec.get("result") or {}
        section = SECTIONS.get(name)
        if section is not None:
            try:
                lines += section(result)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                lines.append(f"(this part's JSON could not be read into tables: {exc!r})")
        plots = list(rec.get("plots") or [])
        drawer = DRAWN.get(name)
        if drawer is not None:
            png = out_dir / f"{name}.png"
            try:
                if drawer(result, png):
                    plots.append(png.name)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                lines.append(f"\n(plot not drawn: {exc!r})")
        lines.append("")
        if plots:
            lines += [f"![{name}: {Path(p).stem}]({p})" for p in plots]
        else:
            lines.append("(no plot: matplotlib is not installed, or the script drew none)")

    manifests = suite.get("manifests") or {}
    if manifests:
        rows = []
        for key, rec in manifests.items():
            if not isinstance(rec, dict):
                rows.append([key, "-", "-", "-"])
                continue
            rows.append(
                [
                    key,
                    str(rec.get("weights", "-")),
                    f"`{str(rec.get('model_sha256') or '-')[:16]}`",
                    f"{rec.get('source', '-')}@{rec.get('revision', '-')}",
                ]
            )
        lines += [
            "",
            "## Model artefacts",
            "",
            md_table(["artefact", "weights", "model sha256", "source"], rows),
        ]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render a suite JSON's report again.")
    parser.add_argument("suite", type=Path, help="suite.json (or its directory)")
    args = parser.parse_args(argv)
    path = args.suite / "suite.json" if args.suite.is_dir() else args.suite
    try:
        suite = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"cannot read {path}: {exc}", file=sys.stderr)
        return 2
    print(render(suite, path.parent))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
