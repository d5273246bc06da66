"""The NLI sub-batch size that fits this machine, measured once and kept next to the manifest.

A 32-pair NLI call is cut into forward passes of at most ``max_batch`` pairs. Which size is
fastest depends on the CPU (its caches, VNNI/AMX, the core count) and the graph: on a 2-core
Zen 5 the int8 DeBERTa ran 202 pairs/s at 8 and 132 at 32, because the graph's non-GEMM
operators (Transpose, GatherElements, Tile, Expand) grow faster than linearly with the batch.
So the size is measured, not fixed:

* :func:`measure` times a ``pairs``-pair call at each candidate size in interleaved rounds
  (the best round counts: other processes only ever slow a round down);
* :func:`tune_nli` applies, in order: an explicit size (``--nli-sub-batch``), the size recorded
  in ``sub_batch.json`` next to the artefact's manifest when it was measured on this machine
  (same CPU, core count, threads, runtime version and artefact hash), else a fresh measurement,
  which it records there (best effort: a read-only cache just measures at every start).

Row invariance makes this safe: a batch-invariant graph gives every pair the same result at any
sub-batch size (``tests/model/test_invariance.py``); a graph that is not runs one pair per
forward pass and has nothing to tune.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.errors import InvalidInput
from engine.fsutil import write_atomic

__all__ = ["CANDIDATES", "SUB_BATCH_FILE", "choose", "machine", "measure", "tune_nli"]

log = logging.getLogger("memgate.runtime")

SUB_BATCH_FILE = "sub_batch.json"
CANDIDATES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
"""Sub-batch sizes tried (a 32-pair call covers each)."""
CALL_PAIRS = 32
"""Pairs in the measured call: the size of a typical engine batch's NLI call."""
CLOSE = 0.03
"""Sizes within 3% of the fastest are a tie; the largest of them wins (fewer passes)."""

_SAMPLE = [
    ("The user moved to Berlin in 2021 and works at a bakery.", "The user lives in Berlin."),
    ("Alice prefers tea over coffee in the morning.", "Alice likes coffee best."),
    ("The quarterly report lists twelve open items for the team.", "The report is finished."),
    ("My plan is the Pro tier, billed every month.", "The plan is Enterprise, billed yearly."),
    ("Bob's birthday is on the third of May.", "Bob was born in May."),
    ("The meeting was moved from Tuesday to Thursday afternoon.", "The meeting is on Tuesday."),
    ("We deploy the service from the main branch after review.", "Deploys skip code review."),
    ("The cat sleeps on the sofa most afternoons.", "The dog sleeps on the sofa."),
]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(model: Any) -> dict[str, Any]:
    """What a measurement depends on: the CPU, its cores, the session's threads, the runtime
    version and the artefact (its model file's hash)."""
    try:
        ort = metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:
        ort = "?"
    session = getattr(getattr(model, "model", None), "settings", None)
    return {
        "cpu": _cpu_name(),
        "cores": os.cpu_count() or 0,
        "threads": int(getattr(session, "intra_op_threads", 0) or 0),
        "onnxruntime": ort,
        "model_sha256": str(
            model.manifest.files.get(model.manifest.model_file, {}).get("sha256", "")
        ),
    }


def measure(
    model: Any,
    sizes: Sequence[int] = CANDIDATES,
    *,
    pairs: int = CALL_PAIRS,
    rounds: int = 4,
) -> dict[int, float]:
    """Pairs/s of a ``pairs``-pair call at each sub-batch size (best of ``rounds``
    interleaved rounds). Leaves the model at its size before the call."""
    items = [_SAMPLE[i % len(_SAMPLE)] for i in range(pairs)]
    before = model.max_batch
    best: dict[int, float] = {}
    try:
        model.score(items[:2])  # lazy initialisation is not a size's cost
        for _ in range(rounds):
            for size in sizes:
                model.max_batch = size
                t0 = time.perf_counter()
                model.score(items)
                rate = pairs / max(time.perf_counter() - t0, 1e-9)
                best[size] = max(best.get(size, 0.0), rate)
    finally:
        model.max_batch = before
    return best


def choose(rates: dict[int, float]) -> int:
    """The fastest size; among sizes within ``CLOSE`` of it, the largest."""
    if not rates:
        raise InvalidInput("no sub-batch size was measured")
    top = max(rates.values())
    return max(size for size, rate in rates.items() if rate >= top * (1 - CLOSE))


def _recorded(path: Path, key: dict[str, Any]) -> int | None:
    try:
        record = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    size = record.get("sub_batch") if isinstance(record, dict) else None
    if record.get("machine") != key or not isinstance(size, int) or not 1 <= size <= 4096:
        return None
    return size


def tune_nli(
    model: Any,
    override: int | None = None,
    *,
    record: bool = True,
    timer: Callable[[Any], dict[int, float]] | None = None,
) -> int:
    """Set the NLI runtime's sub-batch size (see the module docstring) and return it.
    ``timer(model)`` measures pairs/s per size (default :func:`measure`; tests pass one)."""
    if override is not None:
        if not 1 <= override <= 4096:
            raise InvalidInput(f"the NLI sub-batch must be in [1, 4096], got {override}")
        model.max_batch = 1 if model.row_invariant else override
        return int(model.max_batch)
    if model.row_invariant:
        return int(model.max_batch)  # one pair per forward pass: nothing to tune
    path = Path(model.manifest.directory) / SUB_BATCH_FILE
    key = machine(model)
    size = _recorded(path, key)
    if size is not None:
        model.max_batch = size
        return size
    t0 = time.perf_counter()
    rates = (timer or measure)(model)
    size = choose(rates)
    model.max_batch = size
    log.info(
        "NLI sub-batch %d measured in %.1f s (%s pairs/s)",
        size,
        time.perf_counter() - t0,
        ", ".join(f"{k}: {v:.0f}" for k, v in sorted(rates.items())),
    )
    if record:
        body = {
            "sub_batch": size,
            "call_pairs": CALL_PAIRS,
            "pairs_per_s": {str(k): round(v, 1) for k, v in sorted(rates.items())},
            "machine": key,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            write_atomic(path, json.dumps(body, indent=2) + "\n", mode=0o644)
        except OSError as exc:  # a read-only cache measures again at the next start
            log.warning("could not record the NLI sub-batch in %s: %s", path, exc)
    return size
